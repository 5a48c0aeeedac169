"""The immutable input of a controller tick: the store's jobs, their Slurm jobs as one
batched poll saw them, what each holds now, the partition's capacity, and the time.

The controller builds it (``icefrog_slurm.controller.snapshot.build_snapshot``); the
policies read it; the simulator hands in its own store and cluster to build one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from icefrog_slurm.domain.cluster import PartitionCapacity, SlurmJobState
from icefrog_slurm.domain.records import Intent, JobRecord, JobView, RoundRecord


@dataclass(frozen=True)
class Current:
    """What a job holds on Slurm now: ``gpus`` (1 when shared) on ``nodes``."""

    gpus: int = 0
    shared: bool = False
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobSnapshot:
    """One icefrog job: the store's view and its current Slurm job (None: Slurm forgot it)."""

    view: JobView
    slurm: SlurmJobState | None
    current: Current

    @property
    def job(self) -> JobRecord:
        return self.view.job

    @property
    def id(self) -> int:
        return self.view.job.id


@dataclass(frozen=True)
class Snapshot:
    """Everything one tick may look at; nothing in it changes during the tick."""

    time: float
    jobs: tuple[JobSnapshot, ...]
    capacity: PartitionCapacity
    last_round: RoundRecord | None
    open_intents: tuple[Intent, ...] = ()
    measured: bool = True  # False: no samples, metrics or gradient statistics (between rounds)
    granted: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Job id -> ``SlurmRequest.params`` of what the controller last released it with, or
    held it at (the store's ``granted``)."""

    def job(self, job_id: int) -> JobSnapshot:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)
