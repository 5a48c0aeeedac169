"""``IcefrogPolicy``: the ICEFROG round (spec sections 9-10): per-job estimates, the IceShare
max-min solver, then placement on nodes.

1. Every job's candidates (:mod:`.estimate`): for each legal GPU count and for one shared
   GPU, the Layer Tuner's best (batch, frozen) and the predicted TTA (eq 15-16); at most
   ``solver.max_fits_per_round`` throughput models are refitted, oldest jobs first.
2. The solver problem (eq 17-18): one option per candidate; a job's weight aged by the
   rounds it has waited beyond ``solver.starvation_grace_rounds`` (one more weight every
   ``solver.starvation_rounds``; rounds counted by the policy, estimated from submit and
   start times for a job it has not seen yet); its current allocation as the warm start
   (stage 3 of the solver keeps running jobs where they are when that costs no share). A
   shared option's utilisation is the credited one (``core.sharing.credited_util``:
   lambda x the predicted utilisation), which eq 8's pair rule sums.
   The cluster is the partition's nodes that foreign jobs leave whole (the solver plans
   whole, identical nodes; a node a foreign job partly holds is left out this round).
3. Hysteresis (``solver.move_min_gain``): an option a running job is predicted to finish
   sooner on is forbidden when, after its reallocation overhead, it saves less than that
   fraction of the job's remaining time at its current allocation (:func:`unpaid_moves`);
   options that make it slower stay, so the solver can still give its GPUs to others.
4. ``solve_and_place``: solve, map counts onto nodes and GPU indices, re-solve without any
   option that could not be placed.

Every job gets an allocation: its GPUs, nodes, batch, frozen layers, psi, predicted TTA and
IceShare, or 0 GPUs and the reason it waits.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from icefrog_slurm.core.placement import solve_and_place
from icefrog_slurm.core.sharing import credited_util
from icefrog_slurm.core.solver import (
    WAIT,
    Cluster,
    Holding,
    JobRequest,
    Memo,
    Option,
    Problem,
    SolveOptions,
    aged_weight,
    solve,
)
from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import JobSnapshot, Snapshot
from icefrog_slurm.policies.estimate import BYTES_PER_GB, Candidate, Estimator
from icefrog_slurm.settings import Settings


class IcefrogPolicy:
    """The ICEFROG policy (module docstring); keeps its fitted models between rounds."""

    name = "icefrog"

    def __init__(self) -> None:
        self.estimator = Estimator(explore=None)  # policy.exploration: AdaptDL's 2x rule
        self._waited: dict[int, int] = {}  # rounds each job was told to wait, by this policy

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        cluster = _cluster(snapshot, settings)
        self.estimator.forget({j.id for j in snapshot.jobs})
        self.estimator.new_round(fit_budget=settings.solver.max_fits_per_round, jobs=snapshot.jobs)
        requests: list[JobRequest] = []
        unpaid: set[tuple[str, int]] = set()
        options: dict[str, tuple[Candidate, ...]] = {}
        allocations: dict[int, Allocation] = {}
        reasons: dict[int, str] = {}
        jobs = sorted(snapshot.jobs, key=lambda j: (j.job.submit_time, j.id))
        estimates = self.estimator.candidates_for(
            jobs,
            now=snapshot.time,
            gpus_per_node=cluster.gpus_per_node,
            capacity=cluster.gpus,
            settings=settings,
        )
        for job, (cands, failed) in zip(jobs, estimates, strict=True):
            if not cands:
                allocations[job.id] = _wait(job)
                reasons[job.id] = failed or (
                    "NoFit: no configuration fits the free nodes or makes progress"
                )
                continue
            options[str(job.id)] = cands
            waited = self._waited.setdefault(job.id, _waited_before(job, snapshot.time, settings))
            requests.append(_request(job, cands, waited, settings))
            age = max(0.0, snapshot.time - job.job.submit_time)
            unpaid |= unpaid_moves(requests[-1], age_s=age, min_gain=settings.solver.move_min_gain)
        if not requests:
            return PolicyResult(allocations=allocations, reasons=reasons)
        solver = SolveOptions(
            method=settings.solver.method,
            time_limit_s=settings.solver.time_limit_s,
            partition_gpus=settings.solver.partition_gpus,
            workers=settings.solver.workers,
            fairness_floor=settings.solver.fairness_floor,
        )
        started = time.perf_counter()
        fast = replace(solver, method="fast")
        memo: Memo = {}  # this round's solved (sub)problems, one memo per method
        fast_memo: Memo = {}
        solution, placement, _ = solve_and_place(
            Problem(cluster=cluster, jobs=tuple(requests), forbidden=frozenset(unpaid)),
            lambda p: solve(p, solver, memo),
            steer=None if solver.method == "fast" else lambda p: solve(p, fast, fast_memo),
        )
        solve_s = time.perf_counter() - started
        solved = {r.id: r for r in requests}
        for job in snapshot.jobs:
            key = str(job.id)
            if key not in options:
                continue
            choice = solution.choices[key]
            if choice.index == WAIT:
                self._waited[job.id] += 1
                allocations[job.id] = _wait(job)
                reasons[job.id] = (
                    f"Resources: IceShare gives the GPUs to others (min share "
                    f"{solution.min_share:.3f})"
                )
                continue
            cand = options[key][choice.index]
            allocations[job.id] = Allocation(
                job_id=job.id,
                gpus=choice.gpus,
                batch=cand.choice.batch,
                frozen=cand.choice.frozen,
                shared=choice.shared,
                nodes=tuple(node for node, _ in placement.gpus.get(key, ())),
                psi=cand.choice.psi,
                predicted_tta_s=cand.tta_s,
                share=choice.share,
                # the utilisation eq 8's pair rule summed for it (an MPS job's share)
                predicted_util=solved[key].options[choice.index].util if cand.load else None,
                predicted_mem_bytes=cand.load.memory if cand.load else None,
            )
        return PolicyResult(
            allocations=allocations,
            reasons=reasons,
            solve_s=solve_s,
            min_share=solution.min_share,
        )


def _cluster(snapshot: Snapshot, settings: Settings) -> Cluster:
    nodes = snapshot.capacity.nodes
    gpn = max((n.gpus for n in nodes), default=1) or 1
    whole = tuple(n.name for n in nodes if n.gpus == gpn and n.available == n.gpus)
    return Cluster(
        gpus=len(whole) * gpn,
        gpus_per_node=gpn,
        gpu_mem_gb=settings.slurm.gpu_mem_gb,
        nodes=whole,
        max_jobs_per_gpu=settings.sharing.max_jobs_per_gpu,
        mem_safety=settings.sharing.memory_safety,
    )


def _waited_before(job: JobSnapshot, now: float, settings: Settings) -> int:
    """Rounds a job first seen now has waited: from its submission to its start (or now)."""
    until = job.job.start_time if job.job.start_time is not None else now
    return max(0, math.floor((until - job.job.submit_time) / settings.controller.round_period_s))


def _request(
    job: JobSnapshot, cands: tuple[Candidate, ...], waited: int, settings: Settings
) -> JobRequest:
    opts = tuple(
        Option(
            gpus=c.gpus,
            tta_s=c.tta_s,
            shared=c.shared,
            util=credited_util(c.load.util, settings.sharing.speed_factor) if c.load else 0.0,
            mem_gb=c.load.memory / BYTES_PER_GB if c.load else 0.0,
        )
        for c in cands
    )
    cur = job.current
    current = None
    if cur.gpus:
        per_node = 1 if cur.shared else cur.gpus // max(len(cur.nodes), 1)
        current = Holding(
            gpus=cur.gpus, shared=cur.shared, nodes=tuple((n, per_node) for n in cur.nodes)
        )
    return JobRequest(
        id=str(job.id),
        options=opts,
        weight=aged_weight(
            1.0,
            max(0, waited - settings.solver.starvation_grace_rounds),
            rounds_per_step=settings.solver.starvation_rounds,
        ),
        current=current,
    )


def unpaid_moves(request: JobRequest, *, age_s: float, min_gain: float) -> set[tuple[str, int]]:
    """The (job id, option index) pairs of a running job's options that would move it to an
    allocation it is predicted to finish sooner on, but by less than ``min_gain`` of its
    remaining time at its current allocation. The options' TTAs include the age ``age_s``
    and, for a move, the reallocation overhead, so the saving is net of the restart. Empty
    when the job holds nothing or no option keeps what it holds."""
    cur = request.current
    if cur is None or cur.gpus == 0 or min_gain <= 0:
        return set()
    kept = [o.tta_s for o in request.options if cur.matches(o)]
    if not kept:
        return set()
    here = kept[0]
    enough = min_gain * max(here - age_s, 0.0)
    return {
        (request.id, i)
        for i, o in enumerate(request.options)
        if not cur.matches(o) and o.tta_s < here and here - o.tta_s < enough
    }


def _wait(job: JobSnapshot) -> Allocation:
    return Allocation(job_id=job.id, gpus=0, batch=0, frozen=0)
