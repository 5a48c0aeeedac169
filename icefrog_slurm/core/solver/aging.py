"""The weight-aging rule that keeps a waiting job from starving.

When not every job can run, stage 1 of IceShare is 0 and stage 2 maximizes
``sum_k w_k * IceShare_k``: a job that is costly for its share (a large request, a poor
speed-up) could wait forever behind cheaper ones. The controller therefore passes

    w_k = base_k * (1 + waited_k / rounds_per_step)

where ``waited_k`` counts every round job k has spent waiting since submission (it is
*not* reset when the job starts, so a job that just won its GPUs is not preempted at once
by the jobs it displaced). A waiting job's weight grows without bound while the weights of
running jobs stay fixed, so once ``w_k * IceShare_k`` exceeds the summed weights of the
jobs whose GPUs it needs (each share is at most 1), running k beats making it wait and the
solver starts it: with finitely many competitors, no job waits forever.
"""

from __future__ import annotations

from icefrog_slurm.errors import InputError


def aged_weight(base: float, waited_rounds: int, *, rounds_per_step: float = 4.0) -> float:
    """``w = base * (1 + waited_rounds / rounds_per_step)`` (see the module docstring)."""
    if base <= 0 or waited_rounds < 0 or rounds_per_step <= 0:
        raise InputError("aged_weight: base > 0, waited_rounds >= 0, rounds_per_step > 0")
    return base * (1.0 + waited_rounds / rounds_per_step)
