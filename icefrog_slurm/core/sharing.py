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

Utilisation is a fraction 0..1 (``ProfileSample.gpu_util``): the share of the time the
GPU runs the job's kernels, as NVML's ``utilization.gpu`` reports it on a GPU (the launcher's
profiler) and as the simulator's profiler reports its truth's busy share. Memory is in bytes
(any unit works as long as the GPU capacity uses the same).

What the admission rule compares (:func:`credited_util`): a job's utilisation times the
speed the solver credits a shared job with (lambda). Kernels of jobs sharing a GPU take
turns (time slicing: Slurm's shards, and MPS once the GPU's compute is full), so a pair
whose utilisations sum to S runs each at about 1 / max(1, S) of its own speed: the pair
keeps the credited lambda iff ``sum(lambda x util) <= 1``. With lambda = 1 this is eq 8's
``sum(util) <= 100 %`` word for word; with the paper's lambda < 1 it admits the pairs that
keep the speed the solver counts on (``docs/method.md``, "Sharing";
``benchmarks/sharing_admission.py`` prints the rule against the simulator's pairs).

The shared option picks its own (batch, depth): the Layer Tuner's best goodput x psi at
lambda over :func:`shared_throughput`, the configurations that fit one job's part of a
GPU, so any two shared options are admissible together. A job with no measurement yet
can be judged from its declared tables (:class:`DeclaredLoad`; the policy's
``sharing.before_samples``), so a waiting job may start on a shared GPU; its first
samples replace the prior the next round, and the eviction check (``controller/tick.py``)
moves it off an unstable pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.tuner import FloatArray
from icefrog_slurm.errors import InputError

DEFAULT_MEMORY_SAFETY = 1.1
DEFAULT_SHARED_LAMBDA = 0.9

PRIOR_UTIL = 0.5
"""Utilisation assumed for a job that has measured none: half a GPU (its first samples
replace it)."""
PRIOR_CONTEXT_BYTES = 1.6e9
"""Peak memory of a job besides its tensors (CUDA context, allocator reserve)."""
PRIOR_ACTIVATION_BYTES_PER_FLOP = 0.02
"""Activation bytes a sample keeps for the backward pass per forward FLOP of the model: three
times what ResNet-18's saved feature maps need on 32x32 inputs (about 6.4 MB for 1.1
GFLOPs, fp32), to err toward too much memory."""


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
    (1, m, theta, omega). A feature the samples never varied gets coefficient 0 (the
    intercept holds its effect): the samples say nothing about it, and a minimum-norm
    solution would otherwise share the target out onto it, e.g. samples of one batch
    size predicting a quarter of their utilisation at half that batch."""
    return _fit_linear(features, [targets])[0]


def _fit_linear(
    features: Sequence[tuple[float, float, float]], targets: Sequence[Sequence[float]]
) -> list[LinearRegression]:
    """:func:`fit_linear` of each of ``targets`` on the same features (one design)."""
    if not features or any(len(features) != len(t) for t in targets):
        raise InputError(
            f"fit_linear: {len(features)} feature rows for "
            f"{' / '.join(str(len(t)) for t in targets)} targets"
        )
    design = np.array([(1.0, *row) for row in features], dtype=float)
    varied = design.max(axis=0) - design.min(axis=0) > 1e-12 * np.maximum(
        1.0, np.abs(design).max(axis=0)
    )
    varied[0] = True
    design = design[:, varied]
    out = []
    for y in targets:
        coef = np.zeros(4)
        coef[varied], *_ = np.linalg.lstsq(design, np.asarray(y, dtype=float), rcond=None)
        c0, c1, c2, c3 = (float(c) for c in coef)
        out.append(LinearRegression((c0, c1, c2, c3)))
    return out


@dataclass(frozen=True)
class Load:
    """A job's predicted footprint on one GPU: utilisation (0..1) and peak memory."""

    util: float
    memory: float


class LoadModel(Protocol):
    """Predicts a configuration's load on one GPU: the fitted regressions or the prior."""

    def predict(self, *, batch: int, frozen: int, layers: LayerTable) -> Load: ...

    def predict_grid(
        self, *, batches: Sequence[int], frozen: Sequence[int], layers: LayerTable
    ) -> tuple[FloatArray, FloatArray]:
        """(utilisation, memory) arrays, one row a batch and one column a frozen count."""
        ...


def _grid_features(
    batches: Sequence[int], frozen: Sequence[int], layers: LayerTable
) -> tuple[FloatArray, FloatArray, FloatArray]:
    theta, omega = layers.fractions
    k = np.asarray(frozen, dtype=np.int64)
    m = np.asarray(batches, dtype=float)[:, None]
    return m, theta[k][None, :], omega[k][None, :]


@dataclass(frozen=True)
class SharingPredictor:
    """Predicts a configuration's GPU utilisation and peak memory (eq 8's regressions)."""

    util: LinearRegression  # theta_util
    memory: LinearRegression  # theta_mry
    batches: tuple[float, float] = (0.0, math.inf)  # the measured per-GPU batch range

    def predict(self, *, batch: int, frozen: int, layers: LayerTable) -> Load:
        """Predicted (utilisation, memory), each clipped at 0 (a regression may undershoot)."""
        x = {"batch": float(batch), "theta": layers.theta(frozen), "omega": layers.omega(frozen)}
        return Load(util=max(0.0, self.util(**x)), memory=max(0.0, self.memory(**x)))

    def predict_grid(
        self, *, batches: Sequence[int], frozen: Sequence[int], layers: LayerTable
    ) -> tuple[FloatArray, FloatArray]:
        """:meth:`predict` over a grid of batches x frozen counts, in one go; a batch outside
        the measured range is not judged (utilisation and memory inf): memory grows with
        the batch, and a regression of one batch size cannot say how fast."""
        m, theta, omega = _grid_features(batches, frozen, layers)
        out = []
        for reg in (self.util, self.memory):
            c0, c1, c2, c3 = reg.coef
            out.append(np.maximum(0.0, c0 + c1 * m + c2 * theta + c3 * omega))
        lo, hi = self.batches
        outside = (m < lo) | (m > hi)
        return np.where(outside, math.inf, out[0]), np.where(outside, math.inf, out[1])


@dataclass(frozen=True)
class DeclaredLoad:
    """A job's load judged from its declared layer tables alone, before it measured any:
    utilisation ``util`` (:data:`PRIOR_UTIL`); peak memory = context + the weights, and
    gradients and two optimiser states of the trainable share omega_l, + activations of
    :data:`PRIOR_ACTIVATION_BYTES_PER_FLOP` per forward FLOP of a sample (all layers:
    freezing is not counted on to save any)."""

    util: float = PRIOR_UTIL

    def predict(self, *, batch: int, frozen: int, layers: LayerTable) -> Load:
        weights = math.fsum(layers.param_bytes)
        acts = PRIOR_ACTIVATION_BYTES_PER_FLOP * math.fsum(layers.flops) * batch
        memory = PRIOR_CONTEXT_BYTES + weights * (1 + 3 * layers.omega(frozen)) + acts
        return Load(util=self.util, memory=memory)

    def predict_grid(
        self, *, batches: Sequence[int], frozen: Sequence[int], layers: LayerTable
    ) -> tuple[FloatArray, FloatArray]:
        m, _, omega = _grid_features(batches, frozen, layers)
        weights = math.fsum(layers.param_bytes)
        acts = PRIOR_ACTIVATION_BYTES_PER_FLOP * math.fsum(layers.flops) * m
        memory = PRIOR_CONTEXT_BYTES + weights * (1 + 3 * omega) + acts
        return np.full(memory.shape, self.util), memory


def credited_util(util: float, lam: float) -> float:
    """The utilisation the admission rule sums: ``lam x util``, the share of the GPU's time
    the job needs to run at the speed ``lam`` the solver credits it with (module doc)."""
    return lam * util


def shared_throughput(
    *,
    batch_sizes: Sequence[int],
    frozen_candidates: Sequence[int],
    throughput: FloatArray,
    loads: LoadModel,
    layers: LayerTable,
    lam: float,
    gpu_memory: float,
    memory_safety: float = DEFAULT_MEMORY_SAFETY,
    jobs_per_gpu: int = 2,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """What the shared option is tuned on (module docstring): the throughput grid with 0
    where the predicted load does not fit one job's part of a GPU (credited utilisation
    ``lam`` x util <= 1 / ``jobs_per_gpu`` and memory x ``memory_safety`` <=
    ``gpu_memory`` / ``jobs_per_gpu``, so that any such options of two jobs are admissible
    together), and the predicted utilisation and memory grids."""
    if jobs_per_gpu < 1:
        raise InputError(f"jobs_per_gpu: must be >= 1, got {jobs_per_gpu}")
    util, memory = loads.predict_grid(batches=batch_sizes, frozen=frozen_candidates, layers=layers)
    part = 1.0 / jobs_per_gpu
    fits = (lam * util <= part + 1e-12) & (memory * memory_safety <= gpu_memory * part)
    return np.where(fits, throughput, 0.0), util, memory


def fit_sharing(samples: Sequence[ProfileSample], layers: LayerTable) -> SharingPredictor | None:
    """Fit both regressions to the samples that measured utilisation (>= 0) and peak memory
    (> 0); None when there is none (the job cannot be judged, so it is not shared)."""
    usable = [s for s in samples if s.gpu_util >= 0 and s.peak_mem_bytes > 0]
    if not usable:
        return None
    features = [(float(s.batch), layers.theta(s.frozen), layers.omega(s.frozen)) for s in usable]
    util, memory = _fit_linear(
        features, [[s.gpu_util for s in usable], [s.peak_mem_bytes for s in usable]]
    )
    return SharingPredictor(
        util=util, memory=memory, batches=(min(x[0] for x in features), max(x[0] for x in features))
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
