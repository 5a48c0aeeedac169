"""round_allocations.reason: why a round left a job waiting

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Rows decided before this revision get "" (no reason recorded); reports then show the
generic "Resources" for a waiting job, as they did.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("round_allocations") as batch:
        batch.add_column(sa.Column("reason", sa.Text(), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("round_allocations") as batch:
        batch.drop_column("reason")
