"""intents(job_id, id): each active job's last done intent, read every tick

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04

The tick compares each running job with what the controller last released it with: the
target of the job's last done ``start``, ``change`` or ``stop`` intent. Intents are never
deleted, so that read walks this index backwards from a job's newest intent and stops at
the first such one (Postgres took 0.13 s a tick with 2400 jobs of 50 intents each through
the ``(status, job_id)`` index alone).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("intents") as batch:
        batch.create_index("ix_intents_job_id", ["job_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("intents") as batch:
        batch.drop_index("ix_intents_job_id")
