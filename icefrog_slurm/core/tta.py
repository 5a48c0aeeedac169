"""Time-to-accuracy and IceShare (spec sections 4, 9 and 10; eq 1, 16, 17).

- T_acc = T_age + P / E (eq 1): the predicted time from submission to the target metric,
  with T_age the seconds since submission (waiting included), P the remaining
  full-model-equivalent samples and E the effective progress (samples a second).
- For a candidate GPU count a, the scheduler uses the tuner's best E (eq 16):
  T_acc(a) = T_age + P / max_{m,l} E(a, s, m, l).
- IceShare(a) = min_{a'} T_acc(a') / T_acc(a) (eq 17): 1 for the job's best option,
  smaller the further an option falls short of the job's own potential.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import TypeVar

from icefrog_slurm.errors import InputError

K = TypeVar("K", bound=Hashable)


def time_to_accuracy(*, age_s: float, remaining: float, effective_progress: float) -> float:
    """T_acc = T_age + P / E (eq 1, eq 16 with E the tuner's max); E = 0 gives infinity
    (the option makes no progress)."""
    if not (math.isfinite(age_s) and age_s >= 0):
        raise InputError(f"age_s: must be a finite number >= 0, got {age_s}")
    if not (math.isfinite(remaining) and remaining >= 0):
        raise InputError(f"remaining: must be a finite number >= 0, got {remaining}")
    if not (effective_progress >= 0 and not math.isnan(effective_progress)):
        raise InputError(f"effective_progress: must be >= 0, got {effective_progress}")
    if remaining == 0:
        return age_s
    if effective_progress == 0:
        return math.inf
    return age_s + remaining / effective_progress


def iceshare(tta_by_option: Mapping[K, float]) -> dict[K, float]:
    """IceShare(a) = min_{a'} T_acc(a') / T_acc(a) (eq 17) for every option a.

    An option with T_acc = inf gets 0. At least one option must have a finite T_acc > 0.
    """
    if not tta_by_option:
        raise InputError("iceshare: needs at least one option")
    for key, value in tta_by_option.items():
        if math.isnan(value) or value <= 0:
            raise InputError(f"iceshare: T_acc of {key!r} must be > 0, got {value}")
    best = min(tta_by_option.values())
    if math.isinf(best):
        raise InputError("iceshare: no option makes progress (every T_acc is infinite)")
    return {key: best / value for key, value in tta_by_option.items()}
