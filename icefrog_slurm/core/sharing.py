"""The GPU-sharing predictor and its admission rule (spec section 8, eq 8).

ICEFROG does not predict the slowdown of each co-located pair; it classifies whether a pair
can share a GPU safely:

- two linear regressions (numpy least squares) on the features (1, m, theta_l, omega_l)
  predict a job's GPU utilisation (theta_util) and peak memory (theta_mry) from its per-GPU
  batch and freezing depth;
- a set of jobs may share one GPU iff ``sum(memory) x safety <= GPU memory`` (safety 1.1
  against OOM) and ``sum(utilisation) <= 1`` (100 %);
- eq 8: the sharing speed factor lambda is 1 when the job runs alone, ``shared_lambda``
  (0.9) for an admissible shared configuration, and 0 for an inadmissible one, meaning the
  shared branch is not selectable (not that exclusive training has zero throughput).

Utilisation is a fraction 0..1 (``ProfileSample.gpu_util``); memory is in bytes (any unit
works as long as the GPU capacity uses the same).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.errors import InputError

DEFAULT_MEMORY_SAFETY = 1.1
DEFAULT_SHARED_LAMBDA = 0.9


@dataclass(frozen=True)
class LinearRegression:
    """y = c0 + c1*m + c2*theta_l + c3*omega_l, fitted by least squares (eq 8's theta_util,
    theta_mry)."""

    coef: tuple[float, float, float, float]

    def __call__(self, *, batch: float, theta: float, omega: float) -> float:
        c0, c1, c2, c3 = self.coef
        return c0 + c1 * batch + c2 * theta + c3 * omega


def fit_linear(
    features: Sequence[tuple[float, float, float]], targets: Sequence[float]
) -> LinearRegression:
    """Least squares (numpy ``lstsq``; minimum-norm when under-determined) of targets on
    (1, m, theta, omega)."""
    if len(features) != len(targets) or not features:
        raise InputError(f"fit_linear: {len(features)} feature rows for {len(targets)} targets")
    design = np.array([(1.0, *row) for row in features], dtype=float)
    coef, *_ = np.linalg.lstsq(design, np.asarray(targets, dtype=float), rcond=None)
    c0, c1, c2, c3 = (float(c) for c in coef)
    return LinearRegression((c0, c1, c2, c3))


@dataclass(frozen=True)
class Load:
    """A job's predicted footprint on one GPU: utilisation (0..1) and peak memory."""

    util: float
    memory: float


@dataclass(frozen=True)
class SharingPredictor:
    """Predicts a configuration's GPU utilisation and peak memory (eq 8's regressions)."""

    util: LinearRegression  # theta_util
    memory: LinearRegression  # theta_mry

    def predict(self, *, batch: int, frozen: int, layers: LayerTable) -> Load:
        """Predicted (utilisation, memory), each clipped at 0 (a regression may undershoot)."""
        x = {"batch": float(batch), "theta": layers.theta(frozen), "omega": layers.omega(frozen)}
        return Load(util=max(0.0, self.util(**x)), memory=max(0.0, self.memory(**x)))


def fit_sharing(samples: Sequence[ProfileSample], layers: LayerTable) -> SharingPredictor | None:
    """Fit both regressions to the samples that measured utilisation (>= 0) and peak memory
    (> 0); None when there is none (the job cannot be judged, so it is not shared)."""
    usable = [s for s in samples if s.gpu_util >= 0 and s.peak_mem_bytes > 0]
    if not usable:
        return None
    features = [(float(s.batch), layers.theta(s.frozen), layers.omega(s.frozen)) for s in usable]
    return SharingPredictor(
        util=fit_linear(features, [s.gpu_util for s in usable]),
        memory=fit_linear(features, [s.peak_mem_bytes for s in usable]),
    )


def admissible(
    loads: Sequence[Load],
    *,
    gpu_memory: float,
    memory_safety: float = DEFAULT_MEMORY_SAFETY,
    max_util: float = 1.0,
) -> bool:
    """Jobs may share one GPU iff sum(memory) x safety <= gpu_memory and
    sum(util) <= max_util (100 %) (spec section 8)."""
    if not (gpu_memory > 0 and math.isfinite(gpu_memory)):
        raise InputError(f"gpu_memory: must be a finite number > 0, got {gpu_memory}")
    if memory_safety < 1:
        raise InputError(f"memory_safety: must be >= 1, got {memory_safety}")
    memory = math.fsum(x.memory for x in loads) * memory_safety
    util = math.fsum(x.util for x in loads)
    # A hair of tolerance so that e.g. 0.42 + 0.58 counts as exactly 100 %.
    return memory <= gpu_memory * (1 + 1e-12) and util <= max_util + 1e-12


def sharing_lambda(
    *, shared: bool, is_admissible: bool, shared_lambda: float = DEFAULT_SHARED_LAMBDA
) -> float:
    """lambda(s, m, l) (eq 8): 1 alone; ``shared_lambda`` (0.9) when shared and admissible;
    0 when shared and inadmissible (the shared branch is not selectable)."""
    if not 0 < shared_lambda <= 1:
        raise InputError(f"shared_lambda: must be within (0, 1], got {shared_lambda}")
    if not shared:
        return 1.0
    return shared_lambda if is_admissible else 0.0
