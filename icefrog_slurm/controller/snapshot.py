"""Building the immutable input of a controller tick (icefrog_slurm.domain.snapshot): the
store's jobs joined with their Slurm jobs as one batched poll saw them, what each holds now,
the partition's capacity, and the time.

``build_snapshot`` is pure: the daemon reads the store and Slurm through their ports and
hands the results in; the simulator hands in its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from icefrog_slurm.domain.cluster import PartitionCapacity, SlurmJobState
from icefrog_slurm.domain.records import StoreSnapshot
from icefrog_slurm.domain.snapshot import Current, JobSnapshot, Snapshot
from icefrog_slurm.slurm.parse import expand_hostlist


def current_of(state: SlurmJobState | None) -> Current:
    """GPUs a Slurm job holds: ``gpu:n`` on N nodes is n x N exclusive GPUs; a ``shard``
    or ``mps`` job holds one shared GPU; a job that holds nothing (pending, finished) 0."""
    if state is None or not state.holds_resources or state.gres is None:
        return Current()
    nodes = _nodes(state.nodelist) if state.nodelist else ()
    if state.gres.shared:
        return Current(gpus=1, shared=True, nodes=nodes)
    return Current(gpus=state.gres.count * max(state.num_nodes, 1), nodes=nodes)


@lru_cache(maxsize=4096)
def _nodes(nodelist: str) -> tuple[str, ...]:
    """A node list's names; memoized: the same few lists come back every tick, and parsing
    one (ClusterShell) costs about a millisecond."""
    return tuple(expand_hostlist(nodelist))


def build_snapshot(
    *,
    store: StoreSnapshot,
    states: Mapping[str, SlurmJobState],
    capacity: PartitionCapacity,
    now: float,
) -> Snapshot:
    """Join the store's active jobs with the Slurm state of their current Slurm job. A Slurm
    job of that id owned by another uid is not theirs (Slurm gave the id again, after its
    ids were reset): the job's own is gone."""
    jobs = []
    for view in store.jobs:
        state = states.get(view.job.slurm_job_id)
        if state is not None and state.user_id != view.job.owner_uid:
            state = None
        jobs.append(JobSnapshot(view=view, slurm=state, current=current_of(state)))
    return Snapshot(
        time=now,
        jobs=tuple(jobs),
        capacity=capacity,
        last_round=store.last_round,
        open_intents=store.open_intents,
        measured=store.measured,
        granted=store.granted,
    )
