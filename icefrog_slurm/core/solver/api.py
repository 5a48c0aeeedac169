"""One entry point for a round's IceShare decision: pick the solver, partition, fall back.

``method``: ``auto`` runs the fast solver (:mod:`.fast`) and, when it cannot prove stages
2-3 optimal, hands its answer as a warm start to the reference MIP (:mod:`.mip`) and keeps
the better; ``mip`` runs the reference alone (warm-started from the current allocation);
``fast`` never calls the MIP. With ``partition_gpus`` > 0 a cluster larger than that is
split (:mod:`.partition`) and the groups are solved in parallel by ``workers`` processes.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

from icefrog_slurm.core.solver.fast import solve_fast
from icefrog_slurm.core.solver.mip import solve_mip
from icefrog_slurm.core.solver.partition import merge, split
from icefrog_slurm.core.solver.problem import SCORE_SCALE, WAIT, Problem, Solution
from icefrog_slurm.errors import InputError

METHODS = ("auto", "mip", "fast")


@dataclass(frozen=True)
class SolveOptions:
    """How to solve a round.

    ``method``: auto | mip | fast (module docstring). ``time_limit_s``: the MIP's limit for
    one (sub)problem. ``partition_gpus``: 0 never splits; otherwise the target GPUs a group.
    ``workers``: processes solving groups at once (1 = in this process).
    ``fairness_floor``: stage 2 keeps the choices scoring at least this fraction of stage
    1's optimum (:func:`.problem.stage2_threshold`; 1: the paper's objective).
    """

    method: str = "auto"
    time_limit_s: float = 30.0
    partition_gpus: int = 0
    workers: int = 1
    fairness_floor: float = 1.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"solver: must be one of {', '.join(METHODS)}, got {self.method}")
        if self.time_limit_s <= 0 or self.partition_gpus < 0 or self.workers < 1:
            raise InputError("solver: time limit > 0, partition_gpus >= 0, workers >= 1")
        if not 0 < self.fairness_floor <= 1:
            raise InputError(f"solver: fairness_floor must be in (0, 1], got {self.fairness_floor}")


def picks_of(solution: Solution) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A solution as (choice index per job, shared pairs): the form of a warm start."""
    picks = {jid: c.index for jid, c in solution.choices.items()}
    pairs = sorted(
        {(a, c.partner) for a, c in solution.choices.items() if c.partner and a < c.partner}
    )
    return picks, pairs


def _rank(s: Solution) -> tuple[float, int]:
    """Stages 2 and 3 of two answers held to the same stage-2 threshold."""
    return (s.sum_share, -s.changes)


def solve_one(problem: Problem, settings: SolveOptions) -> Solution:
    """Solve ``problem`` whole (no partitioning) with ``settings.method``."""
    floor = settings.fairness_floor
    if settings.method == "mip":
        return solve_mip(problem, time_limit_s=settings.time_limit_s, fairness_floor=floor)
    fast = solve_fast(problem, fairness_floor=floor)
    if settings.method == "fast" or fast.status == "optimal":
        return fast
    exact = solve_mip(
        problem,
        time_limit_s=settings.time_limit_s,
        start=picks_of(fast),
        threshold=round(fast.floor_share * SCORE_SCALE),
    )
    best = max((exact, fast), key=_rank)
    if exact.status == "optimal" and _rank(exact) == _rank(best):
        return exact
    return best


Memo = dict[Problem, Solution]


def solve(
    problem: Problem, settings: SolveOptions | None = None, memo: Memo | None = None
) -> Solution:
    """A round's decision: each job exactly one choice (wait, k GPUs or a shared GPU).

    ``memo``: solutions of (sub)problems already solved this round. Placement retries
    forbid options of a few jobs and solve again; with partitions, only the groups whose
    jobs or forbidden options changed are solved again, the others come from the memo."""
    settings = settings or SolveOptions()
    parts = split(problem, settings.partition_gpus) if settings.partition_gpus else [problem]
    memo = {} if memo is None else memo
    todo = [p for p in dict.fromkeys(parts) if p not in memo]
    if settings.workers == 1 or len(todo) <= 1:
        memo.update((p, solve_one(p, settings)) for p in todo)
    else:
        with ProcessPoolExecutor(max_workers=min(settings.workers, len(todo))) as pool:
            solved = pool.map(partial(solve_one, settings=settings), todo)
            memo.update(zip(todo, solved, strict=True))
    return memo[problem] if len(parts) == 1 else merge(problem, [memo[p] for p in parts])


def waiting(solution: Solution) -> list[str]:
    """The ids of the jobs told to wait."""
    return [jid for jid, c in solution.choices.items() if c.index == WAIT]
