"""The frozen penalty psi (spec section 5, eq 3) and the progress accounting built on it.

A job keeps one gradient-variance value per layer (``v``): for a layer that is frozen now,
the variance it had when it was frozen; for a trainable layer, the latest value. Freezing
the first ``l`` layers then costs

    F = sum(v[:l])   (the optimisation signal skipped since the freeze, sigma^2_t0[1:l])
    S = sum(v[l:])   (the signal still trained, sigma^2_t[l+1:L])
    psi(l) = S / (F + S) = sum(v[l:]) / sum(v)

For ``l`` deeper than the current freeze the layers ``frozen_now..l-1`` would be frozen now,
so their latest value is their freeze-time value; for ``l`` shallower the layers would be
thawed and their freeze-time value is the best estimate of their current one. Both cases
give the same ``sum(v[l:]) / sum(v)``.

Limits (documented in docs/reference.md, "Frozen penalty"):

- a negative, NaN or infinite variance is an :class:`InputError` naming ``grad_var[i]``;
- nothing frozen (``l = 0``) gives psi = 1 exactly;
- all variances zero (no signal measured yet) gives psi = 1: there is nothing to lose;
- ``S = 0`` with ``F > 0`` (the trainable suffix has stopped moving) would give psi = 0 and
  infinite extra iterations; psi is floored at :data:`PSI_FLOOR` so the accounting stays
  finite while the Layer Tuner still sees such a configuration as nearly worthless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from icefrog_slurm.errors import InputError

PSI_FLOOR = 1e-3
"""The smallest psi returned: ``S = 0 < F`` gives this instead of 0 (1/psi - 1 = 999)."""


def check_variances(values: Sequence[float], name: str = "grad_var") -> tuple[float, ...]:
    """The per-layer variances as floats; negative, NaN or infinite ones are an InputError."""
    out = tuple(float(v) for v in values)
    if not out:
        raise InputError(f"{name}: needs one value a layer, got none")
    for i, v in enumerate(out):
        if not math.isfinite(v) or v < 0:
            raise InputError(f"{name}[{i}]: a variance must be a finite number >= 0, got {v!r}")
    return out


def frozen_penalty(frozen_var: float, trainable_var: float) -> float:
    """psi = S / (F + S) (eq 3), with F the frozen prefix's summed variance at freeze time
    and S the trainable suffix's summed current variance.

    F = 0 (nothing frozen or a silent prefix) gives 1; F = S = 0 gives 1; S = 0 < F gives
    :data:`PSI_FLOOR`. Negative or non-finite inputs are an InputError.
    """
    for name, value in (("frozen variance", frozen_var), ("trainable variance", trainable_var)):
        if not math.isfinite(value) or value < 0:
            raise InputError(f"{name}: must be a finite number >= 0, got {value!r}")
    return _penalty(frozen_var, trainable_var)


def _penalty(frozen_var: float, trainable_var: float) -> float:
    """:func:`frozen_penalty` of values known to be finite and >= 0."""
    if frozen_var == 0:
        return 1.0
    if trainable_var == 0:
        return PSI_FLOOR
    return max(PSI_FLOOR, trainable_var / (frozen_var + trainable_var))


@dataclass(frozen=True)
class PenaltyTable:
    """psi(l) for every frozen-prefix length l = 0..L of one job's per-layer variances.

    ``grad_var[i]``: layer i's variance, taken when it was frozen for a frozen layer and the
    latest value for a trainable one (module docstring).
    """

    grad_var: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "grad_var", check_variances(self.grad_var))

    @property
    def num_layers(self) -> int:
        return len(self.grad_var)

    def psi(self, frozen: int) -> float:
        """psi(l) = sum(v[l:]) / sum(v) = S / (F + S) (eq 3), limits as in the module doc."""
        return self.psis((frozen,))[0]

    def psis(self, frozen: Sequence[int]) -> list[float]:
        """:meth:`psi` of each frozen count, checked once (the Layer Tuner's candidates)."""
        v, n = self.grad_var, self.num_layers
        for k in frozen:
            if not 0 <= k <= n:
                raise InputError(f"frozen: {k} is outside 0..{n}")
        # sums of finite values >= 0 (checked when made) are finite: fsum raises on overflow
        return [_penalty(math.fsum(v[:k]), math.fsum(v[k:])) for k in frozen]


def extra_iterations(psi: float, remaining_iterations: float) -> float:
    """Iterations to add to make up for the frozen prefix: (1/psi - 1) x remaining (eq 3).

    E.g. psi = 0.8 and 1000 full-model-equivalent iterations left: 250 more, 1250 in all.
    """
    _check_psi(psi)
    if remaining_iterations < 0 or not math.isfinite(remaining_iterations):
        raise InputError(f"remaining: must be a finite number >= 0, got {remaining_iterations!r}")
    return (1.0 / psi - 1.0) * remaining_iterations


def effective_progress(psi: float, throughput: float) -> float:
    """E = psi(l) x T(a, s, m, l) (eq 2): full-model-equivalent samples a second."""
    _check_psi(psi)
    return psi * throughput


@dataclass(frozen=True)
class RemainingWork:
    """P, the full-model-equivalent samples still to train (spec section 4, eq 1).

    P starts at ``max_epochs x samples_per_epoch``; a sample trained under penalty psi
    advances it by psi samples. P never goes below 0.
    """

    samples: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.samples) or self.samples < 0:
            raise InputError(f"remaining samples: must be a finite number >= 0, got {self.samples}")

    @classmethod
    def start(cls, *, max_epochs: int, samples_per_epoch: int) -> RemainingWork:
        """P_0 = max_epochs x samples_per_epoch."""
        if max_epochs < 1:
            raise InputError(f"max_epochs: must be >= 1, got {max_epochs}")
        if samples_per_epoch < 1:
            raise InputError(f"samples_per_epoch: must be >= 1, got {samples_per_epoch}")
        return cls(float(max_epochs) * float(samples_per_epoch))

    def advance(self, *, samples: float, psi: float) -> RemainingWork:
        """P' = max(0, P - psi x samples): ``samples`` trained under penalty ``psi``."""
        _check_psi(psi)
        if not math.isfinite(samples) or samples < 0:
            raise InputError(f"samples: must be a finite number >= 0, got {samples!r}")
        return RemainingWork(max(0.0, self.samples - psi * samples))

    @property
    def done(self) -> bool:
        return self.samples <= 0.0


def _check_psi(psi: float) -> None:
    if not (0.0 < psi <= 1.0):
        raise InputError(f"psi: must be within (0, 1], got {psi!r}")
