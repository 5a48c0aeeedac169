"""IceShare: the max-min allocation of GPUs to jobs each scheduling round (spec section 10).

:mod:`.problem` (types and semantics), :mod:`.fast` (exact threshold search + DP),
:mod:`.mip` (the python-mip reference), :mod:`.matching` (shared pairs),
:mod:`.partition` (large clusters), :mod:`.aging` (starvation), :mod:`.api` (``solve``).
"""

from icefrog_slurm.core.solver.aging import aged_weight
from icefrog_slurm.core.solver.api import Memo, SolveOptions, picks_of, solve, solve_one
from icefrog_slurm.core.solver.problem import (
    WAIT,
    Choice,
    Cluster,
    Holding,
    JobRequest,
    Option,
    Problem,
    Solution,
    check_solution,
)

__all__ = [
    "WAIT",
    "Choice",
    "Cluster",
    "Holding",
    "JobRequest",
    "Memo",
    "Option",
    "Problem",
    "Solution",
    "SolveOptions",
    "aged_weight",
    "check_solution",
    "picks_of",
    "solve",
    "solve_one",
]
