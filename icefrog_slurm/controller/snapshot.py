"""The immutable input of a controller tick: the store's jobs, their Slurm jobs as one
batched poll saw them, the partition's capacity, and the time.

``build_snapshot`` is pure: the daemon reads the store and Slurm through their ports and
hands the results in; the simulator hands in its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from icefrog_slurm.slurm.parse import expand_hostlist
from icefrog_slurm.slurm.port import JobState, PartitionCapacity
from icefrog_slurm.store.records import Intent, JobRecord, JobView, RoundRecord, StoreSnapshot


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
    slurm: JobState | None
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

    def job(self, job_id: int) -> JobSnapshot:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)


def current_of(state: JobState | None) -> Current:
    """GPUs a Slurm job holds: ``gpu:n`` on N nodes is n x N exclusive GPUs; a ``shard``
    job holds one shared GPU; a job that holds nothing (pending, finished) holds 0."""
    if state is None or not state.holds_resources or state.gres is None:
        return Current()
    nodes = tuple(expand_hostlist(state.nodelist)) if state.nodelist else ()
    if state.gres.kind == "shard":
        return Current(gpus=1, shared=True, nodes=nodes)
    return Current(gpus=state.gres.count * max(state.num_nodes, 1), nodes=nodes)


def build_snapshot(
    *,
    store: StoreSnapshot,
    states: Mapping[str, JobState],
    capacity: PartitionCapacity,
    now: float,
) -> Snapshot:
    """Join the store's active jobs with the Slurm state of their current Slurm job."""
    jobs = []
    for view in store.jobs:
        state = states.get(view.job.slurm_job_id)
        jobs.append(JobSnapshot(view=view, slurm=state, current=current_of(state)))
    return Snapshot(
        time=now,
        jobs=tuple(jobs),
        capacity=capacity,
        last_round=store.last_round,
        open_intents=store.open_intents,
        measured=store.measured,
    )
