"""The IceShare allocation problem and its solution, as frozen values (spec section 10).

A round's problem is a cluster (``M`` GPUs on whole nodes) and jobs, each with a list of
options: ``k`` exclusive GPUs with a predicted time-to-accuracy ``T_acc`` (eq 16), or one
*shared* GPU with its ``T_acc`` at lambda and its predicted utilization and memory (eq 8).
Waiting is always allowed and is not listed. The solver picks exactly one choice a job.

This module owns the semantics every solver shares: the IceShare of an option (eq 17),
the admissibility of a shared pair (eq 8), the integer scores the solvers optimize, and the
checks that a set of choices respects the capacity (spec section 16's sanity checks).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from icefrog_slurm.errors import InputError

# Weighted shares are compared as integers in units of 1e-6 (both solvers use the same
# rounding, so "the minimum is held" means exactly equal scores).
SCORE_SCALE = 1_000_000
WAIT = -1  # the choice index that means "wait" (0 GPUs, share 0)


def stage2_threshold(t_star: int, fairness_floor: float) -> int:
    """The least score stage 2 keeps: stage 1's optimum ``t_star`` (eq 18, the paper's
    objective) times ``fairness_floor`` in (0, 1], rounded up; never below 1 when every
    job can run (``t_star > 0``), so every job still runs; 0 (waiting allowed) when not."""
    return 0 if t_star <= 0 else max(1, math.ceil(fairness_floor * t_star))


@dataclass(frozen=True)
class Option:
    """One way to run a job: ``gpus`` exclusive GPUs, or one shared GPU when ``shared``.

    ``util`` (fraction of one GPU) and ``mem_gb`` matter only for shared options (eq 8).
    """

    gpus: int
    tta_s: float
    shared: bool = False
    util: float = 0.0
    mem_gb: float = 0.0

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise InputError(f"option gpus: must be >= 1, got {self.gpus}")
        if not (math.isfinite(self.tta_s) and self.tta_s > 0):
            raise InputError(f"option tta_s: must be a finite number > 0, got {self.tta_s}")
        if self.shared and self.gpus != 1:
            raise InputError("a shared option uses exactly 1 GPU")
        if self.util < 0 or self.mem_gb < 0:
            raise InputError("option util and mem_gb: must be >= 0")


@dataclass(frozen=True)
class Holding:
    """What a job holds now: ``gpus`` (shared or not) and, when known, GPUs per node."""

    gpus: int
    shared: bool = False
    nodes: tuple[tuple[str, int], ...] = ()

    def matches(self, option: Option | None) -> bool:
        """True when choosing ``option`` keeps what the job holds (no checkpoint-restart)."""
        if option is None:
            return self.gpus == 0
        return option.gpus == self.gpus and option.shared == self.shared


@dataclass(frozen=True)
class JobRequest:
    """A job in one round: its weight ``w_k`` (aged by :mod:`.aging`) and its options."""

    id: str
    options: tuple[Option, ...]
    weight: float = 1.0
    current: Holding | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise InputError(f"job {self.id}: weight must be > 0, got {self.weight}")
        if not self.options:
            raise InputError(f"job {self.id}: needs at least one option")
        shared = [o for o in self.options if o.shared]
        exclusive = [o.gpus for o in self.options if not o.shared]
        if len(shared) > 1:
            raise InputError(f"job {self.id}: at most one shared option")
        if len(set(exclusive)) != len(exclusive):
            raise InputError(f"job {self.id}: two exclusive options with the same gpus")
        if shared and exclusive and min(exclusive) > 1:
            raise InputError(
                f"job {self.id}: a shared option on a job that cannot run on one GPU "
                f"(its smallest exclusive option is {min(exclusive)} GPUs)"
            )

    @property
    def running(self) -> bool:
        return self.current is not None and self.current.gpus > 0

    def share(self, index: int) -> float:
        """IceShare of option ``index`` (eq 17): ``min_a' T_acc(a') / T_acc(a)``; wait -> 0."""
        if index == WAIT:
            return 0.0
        return self._best_tta / self.options[index].tta_s

    def score(self, index: int) -> int:
        """The weighted share ``w_k * IceShare_k`` (eq 18's term) as an integer in 1e-6."""
        return 0 if index == WAIT else self._scores[index]

    @cached_property
    def _best_tta(self) -> float:
        return min(o.tta_s for o in self.options)

    @cached_property
    def _scores(self) -> tuple[int, ...]:
        # the solvers ask for every option's score many times a round
        return tuple(
            round(self.weight * self.share(i) * SCORE_SCALE) for i in range(len(self.options))
        )

    def keeps(self, index: int) -> bool:
        """True unless this choice changes a running job's allocation (stage 3's count)."""
        return self._keeps[index]  # WAIT = -1: the last entry

    @cached_property
    def _keeps(self) -> tuple[bool, ...]:
        if not self.running:
            return (True,) * (len(self.options) + 1)
        assert self.current is not None
        return (*(self.current.matches(o) for o in self.options), self.current.matches(None))


@dataclass(frozen=True)
class Cluster:
    """``gpus`` (M) on nodes of ``gpus_per_node`` GPUs with ``gpu_mem_gb`` each.

    ``nodes``: node names; empty means ``node1..nodeN`` with N = gpus / gpus_per_node.
    ``max_jobs_per_gpu``: 2 allows shared pairs, 1 turns sharing into exclusive 1-GPU use.
    ``mem_safety``: the factor on predicted memory before the capacity test (eq 8: 1.1).
    """

    gpus: int
    gpus_per_node: int
    gpu_mem_gb: float
    nodes: tuple[str, ...] = ()
    max_jobs_per_gpu: int = 2
    mem_safety: float = 1.1

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.gpus_per_node < 1:
            raise InputError("cluster: gpus must be >= 0 and gpus_per_node >= 1")
        if self.gpus % self.gpus_per_node:
            raise InputError("cluster: gpus must be a multiple of gpus_per_node (whole nodes)")
        if self.max_jobs_per_gpu not in (1, 2):
            raise InputError("cluster: max_jobs_per_gpu must be 1 or 2 (pairs only)")
        if self.nodes and len(self.nodes) * self.gpus_per_node != self.gpus:
            raise InputError("cluster: len(nodes) * gpus_per_node must equal gpus")
        if len(set(self.nodes)) != len(self.nodes):
            raise InputError("cluster: duplicate node names")

    @property
    def node_names(self) -> tuple[str, ...]:
        if self.nodes:
            return self.nodes
        return tuple(f"node{i + 1}" for i in range(self.gpus // self.gpus_per_node))

    def admissible(self, a: Option, b: Option) -> bool:
        """Whether two shared options may share one GPU (eq 8, the two capacity rules).

        ``(mem_a + mem_b) * mem_safety <= gpu_mem`` and ``util_a + util_b <= 1``.
        """
        if self.max_jobs_per_gpu < 2:
            return False
        mem_ok = (a.mem_gb + b.mem_gb) * self.mem_safety <= self.gpu_mem_gb + 1e-9
        return mem_ok and a.util + b.util <= 1.0 + 1e-9


@dataclass(frozen=True)
class Problem:
    """A round: the cluster and its jobs. ``forbidden``: (job id, option index) pairs the
    solver must not choose (placement adds those it could not place on nodes)."""

    cluster: Cluster
    jobs: tuple[JobRequest, ...]
    forbidden: frozenset[tuple[str, int]] = frozenset()

    def __post_init__(self) -> None:
        ids = [j.id for j in self.jobs]
        if len(set(ids)) != len(ids):
            dup = sorted(i for i, n in Counter(ids).items() if n > 1)
            raise InputError(f"duplicate job id: {dup[0]}")

    def usable(self, job: JobRequest, index: int) -> bool:
        """Whether option ``index`` may be chosen at all on this cluster.

        An exclusive request larger than a node must be whole nodes (spec section 15), and
        no request may exceed the cluster.
        """
        o = job.options[index]
        if (job.id, index) in self.forbidden:
            return False
        gpn = self.cluster.gpus_per_node
        if o.gpus > self.cluster.gpus:
            return False
        return o.gpus <= gpn or (not o.shared and o.gpus % gpn == 0)


@dataclass(frozen=True)
class Choice:
    """A job's decision: ``index`` into its options or ``WAIT``; ``partner`` shares its GPU."""

    index: int
    gpus: int
    shared: bool
    share: float
    partner: str | None = None


@dataclass(frozen=True)
class Solution:
    """One round's decision.

    ``status``: ``optimal`` (every stage proven), ``feasible`` (a time limit, a partition or
    an uncertified fast step), or ``infeasible`` (no solution found within the limit).
    ``min_share``/``sum_share``: the weighted objective (eq 18) and stage 2's sum.
    ``bound``: a proven upper bound on ``sum_share`` given ``floor_share`` (== when optimal).
    ``floor_share``: the least share stage 2 held every job to (:func:`stage2_threshold`).
    """

    status: str
    choices: Mapping[str, Choice]
    min_share: float
    sum_share: float
    gpus_used: int
    changes: int
    solver: str
    bound: float = math.inf
    notes: tuple[str, ...] = field(default=())
    floor_share: float = 0.0


def evaluate(
    problem: Problem,
    picks: Mapping[str, int],
    pairs: Sequence[tuple[str, str]],
    *,
    status: str,
    solver: str,
    bound: float = math.inf,
    notes: tuple[str, ...] = (),
    threshold: int = 0,
) -> Solution:
    """Build a :class:`Solution` from choice indices and the shared pairs, computing totals.

    GPUs used = sum of exclusive GPUs + number of shared GPUs (pairs + shared jobs alone).
    """
    partner: dict[str, str] = {}
    for a, b in pairs:
        partner[a], partner[b] = b, a
    choices: dict[str, Choice] = {}
    scores: list[int] = []
    used = changes = 0
    for job in problem.jobs:
        idx = picks[job.id]
        opt = None if idx == WAIT else job.options[idx]
        shared = bool(opt and opt.shared)
        if opt is not None and not shared:
            used += opt.gpus
        elif shared:
            used += 1 if job.id not in partner else 0
        changes += 0 if job.keeps(idx) else 1
        scores.append(job.score(idx))
        choices[job.id] = Choice(
            index=idx,
            gpus=opt.gpus if opt else 0,
            shared=shared,
            share=job.share(idx),
            partner=partner.get(job.id),
        )
    used += len(pairs)
    return Solution(
        status=status,
        choices=choices,
        min_share=min(scores, default=0) / SCORE_SCALE,
        sum_share=sum(scores) / SCORE_SCALE,
        gpus_used=used,
        changes=changes,
        solver=solver,
        bound=bound,
        notes=notes,
        floor_share=threshold / SCORE_SCALE,
    )


def check_solution(problem: Problem, solution: Solution) -> list[str]:
    """Spec section 16's checks; returns the violations (empty when the solution is sound).

    Every job exactly one choice, capacity never exceeded, every pair admissible and made of
    two shared choices, no GPU with more than ``max_jobs_per_gpu`` jobs.
    """
    errors: list[str] = []
    jobs = {j.id: j for j in problem.jobs}
    if set(solution.choices) != set(jobs):
        errors.append("not every job has exactly one choice")
    exclusive = sum(c.gpus for c in solution.choices.values() if not c.shared)
    shared_gpus = sum(1 for j, c in solution.choices.items() if c.shared and (c.partner or j) >= j)
    if exclusive + shared_gpus > problem.cluster.gpus:
        errors.append(f"capacity exceeded: {exclusive + shared_gpus} > {problem.cluster.gpus}")
    if exclusive + shared_gpus != solution.gpus_used:
        errors.append(f"gpus_used {solution.gpus_used} != {exclusive + shared_gpus}")
    for jid, ch in solution.choices.items():
        job = jobs.get(jid)
        if job is not None and ch.index != WAIT and not problem.usable(job, ch.index):
            errors.append(f"{jid}: option {ch.index} is not usable")
    for jid, ch in solution.choices.items():
        if ch.partner is None:
            continue
        other = solution.choices.get(ch.partner)
        if not (ch.shared and other and other.shared and other.partner == jid):
            errors.append(f"{jid}: broken pair with {ch.partner}")
            continue
        a, b = jobs[jid].options[ch.index], jobs[ch.partner].options[other.index]
        if not problem.cluster.admissible(a, b):
            errors.append(f"{jid}+{ch.partner}: inadmissible pair")
    return errors
