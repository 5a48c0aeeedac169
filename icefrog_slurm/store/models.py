"""The state store's tables (SQLAlchemy 2.0 typed ORM); db/versions/ (the migrations) migrates them.

- ``jobs``: icefrog jobs, first-class: owner, state, the declared spec (GPU and batch
  ranges, max frozen fraction, target, epochs, samples, per-layer table) and the latest
  progress. ``slurm_jobs`` is the chain of Slurm job ids a job has had (one per submission;
  a requeue keeps its id). A Slurm job id belongs to at most one icefrog job.
- What jobs measured: ``profile_samples``, ``grad_stats`` (per epoch, per layer),
  ``metrics`` (validation metrics per epoch).
- What the controller decided: ``rounds`` and ``round_allocations`` (one row a job a round).
- What it did: ``intents`` (written before acting, status updated after, so a restarted
  reconcile knows what was in flight) and ``slurm_actions`` (the audit log: every Slurm
  command with its outcome).
- The inbox's ledger: ``accepted_reports`` (one row per (Slurm job, seq), a Slurm job's
  latest ``ledger.KEPT_REPORTS``: a replay changes nothing) and ``rejected_reports``
  (with the reason).
- ``leader_lease``: the one active controller's fencing token (store/leader.py).

Times are seconds since the epoch, passed in by the caller (the store reads no clock).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

DDP_JSON = '{"kind": "ddp", "stages": 1, "unit": 1}'
"""A job's parallelism before it was stored (migration 0002): plain DDP in units of 1."""


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {  # noqa: RUF012 (SQLAlchemy's class-level mapping)
        float: Double(),
        str: String(256),
        list[float]: JSON(),
        list[int]: JSON(),
        list[str]: JSON(),
        dict[str, Any]: JSON(),
    }


def _fk_job() -> Mapped[int]:
    return mapped_column(ForeignKey("jobs.id"), index=True)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str]
    owner_uid: Mapped[int] = mapped_column(index=True)
    owner_user: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    submit_time: Mapped[float]
    start_time: Mapped[float | None]
    end_time: Mapped[float | None]
    # The spec (protocol.JobSpec), one column a field.
    min_gpus: Mapped[int]
    max_gpus: Mapped[int]
    min_batch: Mapped[int]
    max_batch: Mapped[int]
    max_frozen_fraction: Mapped[float]
    target_metric: Mapped[str]
    target_op: Mapped[str] = mapped_column(String(2))
    target_value: Mapped[float]
    max_epochs: Mapped[int]
    samples_per_epoch: Mapped[int] = mapped_column(BigInteger)
    layer_flops: Mapped[list[float]]
    layer_param_bytes: Mapped[list[float]]
    layer_boundaries: Mapped[list[int]]
    accepts_shared: Mapped[bool] = mapped_column(Boolean)
    # Parallelism.to_json() (core/parallelism.py); rows from before 0002 read as plain DDP.
    parallelism: Mapped[dict[str, Any]] = mapped_column(server_default=text(f"'{DDP_JSON}'"))
    # Samples an optimizer step; 0: free (rows from before 0004 read as free).
    global_batch: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Latest progress (protocol.ProgressReport) and the end.
    epoch: Mapped[int] = mapped_column(default=0)
    samples_done: Mapped[int] = mapped_column(BigInteger, default=0)
    effective_samples_done: Mapped[float] = mapped_column(default=0.0)
    checkpoint_path: Mapped[str] = mapped_column(Text, default="")
    progress_time: Mapped[float | None]
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    final_metric: Mapped[float | None]

    slurm_jobs: Mapped[list[SlurmJobRow]] = relationship(
        order_by="SlurmJobRow.position", back_populates="job"
    )


class SlurmJobRow(Base):
    __tablename__ = "slurm_jobs"
    __table_args__ = (UniqueConstraint("job_id", "position"),)

    slurm_job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[int] = _fk_job()
    position: Mapped[int]  # 0 for the first submission, then 1, 2, ...
    reason: Mapped[str] = mapped_column(String(32))  # submitted, resubmitted, ...
    created_at: Mapped[float]

    job: Mapped[JobRow] = relationship(back_populates="slurm_jobs")


class ProfileSampleRow(Base):
    __tablename__ = "profile_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = _fk_job()
    slurm_job_id: Mapped[str] = mapped_column(String(32))
    time: Mapped[float]
    gpus: Mapped[int]
    batch: Mapped[int]
    frozen: Mapped[int]
    shared: Mapped[bool] = mapped_column(Boolean)
    t_fwd_s: Mapped[float]
    t_bwd_s: Mapped[float]
    t_sync_s: Mapped[float]
    t_iter_s: Mapped[float]
    samples_per_s: Mapped[float]
    peak_mem_bytes: Mapped[float]
    gpu_util: Mapped[float]


class GradStatsRow(Base):
    __tablename__ = "grad_stats"
    __table_args__ = (UniqueConstraint("job_id", "epoch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = _fk_job()
    epoch: Mapped[int]
    frozen: Mapped[int]
    grad_var: Mapped[list[float]]  # one value a layer
    grad_sqr: Mapped[list[float]]
    time: Mapped[float]


class MetricRow(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "epoch", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = _fk_job()
    epoch: Mapped[int]
    name: Mapped[str]
    value: Mapped[float]
    time: Mapped[float]


class RoundRow(Base):
    __tablename__ = "rounds"

    round_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    time: Mapped[float]
    policy: Mapped[str] = mapped_column(String(32))
    capacity_gpus: Mapped[int]
    solve_s: Mapped[float | None]
    min_share: Mapped[float | None]


class AllocationRow(Base):
    __tablename__ = "round_allocations"
    __table_args__ = (UniqueConstraint("round_no", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_no: Mapped[int] = mapped_column(ForeignKey("rounds.round_no"), index=True)
    job_id: Mapped[int] = _fk_job()
    gpus: Mapped[int]  # 0: wait
    batch: Mapped[int]  # per GPU
    frozen: Mapped[int]
    shared: Mapped[bool] = mapped_column(Boolean)
    nodes: Mapped[list[str]]
    psi: Mapped[float | None]
    predicted_tta_s: Mapped[float | None]
    share: Mapped[float | None]  # IceShare (eq 17)
    # eq 8's prediction for a shared job: GPU utilisation 0..1, peak memory (migration 0006)
    predicted_util: Mapped[float | None]
    predicted_mem_bytes: Mapped[float | None]
    # why the round gave the job what it gave ("" when running as decided); for a waiting
    # job "Word: detail", the Word shown by icefrog squeue (migration 0003)
    reason: Mapped[str] = mapped_column(Text, default="", server_default="")


class IntentRow(Base):
    __tablename__ = "intents"
    __table_args__ = (
        Index("ix_intents_status_job", "status", "job_id"),
        Index("ix_intents_job_id", "job_id", "id"),  # a job's last done intent (0007)
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_no: Mapped[int | None] = mapped_column(ForeignKey("rounds.round_no"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    action: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[float]
    updated_at: Mapped[float]
    detail: Mapped[str] = mapped_column(Text, default="")


class SlurmActionRow(Base):
    __tablename__ = "slurm_actions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[float]
    intent_id: Mapped[int | None] = mapped_column(ForeignKey("intents.id"), index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    slurm_job_id: Mapped[str | None] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(32))
    command: Mapped[list[str]]
    outcome: Mapped[str] = mapped_column(String(16))  # ok, error, timeout; started (resubmit)
    rc: Mapped[int | None]
    detail: Mapped[str] = mapped_column(Text, default="")
    duration_s: Mapped[float]


class AcceptedReportRow(Base):
    __tablename__ = "accepted_reports"
    __table_args__ = (UniqueConstraint("slurm_job_id", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slurm_job_id: Mapped[str] = mapped_column(String(32))
    seq: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[int] = _fk_job()
    uid: Mapped[int]
    digest: Mapped[str] = mapped_column(String(64))
    sent_time: Mapped[float]
    received_at: Mapped[float]
    munge_status: Mapped[int]


class RejectedReportRow(Base):
    __tablename__ = "rejected_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    received_at: Mapped[float]
    file: Mapped[str] = mapped_column(Text)
    slurm_job_id: Mapped[str | None] = mapped_column(String(32))
    seq: Mapped[int | None] = mapped_column(BigInteger)
    uid: Mapped[int | None]
    size: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)


class LeaderLeaseRow(Base):
    """The one controller lease (store/leader.py): a single row, id 1, whose ``epoch`` is the
    fencing token every new leader increases."""

    __tablename__ = "leader_lease"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    epoch: Mapped[int] = mapped_column(BigInteger)
    holder: Mapped[str] = mapped_column(String(256))
