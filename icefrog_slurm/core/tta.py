"""Time-to-accuracy and IceShare (spec sections 4, 9 and 10; eq 1, 16, 17).

- T_acc = T_age + P / E (eq 1): the predicted time from submission to the target metric,
  with T_age the seconds since submission (waiting included), P the remaining
  full-model-equivalent samples and E the effective progress (samples a second).
- For a candidate GPU count a, the scheduler uses the tuner's best E (eq 16):
  T_acc(a) = T_age + P / max_{m,l} E(a, s, m, l).
- IceShare(a) = min_{a'} T_acc(a') / T_acc(a) (eq 17): 1 for the job's best option,
  smaller the further an option falls short of the job's own potential.
- P itself (:func:`remaining_work`): the declared budget minus the effective samples done
  until the job's validation metric has a few reports, then what a learning curve fitted
  to them says is left to the target; never below a fraction of the work done while the
  target is not reached.
- Whether the metric has stalled (:func:`stalled`): no better over the last epochs than
  before them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from icefrog_slurm.errors import InputError

FloatArray = npt.NDArray[np.float64]

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


MIN_METRIC_POINTS = 4
"""Validation reports a learning-curve fit needs before it replaces the declared budget."""

FIT_AFTER_BUDGET_FRACTION = 0.5
"""The fraction of its declared budget a job has done before its learning curve is used."""

MAX_METRIC_POINTS = 64
"""A fit reads at most this many reports, evenly spread over the job's history."""

MIN_REMAINING_FRACTION = 0.1
"""A job short of its target has at least this fraction of the work it has done left."""

MAX_REMAINING_BUDGETS = 2.0
"""A fitted remaining work is capped at this many declared budgets."""

_ASYMPTOTES = np.geomspace(1e-3, 10.0, 48)  # a - max(y) over the span of y, the fit's grid


def remaining_work(
    *,
    budget: float,
    done: float,
    samples_done: float,
    samples_per_epoch: int,
    metrics: Sequence[tuple[int, float]],
    target: float,
    higher_is_better: bool,
) -> float:
    """P: the full-model-equivalent samples left to the target (eq 1's numerator).

    ``budget`` is the job's declared work (max epochs x samples per epoch), ``done`` its
    effective samples done, ``samples_done`` its physical samples, ``metrics`` its validation
    reports (epoch, value) of the target metric. Until :data:`FIT_AFTER_BUDGET_FRACTION` of
    the budget is done, or with fewer than :data:`MIN_METRIC_POINTS` reports, P is the
    declared ``budget - done`` (an early learning-curve fit extrapolates too far to trust).
    Then it comes from a learning curve fitted to the metric against effective samples
    (:func:`fit_learning_curve`, the saturating form Optimus fits to a job's loss): the
    samples at which the curve reaches the target minus ``done``, at most
    :data:`MAX_REMAINING_BUDGETS` budgets; still the declared remainder when the fitted
    curve never reaches the target. Either way P is at least
    :data:`MIN_REMAINING_FRACTION` of ``done``: a job that has not reached its target
    still has work left, so its options do not all look alike once its budget is spent.
    """
    for name, value in (("budget", budget), ("done", done), ("samples_done", samples_done)):
        if not (math.isfinite(value) and value >= 0):
            raise InputError(f"{name}: must be a finite number >= 0, got {value}")
    declared = max(0.0, budget - done)
    floor = MIN_REMAINING_FRACTION * done
    if done < FIT_AFTER_BUDGET_FRACTION * budget:
        return max(declared, floor)
    at = _metric_points(metrics, samples_per_epoch, done / samples_done if samples_done else 1.0)
    if at is None:
        return max(declared, floor)
    reach = fit_learning_curve(at[0], at[1], target=target, higher_is_better=higher_is_better)
    if reach is None:
        return max(declared, floor)
    return max(min(reach - done, MAX_REMAINING_BUDGETS * budget), floor)


def stalled(metrics: Sequence[tuple[int, float]], *, patience: int, higher_is_better: bool) -> bool:
    """Whether a job's validation metric has stopped improving: the best of its reports of
    the last ``patience`` epochs is no better than the best before them (early stopping's
    patience). ``metrics``: (epoch, value), the latest report of an epoch counts; epochs
    below 1 and values that are not finite are ignored. False with ``patience`` <= 0 or
    fewer than ``2 x patience`` epochs reported (too short a history to judge)."""
    if patience <= 0:
        return False
    by_epoch = _by_epoch(metrics)
    if len(by_epoch) < 2 * patience:
        return False
    sign = 1.0 if higher_is_better else -1.0
    last = max(by_epoch)
    recent = max(sign * v for e, v in by_epoch.items() if e > last - patience)
    before = [sign * v for e, v in by_epoch.items() if e <= last - patience]
    return bool(before) and recent <= max(before)


def _by_epoch(metrics: Sequence[tuple[int, float]]) -> dict[int, float]:
    """The usable reports by epoch: epoch >= 1, a finite value, the latest report of an
    epoch."""
    return {epoch: value for epoch, value in metrics if epoch >= 1 and math.isfinite(value)}


def _metric_points(
    metrics: Sequence[tuple[int, float]], samples_per_epoch: int, ratio: float
) -> tuple[FloatArray, FloatArray] | None:
    """(effective samples, value) of the usable reports: epoch >= 1, a finite value, the
    latest report of an epoch; the epochs' samples scaled by the job's effective/physical
    ratio so far. None with fewer than MIN_METRIC_POINTS."""
    by_epoch = _by_epoch(metrics)
    if len(by_epoch) < MIN_METRIC_POINTS:
        return None
    epochs = sorted(by_epoch)
    if len(epochs) > MAX_METRIC_POINTS:
        pick = np.unique(np.linspace(0, len(epochs) - 1, MAX_METRIC_POINTS).round().astype(int))
        epochs = [epochs[i] for i in pick]
    y = np.array([by_epoch[e] for e in epochs], dtype=float)
    if math.isfinite(float(epochs[-1]) * samples_per_epoch * ratio):  # the largest x
        return np.array(epochs, dtype=float) * samples_per_epoch * ratio, y
    with np.errstate(over="ignore"):  # a reported ratio near the float limit: inf, dropped
        x = np.array(epochs, dtype=float) * samples_per_epoch * ratio
    finite = np.isfinite(x)
    if int(finite.sum()) < MIN_METRIC_POINTS:
        return None
    return x[finite], y[finite]


def fit_learning_curve(
    x: FloatArray, y: FloatArray, *, target: float, higher_is_better: bool
) -> float | None:
    """Fit ``y = a - 1 / (b x + c)`` (``a + 1 / (b x + c)`` when lower is better; b > 0)
    by least squares, and return the x at which it reaches ``target``; None when the fitted
    curve never does (its asymptote falls short) or no fit rises toward the target.

    The asymptote a is searched on a grid beyond the best value seen; for each a the curve
    is linear in (b, c) after 1 / (a - y), so one least-squares solve a grid point."""
    sign = 1.0 if higher_is_better else -1.0
    ys, goal = sign * np.asarray(y, dtype=float), sign * target
    xs = np.asarray(x, dtype=float)
    top = float(ys.max())
    span = float(top - ys.min()) or abs(top) or 1.0
    a = top + span * _ASYMPTOTES  # (na,)
    z = 1.0 / (a[:, None] - ys[None, :])  # (na, n), finite: a > every y
    design = np.stack([xs, np.ones_like(xs)], axis=1)  # (n, 2)
    coef = np.linalg.lstsq(design, z.T, rcond=None)[0]  # (2, na)
    b, c = coef[0], coef[1]
    lin = b[:, None] * xs[None, :] + c[:, None]
    ok = (b > 0) & np.all(lin > 0, axis=1)
    if not ok.any():
        return None
    with np.errstate(divide="ignore"):
        pred = a[:, None] - 1.0 / np.where(lin > 0, lin, np.inf)
    sse = np.where(ok, ((pred - ys[None, :]) ** 2).sum(axis=1), np.inf)
    i = int(np.argmin(sse))
    if a[i] <= goal:
        return None
    return float((1.0 / (a[i] - goal) - c[i]) / b[i])
