"""The controller's own IceShare rounds checked against CBC: a simulation in which every
whole (sub)problem the ``auto`` solver answers is solved again by the reference MIP.

    .venv/bin/icefrog trace sample --load 1 --seed 1 --jobs 120 --out W.csv
    .venv/bin/python -m benchmarks.solver_shadow --workload W.csv --gpus 48 --seed 1 \\
        --batch paper --policy icefrog --out OUT

The arguments are ``icefrog simulate``'s. Prints the number of ``auto`` solves, how many
the fast path answered alone (proven optimal, no CBC), and how many differ from CBC's
proven optimum in (min share, sum of shares, changes): 0 unless the solver is wrong. The
simulation's own results are unchanged by the check (the MIP's answer is only compared).
"""

from __future__ import annotations

import sys

from icefrog_slurm.cli import main as icefrog
from icefrog_slurm.core.solver import Problem, Solution, SolveOptions, api
from icefrog_slurm.core.solver.mip import solve_mip


def objective(problem: Problem, sol: Solution) -> tuple[int, int, int]:
    scores = [j.score(sol.choices[j.id].index) for j in problem.jobs]
    return (min(scores, default=0), sum(scores), -sol.changes)


def main() -> int:
    counts = {"auto solves": 0, "fast path alone": 0, "differ from CBC": 0, "CBC unproven": 0}
    real = api.solve_one

    def checked(problem: Problem, settings: SolveOptions) -> Solution:
        sol = real(problem, settings)
        if settings.method == "auto" and problem.jobs:
            ref = solve_mip(problem, time_limit_s=60)
            counts["auto solves"] += 1
            counts["fast path alone"] += sol.solver == "fast"
            if ref.status != "optimal":
                counts["CBC unproven"] += 1
            elif objective(problem, ref) != objective(problem, sol):
                counts["differ from CBC"] += 1
        return sol

    api.solve_one = checked
    try:
        return icefrog(["simulate", *sys.argv[1:]])
    finally:
        print(", ".join(f"{k}: {v}" for k, v in counts.items()))


if __name__ == "__main__":
    sys.exit(main())
