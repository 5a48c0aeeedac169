"""Pure capacity arithmetic: a partition's usable GPUs minus the GPUs foreign jobs hold.

A job is foreign when the controller's store does not manage it: ``managed`` maps the Slurm
job ids of the store's active jobs to their owners' uids, and a job is the controller's own
only as one of those ids with that owner, whatever its comment says now (its owner can
rewrite it: ``scontrol update JobId=N Comment=...``); a running job carrying a tag the store
never adopted is foreign. A caller with no store (``managed`` None: preflight, the contract
tests) goes by the comment's icefrog tag (see ``port``). A foreign job holds
GPUs while it is in a holding state (RUNNING, COMPLETING, ...), on every node of its node
list that belongs to the partition, also when it was submitted to another partition that
shares those nodes. A ``gpu:N`` job holds N GPUs a node; a ``shard:K`` job holds the GPUs
its shards sit on (from ``scontrol show job -d``), or, when that is unknown,
ceil(K / shards-per-GPU) GPUs a node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from icefrog_slurm.domain.cluster import NodeCapacity, PartitionCapacity, SlurmJobState
from icefrog_slurm.slurm.parse import expand_hostlist
from icefrog_slurm.slurm.port import NodeGpus


def is_foreign(job: SlurmJobState, managed: Mapping[str, int] | None) -> bool:
    """Whether ``job`` is not the controller's (module docstring)."""
    if managed is None:
        return not job.is_icefrog
    return managed.get(job.job_id) != job.user_id


def foreign_shard_jobs(
    jobs: Iterable[SlurmJobState], managed: Mapping[str, int] | None = None
) -> tuple[str, ...]:
    """Ids of foreign jobs holding shards (their GPU indices are worth one more query)."""
    return tuple(
        j.job_id
        for j in jobs
        if j.holds_resources
        and j.gres is not None
        and j.gres.kind == "shard"
        and is_foreign(j, managed)
    )


def partition_capacity(
    *,
    partition: str,
    nodes: Sequence[NodeGpus],
    jobs: Iterable[SlurmJobState],
    shard_gpus: Mapping[str, Mapping[str, int]] | None = None,
    managed: Mapping[str, int] | None = None,
) -> PartitionCapacity:
    """Capacity = sum over usable nodes n of max(GPUs(n) - foreign GPUs on n, 0).

    ``shard_gpus[job id][node]`` = distinct GPUs a foreign shard job uses on that node.
    """
    usable = {n.name: n for n in nodes if n.usable}
    foreign: dict[str, int] = dict.fromkeys(usable, 0)
    foreign_ids: list[str] = []
    for job in jobs:
        if not job.holds_resources or job.gres is None or not is_foreign(job, managed):
            continue
        held_here = [n for n in expand_hostlist(job.nodelist) if n in usable]
        if not held_here:
            continue
        foreign_ids.append(job.job_id)
        for name in held_here:
            foreign[name] += _gpus_held(job, usable[name], (shard_gpus or {}).get(job.job_id))
    caps = tuple(
        NodeCapacity(name=name, gpus=node.gpus, foreign_gpus=min(foreign[name], node.gpus))
        for name, node in usable.items()
    )
    return PartitionCapacity(partition=partition, nodes=caps, foreign_job_ids=tuple(foreign_ids))


def _gpus_held(job: SlurmJobState, node: NodeGpus, shard_map: Mapping[str, int] | None) -> int:
    assert job.gres is not None
    if job.gres.kind == "gpu":
        return job.gres.count
    if shard_map and node.name in shard_map:
        return shard_map[node.name]
    per_gpu = max(node.shards // node.gpus, 1) if node.gpus else 1
    return math.ceil(job.gres.count / per_gpu)
