"""leader_lease: the one active controller's fencing token

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

One row, id 1, epoch 0: the first controller to lead takes epoch 1 (store/leader.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    lease = op.create_table(
        "leader_lease",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(256), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_leader_lease_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leader_lease")),
    )
    op.bulk_insert(lease, [{"id": 1, "epoch": 0, "holder": ""}])


def downgrade() -> None:
    op.drop_table("leader_lease")
