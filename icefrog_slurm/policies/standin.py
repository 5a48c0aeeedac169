"""``StandInPolicy``: a simple first-come first-served policy behind the policy interface.

Written as the stand-in before the IceShare solver landed; kept as
``--policy standin``, a predictable baseline for the mechanics tests (kill test, foreign
jobs) and a fallback without fitting or solving. It does no
layer freezing and no sharing: in submission order each job gets ``min_gpus`` exclusive
GPUs when they fit (a running job keeps what it holds), the smallest batch of its range
and no frozen layers; jobs that do not fit wait. Placement: a running job stays on its
nodes; a request of at most a node goes best-fit on one node; a larger one takes whole
free nodes. A node's free GPUs are its GPUs minus those foreign jobs hold.
"""

from __future__ import annotations

from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import JobSnapshot, Snapshot
from icefrog_slurm.settings import Settings


class StandInPolicy:
    """First come, first served, ``min_gpus`` each (module docstring)."""

    name = "standin-fcfs"

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        free = {n.name: n.available for n in snapshot.capacity.nodes}
        per_node = max((n.gpus for n in snapshot.capacity.nodes), default=0)
        allocations: dict[int, Allocation] = {}
        reasons: dict[int, str] = {}
        order = sorted(snapshot.jobs, key=lambda j: (j.job.submit_time, j.id))
        for job in order:  # running jobs first keep their GPUs
            cur = job.current
            if (
                cur.gpus == job.job.spec.min_gpus
                and not cur.shared
                and _take(free, cur.nodes, cur.gpus)
            ):
                allocations[job.id] = _alloc(job, cur.gpus, cur.nodes)
        for job in order:
            if job.id in allocations:
                continue
            nodes = _place(free, job.job.spec.min_gpus, per_node)
            if nodes is None:
                allocations[job.id] = Allocation(job_id=job.id, gpus=0, batch=0, frozen=0)
                reasons[job.id] = f"Resources: {job.job.spec.min_gpus} GPUs do not fit now"
            else:
                allocations[job.id] = _alloc(job, job.job.spec.min_gpus, nodes)
        return PolicyResult(allocations=allocations, reasons=reasons)


def _alloc(job: JobSnapshot, gpus: int, nodes: tuple[str, ...]) -> Allocation:
    spec = job.job.spec
    return Allocation(
        job_id=job.id,
        gpus=gpus,
        batch=spec.batch_candidates(gpus)[0],  # its smallest, or the global batch's m
        frozen=0,
        nodes=nodes,
    )


def _take(free: dict[str, int], nodes: tuple[str, ...], gpus: int) -> bool:
    if not nodes or any(n not in free for n in nodes):
        return False
    each = gpus // len(nodes)
    if any(free[n] < each for n in nodes):
        return False
    for n in nodes:
        free[n] -= each
    return True


def _place(free: dict[str, int], gpus: int, per_node: int) -> tuple[str, ...] | None:
    if per_node <= 0:
        return None
    if gpus <= per_node:
        fits = sorted((f, i, n) for i, (n, f) in enumerate(free.items()) if f >= gpus)
        if not fits:
            return None
        node = fits[0][2]
        free[node] -= gpus
        return (node,)
    need = -(-gpus // per_node)
    whole = [n for n, f in free.items() if f == per_node][:need]
    if len(whole) < need:
        return None
    for n in whole:
        free[n] = 0
    return tuple(whole)
