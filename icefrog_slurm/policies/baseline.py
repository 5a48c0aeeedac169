"""What the baseline policies (Lucid+, Optimus+, Pollux+) share: per-job options, GPU
bookkeeping with placement, marginal-gain elastic allocation, and sharing pairs.

Every baseline is "+" (spec section 12): FreezeOut tuned per job by effective progress,
which is exactly the ICEFROG estimator's per-GPU-count choice (``policies.estimate``: the
Layer Tuner's best (m, l) by E = psi x T, eq 15). The baselines differ only in how they
choose GPU counts and sharing. A running job keeps its nodes when its count is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import JobSnapshot, Snapshot
from icefrog_slurm.policies.estimate import Candidate, Estimator
from icefrog_slurm.settings import Settings

BYTES_PER_GB = 1e9


@dataclass
class JobOptions:
    """A job and its candidates: exclusive ones by GPU count, and the shared one."""

    job: JobSnapshot
    exclusive: dict[int, Candidate]
    shared: Candidate | None

    @property
    def counts(self) -> list[int]:
        return sorted(self.exclusive)


def job_options(
    snapshot: Snapshot, estimator: Estimator, settings: Settings
) -> tuple[list[JobOptions], int]:
    """Every job's candidates (jobs without any are left out); and GPUs a node."""
    per_node = max((n.gpus for n in snapshot.capacity.nodes), default=1)
    estimator.forget({j.id for j in snapshot.jobs})
    estimator.new_round(fit_budget=settings.solver.max_fits_per_round)  # as IcefrogPolicy
    out = []
    estimates = estimator.candidates_for(  # a failed job just waits
        snapshot.jobs,
        now=snapshot.time,
        gpus_per_node=per_node,
        capacity=snapshot.capacity.available_gpus,
        settings=settings,
    )
    for job, (cands, _failed) in zip(snapshot.jobs, estimates, strict=True):
        excl = {c.gpus: c for c in cands if not c.shared}
        shared = next((c for c in cands if c.shared), None)
        if excl or shared:
            out.append(JobOptions(job, excl, shared))
    return out, per_node


class Free:
    """Free GPUs per node while a policy decides; places requests like Slurm would need."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.free = {n.name: n.available for n in snapshot.capacity.nodes}
        self.per_node = max((n.gpus for n in snapshot.capacity.nodes), default=0)

    @property
    def total(self) -> int:
        return sum(self.free.values())

    def keep(self, job: JobSnapshot, gpus: int) -> tuple[str, ...] | None:
        """The job's current nodes, taken, when it keeps ``gpus`` exclusive GPUs there."""
        cur = job.current
        if cur.shared or cur.gpus != gpus or not cur.nodes:
            return None
        each = gpus // len(cur.nodes)
        if any(self.free.get(n, 0) < each for n in cur.nodes):
            return None
        for n in cur.nodes:
            self.free[n] -= each
        return cur.nodes

    def place(self, gpus: int) -> tuple[str, ...] | None:
        """Best fit on one node for up to a node's GPUs, else whole free nodes."""
        if gpus <= 0 or self.per_node <= 0:
            return None
        if gpus <= self.per_node:
            fits = sorted((f, n) for n, f in self.free.items() if f >= gpus)
            if not fits:
                return None
            self.free[fits[0][1]] -= gpus
            return (fits[0][1],)
        need = -(-gpus // self.per_node)
        whole = [n for n, f in self.free.items() if f == self.per_node][:need]
        if len(whole) < need:
            return None
        for n in whole:
            self.free[n] = 0
        return tuple(whole)

    def keep_or_place(self, job: JobSnapshot, gpus: int) -> tuple[str, ...] | None:
        return self.keep(job, gpus) or self.place(gpus)


def allocation(job: JobSnapshot, cand: Candidate, nodes: tuple[str, ...]) -> Allocation:
    c = cand.choice
    return Allocation(
        job_id=job.id, gpus=cand.gpus, batch=c.batch, frozen=c.frozen, shared=cand.shared,
        nodes=nodes, psi=c.psi, predicted_tta_s=cand.tta_s,
        predicted_util=cand.load.util if cand.load else None,
        predicted_mem_bytes=cand.load.memory if cand.load else None,
    )  # fmt: skip


def wait(job: JobSnapshot) -> Allocation:
    return Allocation(job_id=job.id, gpus=0, batch=0, frozen=0)


def pair_fits(a: Candidate, b: Candidate, settings: Settings) -> bool:
    """ICEFROG's sharing prediction (eq 8): both predicted loads known, summed utilisation
    at most 1 and summed memory (with the safety factor) within the GPU."""
    if a.load is None or b.load is None:
        return False
    mem = (a.load.memory + b.load.memory) * settings.sharing.memory_safety
    return a.load.util + b.load.util <= 1.0 and mem <= settings.slurm.gpu_mem_gb * BYTES_PER_GB


def elastic(
    opts: Sequence[JobOptions],
    free: Free,
    value: Callable[[JobOptions, int], float],
    order: Callable[[JobOptions], tuple[float, int]],
    *,
    lookahead: bool = False,
) -> dict[int, int]:
    """Marginal-gain allocation: in ``order`` each job gets its smallest count while GPUs
    remain, then GPUs go one step at a time to the job whose next count gains the most
    ``value`` per added GPU (Optimus' greedy). Counts only; placement follows.

    ``lookahead``: a step may take a job to any larger legal count that fits, the one with
    the best gain per added GPU, so a value that dips at the next count (the first count
    across two nodes) and rises beyond it does not stop the job there (a search over whole
    allocations, as Pollux's genetic algorithm does, reaches such counts)."""
    counts: dict[int, int] = {}
    left = free.total
    for o in sorted(opts, key=order):
        first = o.counts[0] if o.counts else 0
        if first and first <= left:
            counts[o.job.id] = first
            left -= first
    while left > 0:
        best: tuple[float, JobOptions, int] | None = None
        for o in opts:
            have = counts.get(o.job.id, 0)
            if not have:
                continue
            larger = [g for g in o.counts if g > have and g - have <= left]
            now = value(o, have) if larger else 0.0
            for nxt in larger if lookahead else larger[:1]:
                gain = (value(o, nxt) - now) / (nxt - have)
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, o, nxt)
        if best is None:
            break
        _, o, nxt = best
        left -= nxt - counts[o.job.id]
        counts[o.job.id] = nxt
    return counts


def place_counts(
    opts: Iterable[JobOptions], counts: dict[int, int], free: Free
) -> dict[int, Allocation]:
    """Place each job's count (running jobs on their nodes first, then largest first); a
    count that does not fit steps down to the next count that does, else the job waits."""
    out: dict[int, Allocation] = {}
    todo = sorted(
        (o for o in opts if counts.get(o.job.id)),
        key=lambda o: (o.job.current.gpus != counts[o.job.id], -counts[o.job.id]),
    )
    for o in todo:
        for g in sorted((g for g in o.counts if g <= counts[o.job.id]), reverse=True):
            nodes = free.keep_or_place(o.job, g)
            if nodes is not None:
                out[o.job.id] = allocation(o.job, o.exclusive[g], nodes)
                break
    return out


def result(
    snapshot: Snapshot,
    allocations: dict[int, Allocation],
    *,
    started: float,
    why: str = "Resources: no GPUs left",
) -> PolicyResult:
    """Fill in a wait for every job the policy did not allocate; ``solve_s`` is the time
    since ``started`` (a ``time.perf_counter()`` reading taken when deciding began)."""
    reasons = {}
    for job in snapshot.jobs:
        if job.id not in allocations:
            allocations[job.id] = wait(job)
            reasons[job.id] = why
    return PolicyResult(
        allocations=allocations, reasons=reasons, solve_s=time.perf_counter() - started
    )
