"""jobs.parallelism: the job's declared parallelism and allocation unit

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Rows of jobs registered before this revision get plain DDP in units of one GPU, what the
policy assumed for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DDP_JSON = '{"kind": "ddp", "stages": 1, "unit": 1}'


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "parallelism",
                sa.JSON(),
                server_default=sa.text(f"'{DDP_JSON}'"),
                nullable=False,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("parallelism")
