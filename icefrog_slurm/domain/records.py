"""The records every stage passes on: a job and its progress, a round's decision (one
:class:`Allocation` per job), a reconcile intent, a Slurm action of the audit log, and the
states they move through.

The store hands these out (no ORM object ever leaves a transaction); the controller, the
policies, the reports and the simulator read them. A :class:`StoreSnapshot` is what a
controller tick reads: every active job with its spec, Slurm chain, progress, profile
samples, latest gradient statistics and metrics, the last round's decision and the
reconcile intents still open.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.protocol import GradStats, JobSpec, MetricReport

JOB_STATES: tuple[str, ...] = ("pending", "running", "finished", "failed", "cancelled")
ACTIVE_STATES: tuple[str, ...] = ("pending", "running")

OPEN_INTENT_STATES: tuple[str, ...] = ("pending", "acting")
INTENT_END_STATES: tuple[str, ...] = ("done", "failed", "superseded")
GRANTING_ACTIONS: tuple[str, ...] = ("start", "change", "stop")
"""The intents whose end (``done``) leaves a job as the controller decided: released with
their target, or held (``stop``)."""


@dataclass(frozen=True)
class Progress:
    epoch: int = 0
    samples_done: int = 0
    effective_samples_done: float = 0.0
    checkpoint_path: str = ""
    time: float | None = None  # when the job sent it; None before the first report


@dataclass(frozen=True)
class JobRecord:
    id: int
    name: str
    owner_uid: int
    owner_user: str
    state: str
    submit_time: float
    start_time: float | None
    end_time: float | None
    spec: JobSpec
    slurm_job_ids: tuple[str, ...]  # the chain, oldest first; the last is the current one
    progress: Progress
    finish_reason: str | None = None
    final_metric: float | None = None

    @property
    def slurm_job_id(self) -> str:
        return self.slurm_job_ids[-1]


@dataclass(frozen=True)
class Allocation:
    """One job's share of a round's decision."""

    job_id: int
    gpus: int  # 0: the job waits
    batch: int  # per GPU
    frozen: int
    shared: bool = False
    nodes: tuple[str, ...] = ()
    psi: float | None = None
    predicted_tta_s: float | None = None
    share: float | None = None  # IceShare, eq 17
    # eq 8's prediction for a shared job (None when not predicted): GPU utilisation (0..1)
    # and peak memory (bytes); the MPS share and the job's MPS limits come from them
    predicted_util: float | None = None
    predicted_mem_bytes: float | None = None


@dataclass(frozen=True)
class RoundRecord:
    round_no: int
    time: float
    policy: str
    capacity_gpus: int
    solve_s: float | None
    min_share: float | None
    allocations: tuple[Allocation, ...]


@dataclass(frozen=True)
class Intent:
    id: int
    round_no: int | None
    job_id: int | None
    action: str
    params: Mapping[str, Any]
    status: str
    attempts: int
    created_at: float
    updated_at: float
    detail: str = ""


NewIntent = tuple[int | None, str, Mapping[str, Any]]
"""An intent to write (``add_intents``): its job id, action and parameters."""


@dataclass(frozen=True)
class SlurmAction:
    id: int
    time: float
    intent_id: int | None
    job_id: int | None
    slurm_job_id: str | None
    action: str
    command: tuple[str, ...]
    outcome: str
    rc: int | None
    detail: str
    duration_s: float


@dataclass(frozen=True)
class JobView:
    """A job with what it measured: the unit the policy works on."""

    job: JobRecord
    samples: tuple[ProfileSample, ...] = ()
    grad_stats: GradStats | None = None  # the latest epoch's
    metrics: tuple[MetricReport, ...] = ()  # every epoch's, oldest first


@dataclass(frozen=True)
class StoreSnapshot:
    """One consistent read of the store for a controller tick."""

    jobs: tuple[JobView, ...]
    last_round: RoundRecord | None
    open_intents: tuple[Intent, ...] = field(default=())
    measured: bool = True  # False: the views hold no samples, metrics or gradient statistics
    granted: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Active job id -> the target its last done start/change/stop intent left it with."""
