"""The simulator's hidden ground truth of frozen training, and noisy observations of it.

The scheduler must learn a task's behaviour as on a real cluster: only from noisy profile
samples (:class:`ProfileSample`) and per-layer gradient statistics (:class:`GradStats`).
This module owns what those samples are samples *of*. Its parameters are drawn per task
from a seed, kept private (``_hidden``) and never exported; an import-linter contract
forbids ``icefrog_slurm.core`` and ``icefrog_slurm.policies`` to import this module.

What is true here (docs/simulator.md argues why each is plausible):

- **times** — the unfrozen compute curve is the calibrated one (``calibration.py``, from
  Pollux's measurements); a hidden share of it is forward. Backward is a fixed launch cost
  plus a **per-layer** cost: layer i costs ``w_i`` of the variable part, ``w_i`` proportional
  to ``flops_i ** eta`` times per-layer noise, eta < 1 (small layers are less efficient),
  so T_bwd falls sub-linearly with theta_l — the core's eq 6 approximates this, it is not
  this. Sync is a fixed cost plus the rest linear in the unfrozen parameter bytes omega_l,
  overlapped with backward as eq 5 with the calibrated gamma;
- **gradient variance** of layer i at training progress p (0..1 of the unfrozen work):
  ``v_i(p) = v0_i x (f_i + (1 - f_i) x exp(-k_i x p))``, the decay rate ``k_i`` larger toward
  the input (front layers settle earlier, spec section 5), the floor ``f_i`` smaller there;
  independent of the batch (eq 3 uses only ratios of variances, where a 1/batch scale
  cancels); p is the layer's own progress, which stands still while it is frozen, so a
  thawed layer resumes where it stopped;
- **squared gradient norm** of layer i: v_i times a hidden per-layer share, scaled so that
  the trainable layers' norm over their base-batch variance is M_base / B, B the gradient
  noise scale of the calibrated convergence curve: Pollux's statistical efficiency on the
  reported statistics values a larger batch as the curve does;
- **reaching the target** — unfrozen, a job needs the calibrated samples-to-target at its
  global batch (times a hidden per-job factor). With the first l layers frozen, a sample
  counts ``1 / (1 + rho x (1/psi - 1))`` of a full-model sample, psi = eq 3 evaluated on
  the *true* variances (frozen layers at their freeze-time value) and rho <= 1 a hidden
  recovery factor (the paper finds eq 3's predicted iteration point later than the real
  one), times mean-one noise each step of the engine;
- **memory and utilisation** per (batch, theta_l, omega_l) and the speed of jobs sharing a
  GPU, by the GRES that shares it: shards time-slice (slowed beyond 100 % utilisation, a
  hidden interference cost), CUDA MPS runs the jobs' kernels concurrently (slowed only
  when their busy kernels need more SMs than the GPU has, half the interference); OOM past
  80 GB either way.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.penalty import frozen_penalty
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.throughput import iteration_time, nodes_for
from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import GradStats, SharingKind
from icefrog_slurm.sim.calibration import PolluxApplication, TaskCalibration, sync_group
from icefrog_slurm.sim.catalog import Catalog, Task

FloatArray = npt.NDArray[np.float64]

GPU_MEMORY_BYTES = 80e9  # A800-80GB
PROFILE_TIME_NOISE = 0.03  # sd of log(measured / true) of each profiled time
GRAD_VAR_NOISE = 0.2  # sd of log(observed / true) of each layer's gradient variance
MEMORY_NOISE = 0.02  # sd of log(measured / true) peak memory
UTIL_NOISE = 0.03  # sd of measured - true GPU utilisation (absolute, 0..1)
WORK_NOISE = 0.05  # sd of log of the frozen-progress factor of one progress quantum
PROGRESS_QUANTUM = 0.01  # frozen training is integrated in steps of at most this progress
JOB_WORK_NOISE = 0.05  # sd of log of a job's samples-to-target around the task's
MPS_INTERFERENCE = 0.5  # share of a pair's time-slicing interference left under CUDA MPS


@dataclass(frozen=True)
class ProfileNoise:
    """Noise on what a job's profiler reports (the scheduler's model inputs); the defaults
    are the module's constants, larger values are the noise ablation (spec section 15)."""

    time: float = PROFILE_TIME_NOISE  # sd of log(measured / true) of each profiled time
    memory: float = MEMORY_NOISE  # sd of log(measured / true) of the peak memory
    util: float = UTIL_NOISE  # sd of measured - true utilisation (absolute, 0..1)

    def __post_init__(self) -> None:
        for name in ("time", "memory", "util"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise InputError(f"profile noise {name}: must be finite and >= 0, got {value}")


DEFAULT_NOISE = ProfileNoise()


@dataclass(frozen=True)
class _Hidden:
    """A task's hidden parameters (never exported; module doc for their meaning)."""

    fwd_share: float  # T_fwd = fwd_share x calibrated compute(m); the rest is backward
    bwd_fixed_s: float  # T_bwd(m,l) = fixed + (T_bwd(m,0) - fixed) x sum(layer_bwd[l:])
    layer_bwd: FloatArray  # per-layer share of backward's variable cost, sums to 1
    sync_fixed_share: float  # T_sync(a,l) = T_sync(a,0) x (share + (1 - share) x omega_l)
    var0: FloatArray  # v_i(p) = var0_i x (floor_i + (1 - floor_i) x exp(-decay_i x p))
    decay: FloatArray
    floor: FloatArray
    rho: float  # progress a frozen sample makes: 1 / (1 + rho x (1/psi - 1))
    act_bytes_per_sample: float  # memory = static + W(1 + 3 omega) + act x m x keep(theta)
    act_keep: float  # keep(theta) = act_keep + (1 - act_keep) x theta_l
    static_bytes: float
    util_peak: float  # utilisation = util_peak x busy share of a one-GPU iteration
    interference: float  # shared speed = (1 - interference) / max(1, sum of utilisations)
    snr: FloatArray  # each layer's share of squared gradient norm over variance (relative)
    sm_share: float  # share of the GPU's SMs a busy kernel of this task occupies (MPS)


def _lognormal(rng: np.random.Generator, sd: float, size: int | None = None) -> FloatArray:
    """exp(N(-sd^2/2, sd)): mean-one multiplicative noise."""
    return np.asarray(np.exp(rng.normal(-0.5 * sd * sd, sd, size)), dtype=float)


def _draw(task: Task, layers: LayerTable, cal: TaskCalibration, seed: int) -> _Hidden:
    rng = np.random.default_rng([seed, zlib.crc32(task.name.encode())])
    n = layers.num_layers
    depth = np.arange(n) / max(n - 1, 1)  # 0 at the input, 1 at the output
    flops = np.asarray(layers.flops) + 1e-9 * max(layers.flops)
    weights = flops ** rng.uniform(0.75, 0.95) * _lognormal(rng, 0.15, n)
    params = np.asarray(layers.param_bytes) / math.fsum(layers.param_bytes)
    k_in, k_out = rng.uniform(6.0, 10.0), rng.uniform(1.0, 2.5)
    compute0 = float(cal.model.backward(float(task.default_batch)))
    fwd_share = rng.uniform(0.28, 0.38)
    return _Hidden(
        fwd_share=fwd_share,
        bwd_fixed_s=rng.uniform(0.04, 0.12) * (1 - fwd_share) * compute0,
        layer_bwd=weights / weights.sum(),
        sync_fixed_share=rng.uniform(0.02, 0.08),
        var0=(params + 1.0 / n) / 2 * _lognormal(rng, 0.3, n),
        decay=(k_out + (k_in - k_out) * (1 - depth)) * _lognormal(rng, 0.1, n),
        floor=0.02 + 0.13 * depth * rng.uniform(0.7, 1.3),
        rho=rng.uniform(0.75, 1.0),
        act_bytes_per_sample=rng.uniform(0.006, 0.014) * math.fsum(layers.flops),
        act_keep=rng.uniform(0.2, 0.35),
        static_bytes=rng.uniform(1.0e9, 1.6e9),
        util_peak=rng.uniform(0.85, 0.98),
        interference=rng.uniform(0.03, 0.10),
        snr=0.05 * _lognormal(rng, 0.5, n),
        sm_share=rng.uniform(0.55, 0.9),  # drawn last: the draws above stay as they were
    )


class TaskTruth:
    """The hidden behaviour of one task; observations of it are noisy (module doc)."""

    def __init__(self, task: Task, layers: LayerTable, cal: TaskCalibration, *, seed: int = 0):
        self.task = task
        self.layers = layers
        self._cal = cal
        self._hidden = _draw(task, layers, cal, seed)
        self._bwd_suffix = np.concatenate([np.cumsum(self._hidden.layer_bwd[::-1])[::-1], [0.0]])
        self.noise_scale = cal.noise_scale  # the convergence curve's (samples)

    @property
    def pollux_app(self) -> PolluxApplication | None:
        """The application as AdaptDL's simulator defines it (``--gpu-model v100``), else
        None: its declared limits, not hidden ones."""
        return self._cal.application

    # --- times -----------------------------------------------------------------------------

    def times(
        self, *, gpus: int, batch: int, frozen: int, nodes: int | None = None
    ) -> tuple[float, float, float, float]:
        """True (T_fwd, T_bwd, T_sync, T_iter) seconds of one unshared iteration.

        T_iter = T_cal(a, m) x (T_fwd + ov(T_bwd(l), T_sync(l))) / (T_fwd + ov(T_bwd(0),
        T_sync(0))), ov the eq-5 overlap with the calibrated gamma: the calibrated iteration
        time exactly at l = 0 (Pollux overlaps its single compute time with sync), and the
        physical structure (forward never overlapped, per-layer backward) for l > 0."""
        h, model = self._hidden, self._cal.model
        n = nodes_for(gpus) if nodes is None else nodes
        compute = float(model.backward(float(batch))) + float(model.forward(float(batch)))
        fwd = h.fwd_share * compute
        bwd0 = compute - fwd
        fixed = min(h.bwd_fixed_s, 0.5 * bwd0)
        bwd = fixed + (bwd0 - fixed) * float(self._bwd_suffix[self._check(frozen)])
        group = sync_group(self.task, gpus)
        sync0 = float(model.sync(float(group), float(n)))
        sync = sync0 * (h.sync_fixed_share + (1 - h.sync_fixed_share) * self.layers.omega(frozen))
        gamma = model.freeze.gamma
        *_, t_cal = model.times(gpus=group, batch=batch, theta=1.0, omega=1.0, nodes=n)
        ratio = iteration_time(fwd, bwd, sync, gamma) / iteration_time(fwd, bwd0, sync0, gamma)
        return fwd, bwd, sync, float(t_cal * ratio)

    def throughput(self, *, gpus: int, batch: int, frozen: int, nodes: int | None = None) -> float:
        """True samples a second, unshared: a x m / T_iter (eq 4 with lambda = 1)."""
        *_, t_iter = self.times(gpus=gpus, batch=batch, frozen=frozen, nodes=nodes)
        return gpus * batch / t_iter

    # --- memory, utilisation, sharing ------------------------------------------------------

    def memory(self, *, batch: int, frozen: int) -> float:
        """True peak bytes on one GPU: context + weights + gradients and two optimiser
        states of the trainable share omega_l + activations (kept share grows with theta_l)."""
        h, lay = self._hidden, self.layers
        weights = math.fsum(lay.param_bytes)
        keep = h.act_keep + (1 - h.act_keep) * lay.theta(frozen)
        return (
            h.static_bytes
            + weights * (1 + 3 * lay.omega(frozen))
            + h.act_bytes_per_sample * batch * keep
        )

    def utilisation(self, *, batch: int, frozen: int) -> float:
        """True single-GPU utilisation: the busy share of an iteration (launch costs idle)."""
        h, model = self._hidden, self._cal.model
        fwd, bwd, _, t_iter = self.times(gpus=1, batch=batch, frozen=frozen)
        launch = h.fwd_share * (model.backward.intercept + model.forward.intercept)
        idle = launch + min(h.bwd_fixed_s, 0.5 * (bwd + fwd))
        return float(h.util_peak * max(0.0, t_iter - idle) / t_iter)

    def shared_speed(
        self,
        *,
        batch: int,
        frozen: int,
        partners: list[tuple[TaskTruth, int, int]],
        kind: SharingKind = "shard",
    ) -> float:
        """True speed factor (lambda) of this job on a GPU shared with ``partners`` given as
        (truth, batch, frozen): 0 when their memory overflows the GPU (OOM); else, by how
        the GPU is shared (``kind``, the GRES):

        - ``shard`` (time slicing: one context's kernels at a time)
          ``(1 - interference) / max(1, sum of utilisations)``;
        - ``mps`` (CUDA MPS: the jobs' kernels run concurrently, each on its ``sm_share``
          of the SMs) ``(1 - MPS_INTERFERENCE x interference) / max(1, sum of
          utilisation x sm_share)``: no context switches, so less interference, and the
          GPU is full only when the busy kernels' SMs add up past all of them."""
        loads = [(self, batch, frozen), *partners]
        if sum(t.memory(batch=m, frozen=k) for t, m, k in loads) > GPU_MEMORY_BYTES:
            return 0.0
        if kind == "mps":
            busy = sum(t.utilisation(batch=m, frozen=k) * t._hidden.sm_share for t, m, k in loads)
            return (1 - MPS_INTERFERENCE * self._hidden.interference) / max(1.0, busy)
        util = sum(t.utilisation(batch=m, frozen=k) for t, m, k in loads)
        return (1 - self._hidden.interference) / max(1.0, util)

    # --- gradient variance and the work to the target --------------------------------------

    def grad_var(self, progress: float | FloatArray) -> FloatArray:
        """True per-layer gradient variance at ``progress`` (0..1 of the unfrozen work): one
        value for every layer, or one a layer (each layer's own training progress)."""
        h = self._hidden
        p = np.clip(progress, 0.0, 1.0)
        return np.asarray(h.var0 * (h.floor + (1 - h.floor) * np.exp(-h.decay * p)), dtype=float)

    def samples_to_target(self, global_batch: float) -> float:
        """True unfrozen samples to the target at ``global_batch`` (the calibrated curve)."""
        return self._cal.samples_to_target(global_batch)

    def progress_rate(self, psi: float) -> float:
        """Full-model samples a frozen sample is worth, in expectation: 1/(1 + rho(1/psi-1))."""
        if not 0 < psi <= 1:
            raise InputError(f"psi: must be within (0, 1], got {psi}")
        return 1.0 / (1.0 + self._hidden.rho * (1.0 / psi - 1.0))

    def start_run(self, *, seed: int) -> TrainingRun:
        """A job's training run with its own hidden per-job factor and noise stream."""
        return TrainingRun(self, seed)

    # --- observations (what the scheduler sees) --------------------------------------------

    def observe_profile(
        self,
        rng: np.random.Generator,
        *,
        gpus: int,
        batch: int,
        frozen: int,
        nodes: int | None = None,
        shared_speed: float = 1.0,
        noise: ProfileNoise = DEFAULT_NOISE,
    ) -> ProfileSample:
        """A profile sample as the job's profiler would report it: each time, the peak
        memory and the utilisation with independent noise (``noise``; by default
        PROFILE_TIME_NOISE, ...); ``shared_speed`` < 1 marks a shared run slowed by that
        factor."""
        if not 0 < shared_speed <= 1:
            raise InputError(f"shared_speed: must be within (0, 1], got {shared_speed}")
        fwd, bwd, _, t_iter = self.times(gpus=gpus, batch=batch, frozen=frozen, nodes=nodes)
        f, b, it = (fwd, bwd, t_iter / shared_speed) * _lognormal(rng, noise.time, 3)
        util = self.utilisation(batch=batch, frozen=frozen) + rng.normal(0.0, noise.util)
        mem = self.memory(batch=batch, frozen=frozen) * float(_lognormal(rng, noise.memory))
        return ProfileSample(
            gpus=gpus,
            batch=batch,
            frozen=frozen,
            shared=shared_speed < 1,
            t_fwd_s=float(f),
            t_bwd_s=float(b),
            t_sync_s=float(max(it - f - b, 0.0)),
            t_iter_s=float(it),
            samples_per_s=gpus * batch / float(it),
            peak_mem_bytes=mem,
            gpu_util=float(min(max(util, 0.0), 1.0)),
        )

    def _check(self, frozen: int) -> int:
        if not 0 <= frozen <= self.layers.num_layers:
            raise InputError(f"frozen: {frozen} is outside 0..{self.layers.num_layers}")
        return frozen


def build_truths(
    catalog: Catalog, calibration: Mapping[str, TaskCalibration], *, seed: int
) -> dict[str, TaskTruth]:
    """A truth for every task that is available and calibrated (the engine's starting point)."""
    return {
        name: TaskTruth(catalog.get(name), catalog.layers(name), calibration[name], seed=seed)
        for name in catalog.available()
        if name in calibration
    }


class TrainingRun:
    """One job's true progress toward its target under changing freezing and batch.

    ``progress`` is the fraction of the unfrozen work done; a job reaches its target at 1.
    Each layer also keeps its own progress, which moves only while the layer trains: its
    variance is the truth's at that progress, so a layer thawed after a freeze comes back
    where it stopped (its variance as high as then) and a brief thaw does not make up what
    it missed. Freezing layers records their variance at that moment (eq 3's sigma^2_t0)
    and the value the job's profiler observed then (what it keeps reporting for a frozen
    layer).
    """

    def __init__(self, truth: TaskTruth, seed: int) -> None:
        self._truth = truth
        self._rng = np.random.default_rng([seed, 0x5EED])
        self._job_factor = float(_lognormal(self._rng, JOB_WORK_NOISE))
        n = truth.layers.num_layers
        self._frozen = 0
        self._at_freeze = np.zeros(n)
        self._observed_at_freeze = np.zeros(n)
        self._trained = np.zeros(n)  # each layer's own progress: it moves while it trains
        self.progress = 0.0
        self._epoch = 0  # Pollux's rule: the epoch in progress

    @property
    def frozen(self) -> int:
        return self._frozen

    @property
    def epoch(self) -> int:
        """The epoch in progress by Pollux's rule (0 under the target's rule)."""
        return self._epoch

    @property
    def reached(self) -> bool:
        return self.progress >= 1.0

    def set_frozen(self, frozen: int) -> None:
        """Freeze the first ``frozen`` layers now (thawing any beyond it)."""
        self._truth._check(frozen)
        if frozen > self._frozen:
            new = slice(self._frozen, frozen)
            now = self._truth.grad_var(self._trained)[new]
            self._at_freeze[new] = now
            self._observed_at_freeze[new] = now * _lognormal(self._rng, GRAD_VAR_NOISE, now.size)
        self._frozen = frozen

    def layer_variances(self) -> FloatArray:
        """True per-layer variances as eq 3 uses them: frozen layers at freeze time."""
        out = self._truth.grad_var(self._trained)
        out[: self._frozen] = self._at_freeze[: self._frozen]
        return out

    def true_psi(self) -> float:
        """psi (eq 3) on the true variances: S / (F + S)."""
        v = self.layer_variances()
        return frozen_penalty(float(v[: self._frozen].sum()), float(v[self._frozen :].sum()))

    def advance(self, *, samples: float, global_batch: float) -> float:
        """Train ``samples`` at ``global_batch`` under the current freeze; returns the
        progress gained (fraction of the work). Unfrozen it is exactly samples / needed.

        Frozen, the progress rate (psi's effect, with ``WORK_NOISE``) is re-evaluated every
        ``PROGRESS_QUANTUM`` of progress, so neither the rate's drift nor the noise depends
        on how the caller slices time (the simulator's steps follow its ticks)."""
        if samples < 0 or not math.isfinite(samples):
            raise InputError(f"samples: must be a finite number >= 0, got {samples}")
        if self._truth._cal.application is not None:
            return self._advance_pollux(samples, global_batch, self._truth._cal.application)
        needed = self._truth.samples_to_target(global_batch) * self._job_factor
        if self._frozen == 0:
            gained = samples / needed
            self._gain(gained)
            return gained
        gained, left = 0.0, samples
        while left > 0:
            noise = float(_lognormal(self._rng, WORK_NOISE))
            per_sample = self._truth.progress_rate(self.true_psi()) * noise / needed
            take = min(left, PROGRESS_QUANTUM / per_sample) if per_sample > 0 else left
            self._gain(take * per_sample)
            gained += take * per_sample
            left = left - take if take < left else 0.0
        return gained

    def _advance_pollux(
        self, samples: float, global_batch: float, rule: PolluxApplication
    ) -> float:
        """``advance`` by Pollux's completion rule (``calibration.PolluxApplication``): each
        step of ``global_batch`` adds the gain of the epoch in progress, epoch by epoch, no
        per-job factor (Pollux's simulator has none); frozen, the progress rate is scaled
        as in ``advance``, re-evaluated every ``PROGRESS_QUANTUM``."""
        target, last = rule.target, len(rule.boundaries) - 1
        gained, left = 0.0, samples
        while left > 0:
            epoch = self._epoch
            per_sample = rule.gain(global_batch, epoch) / max(global_batch, 1.0) / target
            if self._frozen:
                noise = float(_lognormal(self._rng, WORK_NOISE))
                per_sample *= self._truth.progress_rate(self.true_psi()) * noise
            to_end = rule.boundaries[epoch] / target - self.progress if epoch < last else math.inf
            room = min(to_end, PROGRESS_QUANTUM) if self._frozen else to_end
            if left * per_sample < room:
                self._gain(left * per_sample)
                gained += left * per_sample
                break
            self._gain(room)
            gained += room
            left -= room / per_sample
            if room == to_end:
                self._epoch += 1
        return gained

    def _gain(self, progress: float) -> None:
        """Progress made: the job's, and that of each layer that trained (the unfrozen)."""
        self.progress += progress
        self._trained[self._frozen :] += progress

    def observe_grad_stats(self, *, epoch: int, base_batch: int) -> GradStats:
        """What the job's gradient statistics report: trainable layers a fresh noisy value,
        frozen layers the value observed when they were frozen (protocol.GradStats).

        The variance is that of a ``base_batch`` gradient (the job's smallest global batch,
        GradStats' convention); the squared norms keep each layer's hidden share (``snr``)
        and are scaled so that, on the true values, the trainable layers' squared norm over
        variance is base_batch / the task's noise scale: Pollux's efficiency computed on
        them follows the task's convergence curve (``TaskCalibration.noise_scale``)."""
        now = self._truth.grad_var(self._trained)
        noisy = now * _lognormal(self._rng, GRAD_VAR_NOISE, now.size)
        noisy[: self._frozen] = self._observed_at_freeze[: self._frozen]
        k = self._frozen if self._frozen < now.size else 0
        shape = now * self._truth._hidden.snr
        ratio = base_batch / self._truth.noise_scale * now[k:].sum() / shape[k:].sum()
        sqr = shape * ratio * _lognormal(self._rng, GRAD_VAR_NOISE, now.size)
        return GradStats(
            epoch=epoch,
            frozen=self._frozen,
            grad_var=tuple(float(x) for x in noisy),
            grad_sqr=tuple(float(x) for x in sqr),
        )
