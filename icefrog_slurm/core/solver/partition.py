"""Splitting a large round into disjoint partitions of nodes and jobs (spec section 15).

The cluster's nodes are cut into ``P`` contiguous groups of about ``partition_gpus`` GPUs
(whole nodes, at least the largest usable request). A running job whose nodes are known
stays in the group holding most of them; the other jobs are dealt out largest first
(demand = GPUs of the job's fastest option) to the group with the lowest demand per GPU.
Each group is an independent IceShare problem; the union of their solutions is a feasible
solution of the whole (the capacities add up), not a proven optimum of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from icefrog_slurm.core.solver.problem import (
    Cluster,
    JobRequest,
    Problem,
    Solution,
)


def _demand(problem: Problem, job: JobRequest) -> int:
    usable = [i for i in range(len(job.options)) if problem.usable(job, i)]
    if not usable:
        return 0
    return job.options[min(usable, key=lambda i: job.options[i].tta_s)].gpus


def _groups(problem: Problem, partition_gpus: int, largest: int) -> list[tuple[str, ...]]:
    c = problem.cluster
    per_part = max(partition_gpus, largest, c.gpus_per_node)
    n_nodes = len(c.node_names)
    parts = max(1, min(n_nodes, c.gpus // per_part))
    return [tuple(str(n) for n in g) for g in np.array_split(np.array(c.node_names), parts)]


def split(problem: Problem, partition_gpus: int) -> list[Problem]:
    """The sub-problems (one when the cluster is no larger than ``partition_gpus``)."""
    demand = {j.id: _demand(problem, j) for j in problem.jobs}
    groups = _groups(problem, partition_gpus, max(demand.values(), default=1))
    if len(groups) <= 1:
        return [problem]
    home = {n: g for g, nodes in enumerate(groups) for n in nodes}
    members: list[list[JobRequest]] = [[] for _ in groups]
    load = [0.0] * len(groups)
    cap = [len(g) * problem.cluster.gpus_per_node for g in groups]
    rest: list[JobRequest] = []
    for job in problem.jobs:
        nodes = job.current.nodes if job.current and job.running else ()
        counts = [0] * len(groups)
        for name, n in nodes:
            if name in home:
                counts[home[name]] += n
        if max(counts) > 0:
            g = counts.index(max(counts))
            members[g].append(job)
            load[g] += demand[job.id]
        else:
            rest.append(job)
    for job in sorted(rest, key=lambda j: -demand[j.id]):
        g = min(range(len(groups)), key=lambda i: load[i] / cap[i])
        members[g].append(job)
        load[g] += demand[job.id]
    ids = [{j.id for j in m} for m in members]
    return [
        Problem(
            cluster=Cluster(
                gpus=cap[g],
                gpus_per_node=problem.cluster.gpus_per_node,
                gpu_mem_gb=problem.cluster.gpu_mem_gb,
                nodes=groups[g],
                max_jobs_per_gpu=problem.cluster.max_jobs_per_gpu,
                mem_safety=problem.cluster.mem_safety,
            ),
            jobs=tuple(members[g]),
            forbidden=frozenset(f for f in problem.forbidden if f[0] in ids[g]),
        )
        for g in range(len(groups))
    ]


def merge(problem: Problem, parts: Sequence[Solution]) -> Solution:
    """The union of the partitions' solutions (status ``feasible`` unless there is one)."""
    if len(parts) == 1:
        return parts[0]
    choices = {k: v for s in parts for k, v in s.choices.items()}
    mins = [s.min_share for s in parts if s.choices]
    statuses = {s.status for s in parts}
    return Solution(
        status="infeasible" if "infeasible" in statuses else "feasible",
        choices={j.id: choices[j.id] for j in problem.jobs},
        min_share=min(mins, default=0.0),
        sum_share=sum(s.sum_share for s in parts),
        gpus_used=sum(s.gpus_used for s in parts),
        changes=sum(s.changes for s in parts),
        solver="+".join(sorted({s.solver for s in parts})),
        bound=math.inf,
        notes=(f"partitioned into {len(parts)} groups", *(n for s in parts for n in s.notes)),
        floor_share=min((s.floor_share for s in parts), default=0.0),
    )
