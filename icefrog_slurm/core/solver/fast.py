"""The fast IceShare solver: an exact threshold search for stage 1, a DP for stages 2-3.

Stage 1, ``max_X min_k w_k * IceShare_k`` (eq 18), is a threshold problem. For a target
``t`` every job must pick an option scoring ``>= t``; the cheapest such choice is its
smallest qualifying exclusive count ``g_k(t)``, or - when its shared option qualifies - one
slot on a shared GPU. A shared job costs 1 GPU alone and half of one when paired, and an
exclusive 1-GPU option costs the same 1, so the fewest GPUs for ``t`` are exactly

    need(t) = sum_{k not in S(t)} g_k(t) + |S(t)| - nu(S(t))

with ``S(t)`` the jobs whose shared option qualifies and ``nu`` the maximum matching of
their admissible pairs (:mod:`.matching`). ``t`` is feasible iff ``need(t) <= M``; that is
monotone in ``t``, so a binary search over the distinct option scores finds ``t*`` exactly.

Stages 2 and 3 keep only choices scoring ``>= t*`` (and "wait" only when ``t* = 0``; with
``fairness_floor`` below 1, ``>= fairness_floor * t*``: :func:`.problem.stage2_threshold`) and
maximize ``sum_k w_k * IceShare_k``, then the number of running jobs kept unchanged, as one
integer key ``score * (N + 1) + keep``. That is a multiple-choice knapsack, solved by dynamic
programming over capacity in half-GPU units with a parity bit: an exclusive option costs
``2g``, a shared one 1 (a paired slot), and an odd number of shared jobs one more. This is a
*relaxation* (it assumes any two shared jobs may pair); when the chosen shared jobs' real
matching fits the GPUs, the DP's value is a proven optimum. Otherwise the DP is re-run with
the capacity reduced by the shortfall (a feasible answer, status ``feasible`` with the
relaxation as its bound); ``--solver auto`` then hands it to the MIP as a warm start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from icefrog_slurm.core.solver.matching import admissible_matrix, max_pairs
from icefrog_slurm.core.solver.problem import (
    SCORE_SCALE,
    WAIT,
    JobRequest,
    Problem,
    Solution,
    evaluate,
    stage2_threshold,
)

IntArray = npt.NDArray[np.int64]
NEG = np.int64(-(2**62))


@dataclass(frozen=True)
class _Tables:
    """Per-job option tables padded to K columns (score -1 where absent or unusable)."""

    excl_score: IntArray  # (N, K) exclusive options' scores
    excl_gpus: IntArray  # (N, K)
    excl_index: IntArray  # (N, K) index into job.options
    shared_score: IntArray  # (N,) the shared option's score, -1 if none
    shared_index: IntArray  # (N,)


def _tables(problem: Problem) -> _Tables:
    n = len(problem.jobs)
    k = max((len(j.options) for j in problem.jobs), default=1)
    es = np.full((n, k), -1, dtype=np.int64)
    eg = np.zeros((n, k), dtype=np.int64)
    ei = np.full((n, k), WAIT, dtype=np.int64)
    ss = np.full(n, -1, dtype=np.int64)
    si = np.full(n, WAIT, dtype=np.int64)
    for r, job in enumerate(problem.jobs):
        for i, o in enumerate(job.options):
            if not problem.usable(job, i):
                continue
            if o.shared:
                ss[r], si[r] = job.score(i), i
            else:
                es[r, i], eg[r, i], ei[r, i] = job.score(i), o.gpus, i
    return _Tables(es, eg, ei, ss, si)


Witness = tuple[dict[str, int], list[tuple[str, str]]]


def _need_check(problem: Problem, tab: _Tables, t: int) -> Witness | None:
    """Whether every job can score ``>= t`` within M GPUs; with a witness when it can."""
    big = np.int64(1 << 40)
    qual = tab.excl_score >= t
    gmin = np.where(qual, tab.excl_gpus, big).min(axis=1)
    shared = tab.shared_score >= t
    if not np.all((gmin < big) | shared):
        return None
    base = int(gmin[~shared].sum())
    s_rows = np.flatnonzero(shared)
    m = problem.cluster.gpus
    if base + math.ceil(len(s_rows) / 2) > m:
        return None
    need = max(0, base + len(s_rows) - m)
    opts = [problem.jobs[r].options[int(tab.shared_index[r])] for r in s_rows]
    pairs_local, _ = max_pairs(admissible_matrix(problem.cluster, opts), need=need)
    if len(pairs_local) < need:
        return None
    picks: dict[str, int] = {}
    for r, job in enumerate(problem.jobs):
        if shared[r]:
            picks[job.id] = int(tab.shared_index[r])
        else:
            col = int(np.argmin(np.where(qual[r], tab.excl_gpus[r], big)))
            picks[job.id] = int(tab.excl_index[r, col])
    ids = [problem.jobs[r].id for r in s_rows]
    return picks, [(ids[a], ids[b]) for a, b in pairs_local]


def max_min_threshold(problem: Problem) -> tuple[int, dict[str, int], list[tuple[str, str]]]:
    """Stage 1 exactly: the largest ``t`` (integer score) every job can reach, and a witness.

    Binary search over the distinct usable option scores; ``t = 0`` (everyone may wait)
    when not every job can run.
    """
    tab = _tables(problem)
    values = np.unique(np.concatenate([tab.excl_score.ravel(), tab.shared_score]))
    values = values[values > 0]
    lo, hi = 0, len(values) - 1
    best: tuple[int, dict[str, int], list[tuple[str, str]]] = (
        0,
        {j.id: WAIT for j in problem.jobs},
        [],
    )
    while lo <= hi and problem.jobs:
        mid = (lo + hi) // 2
        found = _need_check(problem, tab, int(values[mid]))
        if found is not None:
            best = (int(values[mid]), *found)
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def _choices(
    problem: Problem, job: JobRequest, t: int, alone: bool
) -> list[tuple[int, int, int, int]]:
    """(option index, half-GPU cost, parity flip, key) of each choice allowed after stage 1.

    ``alone``: the job's shared option is charged a whole GPU (it found no partner)."""
    mult = len(problem.jobs) + 1
    out = [(WAIT, 0, 0, int(job.keeps(WAIT)))] if t == 0 else []
    for i, o in enumerate(job.options):
        if problem.usable(job, i) and job.score(i) >= t:
            cost, flip = (1, 1) if o.shared and not alone else (2 * o.gpus, 0)
            out.append((i, cost, flip, job.score(i) * mult + int(job.keeps(i))))
    return out


_Cands = tuple[list[tuple[int, int, int, int]], IntArray, IntArray, IntArray]


def _knapsack(
    problem: Problem,
    t: int,
    alone: frozenset[str],
    cache: dict[tuple[str, bool], _Cands] | None = None,
) -> tuple[int, dict[str, int]] | None:
    """Max total key with relaxed cost <= 2M half-GPUs (odd shared count costs one more).

    ``cache``: each job's choices as arrays, kept across the repairs of one threshold."""
    cache = {} if cache is None else cache
    cap = 2 * problem.cluster.gpus
    best = np.full((2, cap + 1), NEG, dtype=np.int64)
    best[0, :] = 0
    trace: list[tuple[list[tuple[int, int, int, int]], npt.NDArray[np.int8]]] = []
    # ext[f, p, cap + 1 + x] = best[p ^ f, x], with cap + 1 NEG cells before x = 0: the
    # window of cap + 1 cells starting at cap + 1 - cost is best shifted right by ``cost``
    ext = np.full((2, 2, 2 * cap + 2), NEG, dtype=np.int64)
    windows = sliding_window_view(ext, cap + 1, axis=2)  # a view: follows ext's updates
    parities = np.array([[0, 1]])
    for job in problem.jobs:
        known = (job.id, job.id in alone)
        if known not in cache:
            cands = _choices(problem, job, t, known[1])
            _, costs, flips, keys = (np.array(c, dtype=np.int64) for c in zip(*cands, strict=True))
            cache[known] = (cands, costs, flips, keys)
        cands, costs, flips, keys = cache[known]
        ext[0, :, cap + 1 :] = best
        ext[1, :, cap + 1 :] = best[::-1]
        start = np.maximum(cap + 1 - costs, 0)  # cost > cap: all NEG
        # unreachable cells stay below NEG // 2 (keys are far smaller than 2**61)
        stack = windows[flips[:, None], parities, start[:, None]] + keys[:, None, None]
        arg = np.argmax(stack, axis=0)
        best = stack.max(axis=0)
        trace.append((cands, arg.astype(np.int8)))
    ends = [
        (int(best[0, cap]), 0, cap),
        (int(best[1, cap - 1]) if cap >= 1 else int(NEG), 1, cap - 1),
    ]
    value, parity, c = max(ends)
    if value <= NEG // 2:
        return None
    picks: dict[str, int] = {}
    for job, (cands, arg) in zip(reversed(problem.jobs), reversed(trace), strict=True):
        idx, cost, flip, _ = cands[int(arg[parity, c])]
        picks[job.id] = idx
        c -= cost
        parity ^= flip
    return value, picks


def _pair_up(problem: Problem, picks: dict[str, int]) -> tuple[int, list[tuple[str, str]]]:
    """Real GPUs of ``picks`` with a maximum matching of its shared jobs, and the pairs."""
    jobs = {j.id: j for j in problem.jobs}
    shared_ids = [i for i, x in picks.items() if x != WAIT and jobs[i].options[x].shared]
    excl = sum(jobs[i].options[x].gpus for i, x in picks.items() if x != WAIT) - len(shared_ids)
    need = max(0, excl + len(shared_ids) - problem.cluster.gpus)
    opts = [jobs[i].options[picks[i]] for i in shared_ids]
    local, _ = max_pairs(admissible_matrix(problem.cluster, opts), need=need)
    pairs = [(shared_ids[a], shared_ids[b]) for a, b in local]
    return excl + len(shared_ids) - len(pairs), pairs


def _partnerless(problem: Problem, t: int) -> frozenset[str]:
    """Jobs whose shared option scores ``>= t`` but admits no partner among the other such
    options: they can only share a GPU alone, so the DP charges them a whole GPU from the
    start (exact, and a tighter relaxation than pairing them with anyone)."""
    rows = [
        (job.id, job.options[i])
        for job in problem.jobs
        for i, o in enumerate(job.options)
        if o.shared and problem.usable(job, i) and job.score(i) >= t
    ]
    adj = admissible_matrix(problem.cluster, [o for _, o in rows])
    partners = adj.sum(axis=1).tolist() if rows else []
    return frozenset(jid for (jid, _), n in zip(rows, partners, strict=True) if n == 0)


def _repair(
    problem: Problem, t: int, max_repairs: int
) -> tuple[int | None, tuple[int, dict[str, int], list[tuple[str, str]]] | None]:
    """The relaxed DP's bound key, and the first DP answer whose shared jobs really pair.

    After each DP whose shared jobs do not all find partners, the unmatched ones are
    charged a whole GPU for sharing and the DP runs again (a restriction, so each answer
    is no better than the last; at least one more job is charged each time)."""
    alone = _partnerless(problem, t)
    bound: int | None = None
    cache: dict[tuple[str, bool], _Cands] = {}
    for _ in range(max_repairs):
        found = _knapsack(problem, t, alone, cache)
        if found is None:
            return bound, None
        key, picks = found
        bound = key if bound is None else bound
        used, pairs = _pair_up(problem, picks)
        if used <= problem.cluster.gpus:
            return bound, (key, picks, pairs)
        paired = {j for p in pairs for j in p}
        jobs = {j.id: j for j in problem.jobs}
        alone |= {j for j, i in picks.items() if i != WAIT and jobs[j].options[i].shared} - paired
    return bound, None


def solve_fast(problem: Problem, *, max_repairs: int = 8, fairness_floor: float = 1.0) -> Solution:
    """Stage 1 exactly, then stages 2-3 by the relaxed DP (see the module docstring)."""
    t_star, witness, witness_pairs = max_min_threshold(problem)
    t = stage2_threshold(t_star, fairness_floor)
    mult = len(problem.jobs) + 1
    bound_key, found = _repair(problem, t, max_repairs)
    bound = math.inf if bound_key is None else (bound_key // mult) / SCORE_SCALE
    fallback = evaluate(
        problem,
        witness,
        witness_pairs,
        status="feasible",
        solver="fast",
        bound=bound,
        notes=("stage 2 kept stage 1's witness",),
        threshold=t,
    )
    if found is None:
        return fallback
    key, picks, pairs = found
    status = "optimal" if key == bound_key else "feasible"
    sol = evaluate(problem, picks, pairs, status=status, solver="fast", bound=bound, threshold=t)
    if (sol.sum_share, -sol.changes) >= (fallback.sum_share, -fallback.changes):
        return sol
    return fallback
