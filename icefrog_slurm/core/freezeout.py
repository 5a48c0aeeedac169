"""FreezeOut's progressive freezing schedule (Brock et al., arXiv:1706.04983), tuned by
effective progress: the baselines' "+" (spec section 12) and ICEFROG's ablation (spec
section 15, "frozen penalty -> tuned FreezeOut").

FreezeOut gives each freezable layer i (0 = the input end, of L) a freeze point in training
progress (0..1 of the job's iterations):

    t_i = s(t_0 + (1 - t_0) x i / (L - 1)),   s(x) = x (linear) or x**3 (cubic)

so the first layer freezes at s(t_0) and the last at s(1) = 1 (never, in effect). A layer is
frozen once progress has passed its t_i; since t_i grows with i the frozen layers are always
a prefix, and their number only grows with progress (the schedule is monotone). It is capped
at ``cap`` (at most the job's largest allowed frozen count) and rounded down to a legal
boundary.

``tune_freezeout`` picks (t_0, scaling, cap) once per job: the schedule whose predicted time
to the target, the full-model work integrated over progress at the effective progress E(l) =
psi(l) x T(a, m, l) of its depth there (eq 2), best batch m, is smallest. ``a`` is the job's
requested GPU count; psi and T come from the caller (the same estimator ICEFROG uses). The
cap is a tuned hyperparameter too: uncapped, FreezeOut ends with all but the last layer
frozen, which no E-based tuning of t_0 alone can make worthwhile for a job whose deep
layers cost most of its progress.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from icefrog_slurm.errors import InputError

Scaling = Literal["linear", "cubic"]
SCALINGS: tuple[Scaling, ...] = ("linear", "cubic")
T0_GRID: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""The t_0 values the tuning tries (FreezeOut's paper sweeps 0.5-0.9 for its CIFAR nets)."""


@dataclass(frozen=True)
class FreezeOut:
    """One FreezeOut schedule: ``t_0`` in (0, 1], its scaling, and the most layers it
    freezes (None: as many as the job allows)."""

    t0: float
    scaling: Scaling = "cubic"
    cap: int | None = None

    def __post_init__(self) -> None:
        if not (0.0 < self.t0 <= 1.0 and math.isfinite(self.t0)):
            raise InputError(f"freezeout t_0: must be within (0, 1], got {self.t0!r}")
        if self.scaling not in SCALINGS:
            raise InputError(f"freezeout scaling: {self.scaling!r} is not one of {SCALINGS}")
        if self.cap is not None and self.cap < 0:
            raise InputError(f"freezeout cap: must be >= 0, got {self.cap}")

    def freeze_points(self, num_layers: int) -> tuple[float, ...]:
        """t_i for i = 0..L-1 (module docstring); non-decreasing in i, the last is 1."""
        if num_layers < 1:
            raise InputError(f"layers: need at least one, got {num_layers}")
        span = max(num_layers - 1, 1)
        out = []
        for i in range(num_layers):
            x = self.t0 + (1.0 - self.t0) * i / span if num_layers > 1 else 1.0
            out.append(x**3 if self.scaling == "cubic" else x)
        return tuple(out)

    def frozen(self, progress: float, candidates: Sequence[int], num_layers: int) -> int:
        """Layers frozen at ``progress``: the largest legal count in ``candidates`` (the
        job's allowed frozen counts, up to its cap) that is at most ``cap`` and whose
        layers have all passed their freeze point."""
        passed = bisect.bisect_right(self.freeze_points(num_layers), progress)
        if self.cap is not None:
            passed = min(passed, self.cap)
        return max((k for k in candidates if k <= passed), default=0)


def tune_freezeout(
    *,
    candidates: Sequence[int],
    num_layers: int,
    effective_progress: Callable[[int], float],
    start: float = 0.0,
    steps: int = 200,
    grid: Iterable[float] = T0_GRID,
) -> FreezeOut | None:
    """The (t_0, scaling, cap) whose predicted time from progress ``start`` to 1 is
    smallest: the sum over ``steps`` equal slices of the work of slice / E(depth at the
    slice), with ``effective_progress(l)`` = max over batches of psi(l) x T(a, m, l) at the
    requested GPU count. The first of equals wins: the smaller cap, then linear, then the
    later t_0 (less freezing). None when E(0) is not positive."""
    if not 0.0 <= start <= 1.0:
        raise InputError(f"freezeout start: must be within [0, 1], got {start!r}")
    if steps < 1:
        raise InputError(f"freezeout steps: must be >= 1, got {steps}")
    rates: dict[int, float] = {}

    def rate(frozen: int) -> float:
        if frozen not in rates:
            rates[frozen] = effective_progress(frozen)
        return rates[frozen]

    if not rate(0) > 0:
        return None
    best: tuple[float, FreezeOut] | None = None
    width = (1.0 - start) / steps
    slices = [start + (s + 0.5) * width for s in range(steps)]
    for cap in sorted(set(candidates)):
        for scaling in SCALINGS:
            for t0 in sorted(set(grid), reverse=True):
                sched = FreezeOut(t0, scaling, cap)
                total = 0.0
                for p in slices:
                    e = rate(sched.frozen(p, candidates, num_layers))
                    total += width / e if e > 0 else math.inf
                if best is None or total < best[0] * (1 - 1e-9):  # strict: first of equals
                    best = (total, sched)
    return None if best is None else best[1]
