"""round_allocations.predicted_util, predicted_mem_bytes: eq 8's prediction for a shared job

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

The GPU utilisation (0..1) and peak memory (bytes) the sharing rule predicted for a job's
configuration. With ``sharing.gres = "mps"`` a shared job's ``mps:N`` request and its MPS
limits come from them, so the rounds between two decisions keep asking for the same share.
Rows decided before this revision get NULL (not predicted).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("round_allocations") as batch:
        batch.add_column(sa.Column("predicted_util", sa.Double(), nullable=True))
        batch.add_column(sa.Column("predicted_mem_bytes", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("round_allocations") as batch:
        batch.drop_column("predicted_mem_bytes")
        batch.drop_column("predicted_util")
