"""The reference IceShare ILP (eq 18) in python-mip (CBC), solved lexicographically.

Variables: ``x[k,a]`` for each job's usable exclusive options and for waiting; for jobs
with a shared option, ``alone[k]`` (shared, alone on its GPU) and one ``pair[i,j]`` for each
admissible pair (eq 8). Constraints: each job exactly one choice
(``sum_a x[k,a] + alone[k] + sum_j pair[k,j] = 1``, spec section 10) and the capacity
``sum g*x + sum alone + sum pair <= M``. Value of job k: ``v_k = sum score * choice``.

Three solves, each warm-started (mip start) from the one before, the first from ``start``
(last round's solution or the fast path's):
1. maximize ``z`` subject to ``z <= v_k`` for every k;
2. drop every choice scoring below ``z*`` (and waiting when ``z* > 0``; below
   ``fairness_floor * z*`` with a floor under 1: :func:`.problem.stage2_threshold`),
   maximize ``sum v_k``;
3. add ``sum v_k >= sum*``, minimize the running jobs whose allocation changes.
Scores are the shared integer scores (:mod:`.problem`), so the stages hold exactly.
The time limit is split 40/40/20 over the stages (the core has no clock).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import mip
import numpy as np

from icefrog_slurm.core.solver.matching import admissible_matrix, max_pairs
from icefrog_slurm.core.solver.problem import (
    SCORE_SCALE,
    WAIT,
    Problem,
    Solution,
    evaluate,
    stage2_threshold,
)

Picks = dict[str, int]
Pairs = list[tuple[str, str]]


@dataclass
class _Model:
    model: mip.Model
    # (job id, option index or WAIT) -> variable; shared alone uses the shared option index
    choice: dict[tuple[str, int], mip.Var] = field(default_factory=dict)
    pair: dict[tuple[str, str], mip.Var] = field(default_factory=dict)
    value: dict[str, mip.LinExpr] = field(default_factory=dict)
    shared_of: dict[str, int] = field(default_factory=dict)
    changes: mip.LinExpr | None = None


def _allowed(problem: Problem, t: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for job in problem.jobs:
        idx = [i for i in range(len(job.options)) if problem.usable(job, i)]
        idx = [i for i in idx if job.score(i) >= t]
        out[job.id] = ([WAIT] if t == 0 else []) + idx
    return out


def _build(problem: Problem, allowed: Mapping[str, list[int]], threads: int) -> _Model:
    model = mip.Model(sense=mip.MAXIMIZE, solver_name=mip.CBC)
    model.verbose = 0
    model.threads = threads
    m = _Model(model)
    jobs = {j.id: j for j in problem.jobs}
    shared_of = m.shared_of
    owned: dict[str, list[tuple[int, mip.Var]]] = {}
    for job in problem.jobs:
        own = owned[job.id] = []
        for i in allowed[job.id]:
            var = m.choice[job.id, i] = model.add_var(var_type=mip.BINARY)
            own.append((i, var))
            if i != WAIT and job.options[i].shared:
                shared_of[job.id] = i
    ids = list(shared_of)
    adj = admissible_matrix(problem.cluster, [jobs[i].options[shared_of[i]] for i in ids])
    rows, cols = np.nonzero(np.triu(adj, 1))
    for a, b in zip(rows.tolist(), cols.tolist(), strict=True):
        m.pair[ids[a], ids[b]] = model.add_var(var_type=mip.BINARY)
    in_pair: dict[str, list[mip.Var]] = {i: [] for i in ids}
    for (ja, jb), var in m.pair.items():
        in_pair[ja].append(var)
        in_pair[jb].append(var)
    gpus: list[mip.LinExpr] = []
    keep_terms: list[mip.LinExpr] = []
    for job in problem.jobs:
        own = owned[job.id]
        model += mip.xsum(v for _, v in own) + mip.xsum(in_pair.get(job.id, [])) == 1
        paired = mip.xsum(in_pair.get(job.id, []))
        m.value[job.id] = mip.xsum(job.score(i) * v for i, v in own) + (
            job.score(shared_of[job.id]) * paired if job.id in shared_of else 0
        )
        for i, v in own:
            if i != WAIT:
                gpus.append(job.options[i].gpus * v)
            if not job.keeps(i):
                keep_terms.append(1 * v)
        if job.id in shared_of and not job.keeps(shared_of[job.id]):
            keep_terms.append(paired)
    model += mip.xsum(gpus) + mip.xsum(m.pair.values()) <= problem.cluster.gpus
    m.changes = mip.xsum(keep_terms)
    return m


def _start(m: _Model, picks: Picks, pairs: Pairs) -> None:
    partnered = {a for p in pairs for a in p}
    start: list[tuple[mip.Var, float]] = []
    for jid, idx in picks.items():
        if jid not in partnered and (jid, idx) in m.choice:
            start.append((m.choice[jid, idx], 1.0))
    for a, b in pairs:
        var = m.pair.get((a, b)) or m.pair.get((b, a))
        if var is not None:
            start.append((var, 1.0))
    if start:
        m.model.start = start


def _read(m: _Model) -> tuple[Picks, Pairs]:
    picks: Picks = {}
    pairs: Pairs = []
    for (jid, idx), var in m.choice.items():
        if var.x is not None and var.x >= 0.5:
            picks[jid] = idx
    for (a, b), var in m.pair.items():
        if var.x is not None and var.x >= 0.5:
            pairs.append((a, b))
            picks[a], picks[b] = m.shared_of[a], m.shared_of[b]
    return picks, pairs


def _run(m: _Model, seconds: float, abs_gap: float) -> mip.OptimizationStatus:
    m.model.max_mip_gap = 0.0
    m.model.max_mip_gap_abs = abs_gap
    return m.model.optimize(max_seconds=max(seconds, 0.05))


_GOOD = (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)


def current_picks(problem: Problem) -> tuple[Picks, Pairs] | None:
    """Last round's allocation as choices (the warm start), or None when it does not fit."""
    picks: Picks = {}
    for job in problem.jobs:
        same = [i for i in range(len(job.options)) if job.running and job.keeps(i)]
        picks[job.id] = next((i for i in same if problem.usable(job, i)), WAIT)
    jobs = {j.id: j for j in problem.jobs}
    shared = [j for j, i in picks.items() if i != WAIT and jobs[j].options[i].shared]
    adj = admissible_matrix(problem.cluster, [jobs[j].options[picks[j]] for j in shared])
    local, _ = max_pairs(adj)
    pairs = [(shared[a], shared[b]) for a, b in local]
    excl = sum(jobs[j].options[i].gpus for j, i in picks.items() if i != WAIT)
    if excl - len(pairs) > problem.cluster.gpus:
        return None
    return picks, pairs


def everyone_fits_bound(problem: Problem) -> float:
    """A lower bound on the GPUs needed to run every job: each job's cheapest usable option,
    a shared slot counting 1/2. Above M, stage 1 is 0 without a search (the LP relaxation of
    ``z <= v_k`` is too weak for CBC to see this quickly)."""
    total = 0.0
    for job in problem.jobs:
        costs = [
            0.5 if o.shared else float(o.gpus)
            for i, o in enumerate(job.options)
            if problem.usable(job, i)
        ]
        total += min(costs, default=float("inf"))
    return total


def _stage1(
    problem: Problem, start: tuple[Picks, Pairs] | None, seconds: float, threads: int
) -> tuple[Picks, Pairs, bool] | None:
    """Stage 1: picks and pairs reaching the best minimum, and whether it is proven."""
    if everyone_fits_bound(problem) > problem.cluster.gpus:
        picks, pairs = start or ({j.id: WAIT for j in problem.jobs}, [])
        return picks, pairs, True
    m1 = _build(problem, _allowed(problem, 0), threads)
    z = m1.model.add_var(lb=0.0)
    for value in m1.value.values():
        m1.model += z <= value
    m1.model.objective = mip.maximize(z)
    if start:
        _start(m1, *start)
    st = _run(m1, seconds, 0.5)
    if st not in _GOOD:
        return None
    return (*_read(m1), st == mip.OptimizationStatus.OPTIMAL)


def solve_mip(
    problem: Problem,
    *,
    time_limit_s: float = 30.0,
    start: tuple[Picks, Pairs] | None = None,
    threads: int = 1,
    threshold: int | None = None,
    fairness_floor: float = 1.0,
) -> Solution:
    """The three lexicographic stages (module docstring); ``start`` defaults to the current
    allocation when it fits. With ``threshold`` (stage 2's, from stage 1's optimum proven
    elsewhere, and a ``start`` reaching it) stage 1 is skipped."""
    start = start if start is not None else current_picks(problem)
    if not problem.jobs:
        return evaluate(problem, {}, [], status="optimal", solver="mip", bound=0.0)
    if threshold is not None and start is not None:
        first: tuple[Picks, Pairs, bool] | None = (*start, True)
    else:
        first = _stage1(problem, start, 0.4 * time_limit_s, threads)
    if first is None:
        picks, pairs = start or ({j.id: WAIT for j in problem.jobs}, [])
        return evaluate(problem, picks, pairs, status="feasible", solver="mip")
    picks, pairs, proven = first
    if threshold is None:
        t = stage2_threshold(min(j.score(picks[j.id]) for j in problem.jobs), fairness_floor)
    else:
        t = threshold
    m2 = _build(problem, _allowed(problem, t), threads)
    m2.model.objective = mip.maximize(mip.xsum(m2.value.values()))
    _start(m2, picks, pairs)
    st = _run(m2, 0.4 * time_limit_s, 0.5)
    if st not in _GOOD:
        return evaluate(problem, picks, pairs, status="feasible", solver="mip", threshold=t)
    proven &= st == mip.OptimizationStatus.OPTIMAL
    bound = m2.model.objective_bound / SCORE_SCALE
    picks, pairs = _read(m2)
    total = sum(j.score(picks[j.id]) for j in problem.jobs)
    assert m2.changes is not None
    m2.model += mip.xsum(m2.value.values()) >= total
    m2.model.objective = mip.minimize(m2.changes)
    _start(m2, picks, pairs)
    st = _run(m2, 0.2 * time_limit_s, 0.5)
    if st in _GOOD:
        picks, pairs = _read(m2)
    proven &= st == mip.OptimizationStatus.OPTIMAL
    status = "optimal" if proven else "feasible"
    return evaluate(problem, picks, pairs, status=status, solver="mip", bound=bound, threshold=t)
