"""Pure capacity arithmetic: a partition's usable GPUs minus the GPUs foreign jobs hold.

A job is foreign when its comment carries no icefrog tag (see ``port``). A foreign job holds
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


def foreign_shard_jobs(jobs: Iterable[SlurmJobState]) -> tuple[str, ...]:
    """Ids of foreign jobs holding shards (their GPU indices are worth one more query)."""
    return tuple(
        j.job_id
        for j in jobs
        if not j.is_icefrog and j.holds_resources and j.gres is not None and j.gres.kind == "shard"
    )


def partition_capacity(
    *,
    partition: str,
    nodes: Sequence[NodeGpus],
    jobs: Iterable[SlurmJobState],
    shard_gpus: Mapping[str, Mapping[str, int]] | None = None,
) -> PartitionCapacity:
    """Capacity = sum over usable nodes n of max(GPUs(n) - foreign GPUs on n, 0).

    ``shard_gpus[job id][node]`` = distinct GPUs a foreign shard job uses on that node.
    """
    usable = {n.name: n for n in nodes if n.usable}
    foreign: dict[str, int] = dict.fromkeys(usable, 0)
    foreign_ids: list[str] = []
    for job in jobs:
        if job.is_icefrog or not job.holds_resources or job.gres is None:
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
