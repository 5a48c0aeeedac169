"""Fitting the SDP and PP/HP parameters (eq 9-13) to iteration-time samples.

Owns the sample type, the bounds of each parameter, the bounded least-squares fit
(``scipy.optimize.least_squares`` on relative residuals, a few seeded starts), the
absolute percentage error (APE) of a fitted model, and the synthetic samples the tests and
``benchmarks/parallel_fit.py`` fit to (known parameters, multiplicative noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, fields
from typing import TypeVar

import numpy as np
from scipy.optimize import least_squares

from icefrog_slurm.core.parallel import IterationModel, PipelineParams, SdpParams
from icefrog_slurm.errors import InputError

P = TypeVar("P", SdpParams, PipelineParams)


@dataclass(frozen=True)
class Sample:
    """One profiled configuration (a, m, l) and its measured iteration time."""

    gpus: int
    batch: int
    frozen: int
    seconds: float


# Bounds of every parameter: times and per-unit slopes >= 0, overlap exponents >= 1
# (1 = no overlap), gamma_flop within (0, 3] (< 1: sublinear, as measured in section 6).
_TIME_MAX = 1e4
_EXPONENTS = {"gamma_lm": (1.0, 20.0), "gamma": (1.0, 20.0), "gamma_flop": (0.05, 3.0)}


def bounds_of(cls: type[P]) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of each field of ``cls``, in field order."""
    names = [f.name for f in fields(cls)]
    lower = [_EXPONENTS.get(n, (0.0, _TIME_MAX))[0] for n in names]
    upper = [_EXPONENTS.get(n, (0.0, _TIME_MAX))[1] for n in names]
    return np.array(lower), np.array(upper)


def predict(model: IterationModel, samples: Sequence[Sample]) -> np.ndarray:
    return np.array(
        [model.iteration_time(gpus=s.gpus, batch=s.batch, frozen=s.frozen) for s in samples]
    )


def ape(model: IterationModel, samples: Sequence[Sample]) -> np.ndarray:
    """|T_pred - T_meas| / T_meas of each sample."""
    measured = np.array([s.seconds for s in samples])
    return np.asarray(np.abs(predict(model, samples) - measured) / measured)


def fit_params(
    build: Callable[[P], IterationModel],
    cls: type[P],
    samples: Sequence[Sample],
    *,
    starts: int = 4,
    seed: int = 0,
) -> P:
    """The parameters minimising sum((T_pred / T_meas - 1)^2) within :func:`bounds_of`.

    ``build`` turns a parameter set into a model. Starts: a scale-aware guess (every time
    term a tenth of the median sample, slopes per unit from it, exponents at 1), then
    ``starts - 1`` log-uniform draws around it from a seeded generator; the best wins.
    """
    if len(samples) < len(fields(cls)):
        raise InputError(
            f"samples: need >= {len(fields(cls))} to fit {cls.__name__}, got {len(samples)}"
        )
    measured = np.array([s.seconds for s in samples])
    if not np.all(np.isfinite(measured)) or np.any(measured <= 0):
        raise InputError("samples: every iteration time must be finite and > 0")
    lower, upper = bounds_of(cls)
    guess = _guess(cls, float(np.median(measured)), samples)
    rng = np.random.default_rng(seed)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.asarray(predict(build(cls(*x.tolist())), samples) / measured - 1.0)

    best: tuple[float, np.ndarray] | None = None
    for k in range(starts):
        x0 = guess if k == 0 else guess * np.exp(rng.uniform(-1.5, 1.5, guess.size))
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        result = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac")
        if best is None or result.cost < best[0]:
            best = (float(result.cost), result.x)
    assert best is not None
    return cls(*best[1].tolist())


def _guess(cls: type[P], typical: float, samples: Sequence[Sample]) -> np.ndarray:
    batch = max(float(np.median([s.batch for s in samples])), 1.0)
    gpus = max(float(np.median([s.gpus for s in samples])), 1.0)
    out = []
    for f in fields(cls):
        if f.name.startswith("gamma"):
            out.append(1.5 if f.name == "gamma_lm" else 1.0)
        elif f.name.startswith("alpha"):
            out.append(0.05 * typical)
        elif f.name in ("beta_ag", "beta_sync"):
            out.append(0.2 * typical / gpus)
        else:
            out.append(0.2 * typical / batch)
    return np.array(out)


def synthetic_samples(
    model: IterationModel,
    configs: Sequence[tuple[int, int, int]],
    *,
    noise: float,
    seed: int,
) -> list[Sample]:
    """Samples of ``model`` at (gpus, batch, frozen) ``configs``, each time multiplied by
    1 + u with u uniform in [-noise, noise] (seeded)."""
    rng = np.random.default_rng(seed)
    out = []
    for gpus, batch, frozen in configs:
        t = model.iteration_time(gpus=gpus, batch=batch, frozen=frozen)
        out.append(Sample(gpus, batch, frozen, t * (1.0 + float(rng.uniform(-noise, noise)))))
    return out


def split_held_back(
    samples: Sequence[Sample], *, fraction: float, seed: int
) -> tuple[list[Sample], list[Sample]]:
    """(fit set, held-back set): a seeded random ``fraction`` of the samples is held back."""
    order = np.random.default_rng(seed).permutation(len(samples))
    cut = len(samples) - max(1, math.floor(fraction * len(samples)))
    return [samples[i] for i in order[:cut]], [samples[i] for i in order[cut:]]


def params_vector(params: SdpParams | PipelineParams) -> tuple[float, ...]:
    return tuple(float(v) for v in astuple(params))
