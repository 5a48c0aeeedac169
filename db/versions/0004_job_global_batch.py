"""jobs.global_batch: the job's declared global batch (samples an optimizer step)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Rows of jobs registered before this revision get 0: a free batch (the per-GPU batch range
applies), what the policy assumed for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("global_batch", sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("global_batch")
