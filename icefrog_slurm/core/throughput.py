"""The DDP layer-aware throughput model (spec section 6, eq 4-7).

An iteration of data-parallel training on ``a`` GPUs with per-GPU batch ``m`` and the first
``l`` layers frozen is a forward pass, then a backward pass overlapped with the gradient
all-reduce. The model has two parts:

- the **unfrozen curves** (``l = 0``), fitted from profiles as in Pollux/AdaptDL's
  ``PerfParams``: forward and backward time linear in ``m`` (:class:`LinearCurve`) and the
  all-reduce time per GPU count and node count (:class:`SyncCurve`; one GPU has none);
- the **freezing parameters** (:class:`FreezeParams`): how backward shrinks with the
  unfrozen FLOPs share theta_l (eq 6), how the all-reduce shrinks with the unfrozen
  parameter-bytes share omega_l (eq 7), and the overlap exponent gamma (eq 5).

**l = 0 returns the unfrozen profile (spec section 16).** Eq 6 reads
``T_bwd(m,l) = alpha_flop + beta_flop * theta_l^gamma_flop * T_bwd(m,0)``; at theta = 1 it
must give T_bwd(m,0) back, which ties ``beta_flop = 1 - alpha_flop / T_bwd(m,0)`` (the
spec fits it at one reference batch). So eq 6 is evaluated as
``alpha_flop + theta^gamma_flop * (T_bwd(m,0) - alpha_flop)`` and likewise eq 7 as
``alpha_sync + omega * (T_sync(a,0) - alpha_sync)``; the fixed costs are capped by the
unfrozen time (a fixed cost cannot exceed the whole). :meth:`FreezeParams.beta_flop` and
:meth:`FreezeParams.beta_sync` report the tied values.

Functions here accept floats or numpy arrays (the fitter evaluates them on arrays).

Before a job's first profile its model is fitted to assumed samples whose times
:func:`prior_iteration_time` predicts from its declared per-layer FLOPs and parameter bytes
and the GPU model's datasheet figures (:data:`GPU_MODELS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallelism import Kind, Parallelism
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.errors import InputError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Num = TypeVar("Num", float, FloatArray)

DEFAULT_GPUS_PER_NODE = 4
"""Nodes a job spans when only its GPU count is known: ceil(a / 4) (the paper uses 4 a node)."""


@dataclass(frozen=True)
class LinearCurve:
    """t(m) = intercept + slope * m, seconds, for per-GPU batch m (Pollux's T_compute)."""

    intercept: float  # seconds a step costs whatever the batch (launch overhead)
    slope: float  # seconds per sample of per-GPU batch

    def __call__(self, batch: Num) -> Num:
        return self.intercept + self.slope * batch


@dataclass(frozen=True)
class SyncCurve:
    """T_sync(a, 0): all-reduce time of the whole model on ``a`` GPUs over ``nodes`` nodes.

    As Pollux's ``PerfParams``: the slowest link sets the cost, inter-node when the job
    spans nodes, intra-node otherwise; ring all-reduce adds a retrogression term growing
    with the replicas beyond two. One GPU has no synchronisation: T_sync(1, 0) = 0.
    """

    alpha_intra: float  # one node, a >= 2: T = alpha_intra + beta_intra * max(a - 2, 0)
    beta_intra: float
    alpha_inter: float  # nodes >= 2: T = alpha_inter + beta_inter * max(a - 2, 0)
    beta_inter: float

    def __call__(self, gpus: Num, nodes: Num) -> Num:
        extra = np.maximum(np.asarray(gpus, dtype=float) - 2.0, 0.0)
        intra = self.alpha_intra + self.beta_intra * extra
        inter = self.alpha_inter + self.beta_inter * extra
        out = np.where(np.asarray(nodes) > 1, inter, np.where(np.asarray(gpus) > 1, intra, 0.0))
        return _like(gpus, out)


@dataclass(frozen=True)
class FreezeParams:
    """How freezing the first l layers changes an iteration (eq 5-7)."""

    alpha_flop: float = (
        0.0  # eq 6: T_bwd(m,l) = alpha_flop + beta_flop*theta_l^gamma_flop*T_bwd(m,0)
    )
    gamma_flop: float = 1.0  # eq 6: curvature; < 1 means backward falls sub-linearly with theta
    alpha_sync: float = 0.0  # eq 7: T_sync(a,l) = alpha_sync + beta_sync*omega_l*T_sync(a,0)
    gamma: float = 1.0  # eq 5: T_iter = T_fwd + (T_bwd^gamma + T_sync^gamma)^(1/gamma), >= 1

    def __post_init__(self) -> None:
        # Each value may also be an array of candidates (the fit evaluates many at once).
        for name in ("alpha_flop", "alpha_sync"):
            value = getattr(self, name)
            if not _finite_where(value, lambda v: v >= 0):
                raise InputError(f"{name}: must be a finite number >= 0, got {value}")
        if not _finite_where(self.gamma_flop, lambda v: v > 0):
            raise InputError(f"gamma_flop: must be > 0, got {self.gamma_flop}")
        if not _finite_where(self.gamma, lambda v: v >= 1):
            raise InputError(f"gamma: must be >= 1, got {self.gamma}")

    def beta_flop(self, t_bwd0: float) -> float:
        """beta_flop = 1 - alpha_flop / T_bwd(m,0): eq 6 tied so that l = 0 is the profile."""
        return 1.0 - min(self.alpha_flop, t_bwd0) / t_bwd0 if t_bwd0 > 0 else 1.0

    def beta_sync(self, t_sync0: float) -> float:
        """beta_sync = 1 - alpha_sync / T_sync(a,0): eq 7 tied so that l = 0 is the profile."""
        return 1.0 - min(self.alpha_sync, t_sync0) / t_sync0 if t_sync0 > 0 else 1.0


def backward_time(params: FreezeParams, t_bwd0: Num, theta: Num) -> Num:
    """T_bwd(m,l) = alpha_flop + beta_flop * theta_l^gamma_flop * T_bwd(m,0) (eq 6), with
    beta_flop tied (module doc): = a + theta^gamma_flop * (T_bwd(m,0) - a),
    a = min(alpha_flop, T_bwd(m,0))."""
    fixed = np.minimum(params.alpha_flop, t_bwd0)
    return _like(t_bwd0, fixed + np.power(theta, params.gamma_flop) * (t_bwd0 - fixed))


def sync_time(params: FreezeParams, t_sync0: Num, omega: Num) -> Num:
    """T_sync(a,l) = alpha_sync + beta_sync * omega_l * T_sync(a,0) (eq 7), with beta_sync
    tied (module doc): = s + omega * (T_sync(a,0) - s), s = min(alpha_sync, T_sync(a,0)).
    One GPU (T_sync(1,0) = 0) stays 0."""
    fixed = np.minimum(params.alpha_sync, t_sync0)
    return _like(t_sync0, fixed + omega * (t_sync0 - fixed))


def overlap(t_bwd: Num, t_sync: Num, gamma: float) -> Num:
    """(T_bwd^gamma + T_sync^gamma)^(1/gamma) (eq 5): gamma = 1 adds, gamma -> inf is max."""
    return _like(t_bwd, np.power(np.power(t_bwd, gamma) + np.power(t_sync, gamma), 1.0 / gamma))


def iteration_time(t_fwd: Num, t_bwd: Num, t_sync: Num, gamma: float) -> Num:
    """T_iter = T_fwd(m) + (T_bwd(m,l)^gamma + T_sync(a,l)^gamma)^(1/gamma) (eq 5)."""
    return t_fwd + overlap(t_bwd, t_sync, gamma)


def samples_per_second(gpus: Num, batch: Num, t_iter: Num, lam: float = 1.0) -> Num:
    """T(a,s,m,l) = M(a,m) / T_iter(a,m,l) * lambda(s,m,l), M = a*m (eq 4)."""
    return _like(t_iter, np.asarray(gpus, dtype=float) * batch / t_iter * lam)


PARAMETERS = (
    "fwd_intercept",
    "fwd_slope",
    "bwd_intercept",
    "bwd_slope",
    "alpha_intra",
    "beta_intra",
    "alpha_inter",
    "beta_inter",
    "alpha_flop",
    "gamma_flop",
    "alpha_sync",
    "gamma",
)
"""The DDP model's parameters by name (the fit's, ``fit.ddp_model_from``), in the column
order of :meth:`DdpThroughputModel.gradients`."""


def nodes_for(gpus: int, gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> int:
    """Nodes a packed job of ``gpus`` GPUs spans: ceil(gpus / gpus_per_node)."""
    return -(-gpus // gpus_per_node)


@dataclass(frozen=True)
class DdpThroughputModel:
    """The fitted DDP model: unfrozen curves plus freezing parameters (eq 4-7)."""

    forward: LinearCurve  # T_fwd(m): freezing leaves the forward pass unchanged (section 6)
    backward: LinearCurve  # T_bwd(m, 0)
    sync: SyncCurve  # T_sync(a, 0)
    freeze: FreezeParams
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE

    def components(
        self, gpus: Num, nodes: Num, batch: Num, theta: Num, omega: Num
    ) -> tuple[Num, Num, Num, Num]:
        """(T_fwd, T_bwd, T_sync, T_iter) in seconds (eq 5-7), elementwise over floats or
        arrays (the one evaluation of the model: the scalar calls, the Layer Tuner's grid
        and the fit's residuals all go through it)."""
        t_fwd = self.forward(batch)
        t_bwd = backward_time(self.freeze, self.backward(batch), theta)
        t_sync = sync_time(self.freeze, self.sync(gpus, nodes), omega)
        return t_fwd, t_bwd, t_sync, iteration_time(t_fwd, t_bwd, t_sync, self.freeze.gamma)

    def gradients(
        self,
        gpus: FloatArray,
        nodes: FloatArray,
        batch: FloatArray,
        theta: FloatArray,
        omega: FloatArray,
    ) -> tuple[tuple[FloatArray, FloatArray, FloatArray], FloatArray, FloatArray, FloatArray]:
        """(T_fwd, T_bwd, T_iter) as :meth:`components` gives them, and their partial
        derivatives with respect to the parameters: one row a configuration, one column a
        parameter in :data:`PARAMETERS` order (the fit's analytic Jacobian). Where a fixed
        cost is capped (alpha_flop >= T_bwd(m,0), alpha_sync >= T_sync(a,0)) the capped
        branch's derivative is taken; d/d gamma_flop is 0 where theta = 0."""
        fr = self.freeze
        a, n, m = (np.asarray(v, dtype=float) for v in (gpus, nodes, batch))
        th, om = np.asarray(theta, dtype=float), np.asarray(omega, dtype=float)
        t_fwd, b0, s0 = self.forward(m), self.backward(m), self.sync(a, n)
        t_bwd, t_sync = backward_time(fr, b0, th), sync_time(fr, s0, om)
        g = fr.gamma
        o = overlap(t_bwd, t_sync, g)
        d_fwd, d_bwd, d_sync = (np.zeros((*np.shape(m), len(PARAMETERS))) for _ in range(3))
        d_fwd[..., 0], d_fwd[..., 1] = 1.0, m
        # eq 6: T_bwd = f + theta^gamma_flop (B0 - f), f = min(alpha_flop, B0).
        capped_b = fr.alpha_flop >= b0
        th_g = np.power(th, fr.gamma_flop)
        d_b0 = np.where(capped_b, 1.0, th_g)
        d_bwd[..., 2], d_bwd[..., 3] = d_b0, d_b0 * m
        d_bwd[..., 8] = np.where(capped_b, 0.0, 1.0 - th_g)
        d_bwd[..., 9] = np.where(capped_b, 0.0, _x_log_x(th_g, th) * (b0 - fr.alpha_flop))
        # eq 7: T_sync = s + omega (S0 - s), s = min(alpha_sync, S0); S0 by the slowest link.
        capped_s = fr.alpha_sync >= s0
        d_s0 = np.where(capped_s, 1.0, om)
        extra = np.maximum(a - 2.0, 0.0)
        inter = np.where(n > 1, d_s0, 0.0)
        intra = np.where((n <= 1) & (a > 1), d_s0, 0.0)
        d_sync[..., 4], d_sync[..., 5] = intra, intra * extra
        d_sync[..., 6], d_sync[..., 7] = inter, inter * extra
        d_sync[..., 10] = np.where(capped_s, 0.0, 1.0 - om)
        # eq 5: O = (B^g + S^g)^(1/g); dO/dB = (B/O)^(g-1), dO/dg = O/g (sum w ln(x/O)),
        # w = x^g / O^g over x = B, S.
        live = o > 0
        safe_o = np.where(live, o, 1.0)
        rb, rs = t_bwd / safe_o, t_sync / safe_o
        d_o_b = np.where(live, np.power(rb, g - 1.0), 1.0)
        d_o_s = np.where(live, np.power(rs, g - 1.0), 0.0)
        d_iter = d_fwd + d_o_b[..., None] * d_bwd + d_o_s[..., None] * d_sync
        d_iter[..., 11] = np.where(
            live, safe_o / g * (_x_log_x(np.power(rb, g), rb) + _x_log_x(np.power(rs, g), rs)), 0.0
        )
        return (t_fwd, t_bwd, t_fwd + o), d_fwd, d_bwd, d_iter

    def times(
        self, *, gpus: int, batch: float, theta: float, omega: float, nodes: int | None = None
    ) -> tuple[float, float, float, float]:
        """(T_fwd, T_bwd, T_sync, T_iter) in seconds for one configuration (eq 5-7)."""
        n = nodes_for(gpus, self.gpus_per_node) if nodes is None else nodes
        t_fwd, t_bwd, t_sync, t_iter = self.components(
            float(gpus), float(n), float(batch), float(theta), float(omega)
        )
        return float(t_fwd), float(t_bwd), float(t_sync), float(t_iter)

    def throughput(
        self,
        *,
        gpus: int,
        batch: int,
        frozen: int,
        layers: LayerTable,
        lam: float = 1.0,
        nodes: int | None = None,
    ) -> float:
        """T(a,s,m,l) = a*m / T_iter * lambda (eq 4), samples per second."""
        *_, t_iter = self.times(
            gpus=gpus,
            batch=batch,
            theta=layers.theta(frozen),
            omega=layers.omega(frozen),
            nodes=nodes,
        )
        return float(samples_per_second(float(gpus), float(batch), t_iter, lam))

    def throughputs(
        self,
        *,
        gpus: int | IntArray,
        batch: FloatArray,
        frozen: IntArray,
        layers: LayerTable,
        lam: float = 1.0,
    ) -> FloatArray:
        """:meth:`throughput` for arrays of GPU counts, per-GPU batches and frozen counts
        (broadcast together), in one evaluation (the Layer Tuner's grids, eq 15)."""
        if not (np.min(frozen) >= 0 and np.max(frozen) <= layers.num_layers):
            raise InputError(f"frozen: outside 0..{layers.num_layers}")
        theta, omega = layers.fractions
        shape = np.broadcast_shapes(np.shape(gpus), np.shape(batch), np.shape(frozen))
        a = np.broadcast_to(np.asarray(gpus, dtype=float), shape)
        n = -(-a // self.gpus_per_node)
        m = np.broadcast_to(np.asarray(batch, dtype=float), shape)
        th, om = (np.broadcast_to(f[frozen], shape) for f in (theta, omega))
        *_, t_iter = self.components(a, n, m, th, om)
        return samples_per_second(a, m, t_iter, lam)

    def profile_sample(
        self,
        *,
        gpus: int,
        batch: int,
        frozen: int,
        layers: LayerTable,
        noise: tuple[float, float, float] = (1.0, 1.0, 1.0),
    ) -> ProfileSample:
        """The profile this model predicts for a configuration, its forward, backward and
        iteration times multiplied by ``noise`` (synthetic data for tests and benchmarks;
        the caller draws the factors). ``t_sync_s`` is the part not hidden: iter - fwd - bwd.
        """
        t_fwd, t_bwd, _, t_iter = self.times(
            gpus=gpus, batch=batch, theta=layers.theta(frozen), omega=layers.omega(frozen)
        )
        f, b, it = t_fwd * noise[0], t_bwd * noise[1], t_iter * noise[2]
        return ProfileSample(
            gpus=gpus, batch=batch, frozen=frozen, shared=False, t_fwd_s=f, t_bwd_s=b,
            t_sync_s=max(it - f - b, 0.0), t_iter_s=it, samples_per_s=gpus * batch / it,
        )  # fmt: skip


def _x_log_x(weight: FloatArray, x: FloatArray) -> FloatArray:
    """weight * ln(x), 0 where x = 0 (the limit, weight = x^g there)."""
    return np.asarray(weight * np.log(np.where(x > 0, x, 1.0)), dtype=float)


def _finite_where(value: float | FloatArray, ok: Callable[[Any], Any]) -> bool:
    """``value`` (a number, or every element of an array) is finite and satisfies ``ok``."""
    if isinstance(value, float | int):
        return math.isfinite(value) and bool(ok(value))
    arr = np.asarray(value, dtype=float)
    return bool(np.all(np.isfinite(arr)) and np.all(ok(arr)))


def _like(template: Num, value: object) -> Num:
    """Return a float when the input was a float, an array otherwise (keeps mypy honest)."""
    arr = np.asarray(value, dtype=float)
    if isinstance(template, np.ndarray):
        return arr
    return float(arr)


# --- the prior: a job's iteration time from its declared tables, before it is profiled ---


@dataclass(frozen=True)
class GpuModel:
    """Datasheet figures of a GPU model the throughput prior reads: peak dense FP32 FLOP/s
    and the per-GPU bandwidth of its intra-node (NVLink) and inter-node (NIC) links."""

    peak_flops: float
    intra_bytes_per_s: float
    inter_bytes_per_s: float


GPU_MODELS: dict[str, GpuModel] = {
    "v100": GpuModel(15.7e12, 300e9, 12.5e9),  # SXM2: NVLink 300 GB/s, 100 Gb/s IB
    "a100": GpuModel(19.5e12, 600e9, 25e9),  # SXM4: NVLink 600 GB/s, 200 Gb/s IB
    "a800": GpuModel(19.5e12, 400e9, 25e9),  # A100 with NVLink capped at 400 GB/s
    "h100": GpuModel(67e12, 900e9, 50e9),  # SXM5: NVLink 900 GB/s, 400 Gb/s IB
    "h800": GpuModel(67e12, 400e9, 50e9),  # H100 with NVLink capped at 400 GB/s
}
"""The GPU models ``slurm.gpu_model`` may name (vendors' datasheets)."""

PRIOR_UTILISATION = 0.4
"""Share of the peak FP32 FLOP/s a training step is assumed to achieve before it is measured
(an assumption; the profile replaces it after the job's first iterations)."""

PRIOR_LINK_EFFICIENCY = 0.5
"""Share of a link's bandwidth an all-reduce is assumed to achieve."""

PRIOR_STEP_OVERHEAD_S = 0.005
"""Fixed seconds a step is assumed to cost whatever its batch (kernel launches, optimiser)."""

TRAIN_FLOPS_PER_FORWARD = 3.0
"""A training step's FLOPs per forward FLOP (backward about twice the forward)."""


def prior_iteration_time(
    layers: LayerTable,
    gpu: GpuModel,
    parallelism: Parallelism,
    *,
    gpus: int,
    batch: int,
    nodes: int,
) -> float:
    """Seconds of one iteration predicted from the declared tables alone, before any profile.

    A replica computes ``batch`` samples (``layers.flops``: forward FLOPs a sample, x
    :data:`TRAIN_FLOPS_PER_FORWARD`) at :data:`PRIOR_UTILISATION` of the GPU's peak, spread
    over its p pipeline stages (PP, HP; no bubble), plus :data:`PRIOR_STEP_OVERHEAD_S`. Then
    communication of the parameter bytes at :data:`PRIOR_LINK_EFFICIENCY` of NVLink on one
    node, of the NIC across nodes: DDP's ring all-reduce moves 2 (a-1)/a of them, SDP's
    all-gathers and reduce-scatter 3 (a-1)/a, PP/HP's all-reduce of a stage's share among
    its d = a/p replicas 2 (d-1)/d. Nothing overlapped."""
    if batch < 1 or gpus < 1 or nodes < 1:
        raise InputError("prior: batch, GPUs and nodes must be >= 1")
    stages = parallelism.stages
    replicas = parallelism.replicas(gpus)
    flops = TRAIN_FLOPS_PER_FORWARD * math.fsum(layers.flops) * batch
    compute = flops / (stages * gpu.peak_flops * PRIOR_UTILISATION)
    share = math.fsum(layers.param_bytes) / stages  # what one GPU holds and synchronises
    if parallelism.kind is Kind.SDP:
        moved = 3 * (gpus - 1) / gpus * share
    else:
        moved = 2 * (replicas - 1) / replicas * share
    link = (gpu.inter_bytes_per_s if nodes > 1 else gpu.intra_bytes_per_s) * PRIOR_LINK_EFFICIENCY
    return PRIOR_STEP_OVERHEAD_S + compute + moved / link
