"""Simulated training jobs: what a job does between two engine steps, per the hidden truth.

A :class:`SimJob` is one workload job's training run (``truth.TrainingRun``). While its Slurm
job runs it trains at the TRUE throughput of its configuration (GPUs and nodes it holds,
the per-GPU batch and frozen layers of its latest ``decision.json``, and on a shared GPU
the true shared speed with the jobs on the same GPU), loses
``controller.reallocation_overhead_s`` after every (re)start, and reports what a real job's
trainer would report: noisy profile samples of each new configuration, per-layer gradient
statistics and progress at every epoch (and the statistics so far at every eighth of one), a
finished report when it reaches its target.

Its effective progress (spec section 4) is what the trainer can know: samples x psi with psi
from its own *observed* gradient variances (eq 3), never the truth's; a job whose global
batch is free counts it in base-batch samples (x the efficiency of its global batch from
the same statistics, as AdaptDL's trainer counts its progress), the unit the estimator's
remaining work is in. Its validation metric follows a saturating learning curve of the true
progress with a hidden per-job shape and noise (:func:`metric_curve`), so the metric says
no more about the remaining work than a real job's would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from icefrog_slurm.core.goodput import efficiency
from icefrog_slurm.core.penalty import frozen_penalty
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.protocol import (
    GRAD_REPORTS_PER_EPOCH,
    Decision,
    FinishedReport,
    GradStats,
    JobSpec,
    MetricReport,
    ProgressReport,
    fixed_per_gpu_batch,
)
from icefrog_slurm.sim.calibration import PolluxApplication
from icefrog_slurm.sim.truth import DEFAULT_NOISE, ProfileNoise, TaskTruth
from icefrog_slurm.sim.workload import TraceJob

PROFILE_SAMPLES_PER_CONFIG = 3
"""Profile samples a job reports for each (GPUs, batch, frozen, shared) it runs in."""

METRIC_NOISE = 0.15
"""sd of a validation report's noise, as a fraction of the gap between the target and the
metric's asymptote (``MetricShape.margin`` x |target|)."""

MAX_WORK_FACTOR = 3.0
"""A job stops (target not reached) after this many times its ``max_epochs`` of samples."""


@dataclass(frozen=True)
class Config:
    """What a running job trains with: GPUs on nodes, per-GPU batch, frozen layers."""

    gpus: int
    nodes: int
    batch: int
    frozen: int
    shared: bool
    gpu_key: tuple[tuple[str, int], ...]  # the (node, GPU index) it holds
    global_batch: int = 0  # samples an optimiser step; 0: gpus x batch (no accumulation)

    @property
    def step_batch(self) -> int:
        return self.global_batch or self.gpus * self.batch


@dataclass
class Reports:
    """What a job reports in one step (applied to the store as verified reports would be)."""

    samples: list[ProfileSample] = field(default_factory=list)
    grad_stats: GradStats | None = None
    metric: MetricReport | None = None
    progress: ProgressReport | None = None
    finished: FinishedReport | None = None


@dataclass
class JobOutcome:
    """One job's record for summary.json."""

    name: str
    task: str
    submit: float
    start: float | None = None
    finish: float | None = None
    reached_target: bool = False
    gpu_seconds: float = 0.0
    shared_seconds: float = 0.0  # of its running time, on a GPU it shared
    reallocations: int = 0


class SimJob:
    """One workload job's simulated training (module docstring)."""

    def __init__(
        self,
        job: TraceJob,
        truth: TaskTruth,
        spec: JobSpec,
        *,
        seed: int,
        overhead_s: float,
        noise: ProfileNoise = DEFAULT_NOISE,
    ) -> None:
        self.job, self.truth, self.spec = job, truth, spec
        self.noise = noise
        self.run = truth.start_run(seed=seed)
        self.rng = np.random.default_rng([seed, 0xB0B])
        self.metric_rng = np.random.default_rng([seed, 0xACC])  # its own stream: the others'
        self.metric_shape = draw_metric_shape(  # draws stay what they were
            self.metric_rng, higher_is_better=spec.target_op == ">="
        )
        self.grad_sums: tuple[float, float] | None = None  # trainable layers' var, sqr
        self.overhead_s = overhead_s
        self.outcome = JobOutcome(name=job.name, task=truth.task.name, submit=job.submit_s)
        self.run_dir = f"/sim/{job.name}"
        self.slurm_id = ""
        self.decision: Decision | None = None
        self.config: Config | None = None
        self.busy_until = 0.0  # restarting: no useful work before this time
        self.checkpoint_at: float | None = None
        self.samples_done = 0.0
        self.effective_done = 0.0
        self.epoch = 0
        self.grad_part = 0  # 1/GRAD_REPORTS_PER_EPOCH parts of an epoch reported
        self.profiled: dict[tuple[int, int, int, int, bool], int] = {}
        self.observed_psi = 1.0
        self.done = False
        self.frozen_trace: list[tuple[float, int]] = []

    @property
    def epoch_samples(self) -> int:
        return self.spec.samples_per_epoch

    def batch_for(self, gpus: int, decided: int | None) -> tuple[int, int]:
        """(per-GPU batch, global batch) on ``gpus`` GPUs. A job that declares a global
        batch (``spec.global_batch``: the workload's under ``--batch paper``/``fixed``,
        spec section 12) splits it over its GPUs by the protocol's
        :func:`~icefrog_slurm.protocol.fixed_per_gpu_batch` (the rule the estimator plans
        with), accumulating gradients beyond the largest per-GPU batch (same samples/s as
        that batch); else it takes the decided per-GPU batch (its smallest before a
        decision)."""
        spec = self.spec
        if spec.global_batch:
            per_gpu = fixed_per_gpu_batch(spec.global_batch, gpus, spec.min_batch, spec.max_batch)
            return per_gpu, spec.global_batch
        batch = decided if decided is not None and decided >= 1 else spec.min_batch
        return batch, gpus * batch

    def on_decision(self, decision: Decision) -> None:
        self.decision = decision

    def set_config(self, config: Config | None, now: float) -> None:
        """The job's Slurm allocation as of ``now`` (None: it holds nothing)."""
        old = self.config
        if config is not None and (old is None or old.gpu_key != config.gpu_key):
            self.busy_until = now + self.overhead_s  # (re)start: restore, warm up
            if self.outcome.start is None:
                self.outcome.start = now
            else:
                self.outcome.reallocations += 1
        self.config = config
        if config is not None and config.frozen != self.run.frozen:
            self.run.set_frozen(config.frozen)
            self.frozen_trace.append((now, config.frozen))

    def step(self, t0: float, t1: float, speed: float) -> tuple[Reports, float | None]:
        """Train from t0 to t1 at ``speed`` (1 unshared; the true shared factor on a shared
        GPU); returns the reports and the finish time when the job ended within."""
        reports = Reports()
        cfg = self.config
        if cfg is None or self.done:
            return reports, None
        self.outcome.gpu_seconds += (t1 - t0) * _gpu_weight(cfg)
        if cfg.shared:
            self.outcome.shared_seconds += t1 - t0
        self._profile(cfg, speed, reports)
        useful = max(0.0, t1 - max(t0, self.busy_until))
        if useful <= 0 or speed <= 0:
            return reports, None
        rate = speed * self.truth.throughput(
            gpus=cfg.gpus, batch=cfg.batch, frozen=cfg.frozen, nodes=cfg.nodes
        )
        samples = rate * useful
        before = self.run.progress
        gained = self.run.advance(samples=samples, global_batch=cfg.step_batch)
        finish: float | None = None
        if self.run.reached and gained > 0:
            share = (1.0 - before) / gained
            samples *= share
            finish = t1 - useful * (1 - share)
        self.samples_done += samples
        self.effective_done += samples * self.observed_psi * self._efficiency(cfg)
        self._epoch_reports(reports)
        limit = MAX_WORK_FACTOR * self.spec.max_epochs * self.epoch_samples
        if finish is not None or self.samples_done >= limit:
            end = finish if finish is not None else t1
            self.done = True
            self.outcome.finish = end
            self.outcome.reached_target = self.run.reached
            if finish is not None:
                self.outcome.gpu_seconds -= (t1 - end) * _gpu_weight(cfg)
                if cfg.shared:
                    self.outcome.shared_seconds -= t1 - end
            value = self._metric_value()
            reports.finished = (
                FinishedReport("target_reached", self.epoch, value)
                if self.run.reached
                else FinishedReport("max_epochs", self.epoch, value)
            )
            return reports, end
        return reports, None

    def _profile(self, cfg: Config, speed: float, reports: Reports) -> None:
        key = (cfg.gpus, cfg.nodes, cfg.batch, cfg.frozen, cfg.shared)
        have = self.profiled.get(key, 0)
        if have >= PROFILE_SAMPLES_PER_CONFIG or (cfg.shared and speed <= 0):
            return
        for _ in range(PROFILE_SAMPLES_PER_CONFIG - have):
            reports.samples.append(
                self.truth.observe_profile(
                    self.rng,
                    gpus=cfg.gpus,
                    batch=cfg.batch,
                    frozen=cfg.frozen,
                    nodes=cfg.nodes,
                    shared_speed=min(speed, 1.0) if cfg.shared else 1.0,
                    noise=self.noise,
                )
            )
        self.profiled[key] = PROFILE_SAMPLES_PER_CONFIG

    def _epoch_reports(self, reports: Reports) -> None:
        """At an epoch's end: gradient statistics, the validation metric and progress; at
        every further 1/GRAD_REPORTS_PER_EPOCH of an epoch: the statistics so far, labelled
        with the epoch in progress (its end replaces them)."""
        part = int(self.samples_done * GRAD_REPORTS_PER_EPOCH // self.epoch_samples)
        epoch = part // GRAD_REPORTS_PER_EPOCH
        if epoch <= self.epoch:
            if part > self.grad_part:
                self.grad_part = part
                reports.grad_stats = self._grad_stats(self.epoch + 1)
            return
        self.epoch, self.grad_part = epoch, part
        reports.grad_stats = self._grad_stats(epoch)
        reports.metric = MetricReport(epoch, self.spec.target_metric, self._metric_value())
        reports.progress = ProgressReport(
            epoch=epoch,
            samples_done=int(self.samples_done),
            effective_samples_done=self.effective_done,
            checkpoint_path=f"{self.run_dir}/checkpoints/ckpt-{epoch}.pt",
        )

    def _grad_stats(self, epoch: int) -> GradStats:
        """Observe the gradient statistics; psi and the efficiency follow them."""
        stats = self.run.observe_grad_stats(
            epoch=epoch, base_batch=self.spec.min_gpus * self.spec.min_batch
        )
        app = self.truth.pollux_app
        if app is not None and self.config is not None:
            stats = self._as_pollux(stats, app, self.config.step_batch)
        frozen = stats.frozen
        self.observed_psi = frozen_penalty(
            sum(stats.grad_var[:frozen]), sum(stats.grad_var[frozen:])
        )
        self.grad_sums = (sum(stats.grad_var[frozen:]), sum(stats.grad_sqr[frozen:]))
        return stats

    def _as_pollux(self, stats: GradStats, app: PolluxApplication, batch: int) -> GradStats:
        """``stats`` rescaled, every layer by one factor (psi unchanged), so that the
        trainable layers' sums are the application's measured statistics at this epoch and
        global batch, as AdaptDL's simulator hands them to Pollux (``--gpu-model v100``):
        grad_var moved from Pollux's base batch to this job's (GradStats' convention)."""
        sqr, var = app.grad_stats(batch, self.run.epoch)
        var *= app.init_batch / (self.spec.min_gpus * self.spec.min_batch)
        k = stats.frozen
        f_var = var / max(sum(stats.grad_var[k:]), 1e-300)
        f_sqr = sqr / max(sum(stats.grad_sqr[k:]), 1e-300)
        return replace(
            stats,
            grad_var=tuple(v * f_var for v in stats.grad_var),
            grad_sqr=tuple(v * f_sqr for v in stats.grad_sqr),
        )

    def _metric_value(self) -> float:
        """The validation metric the job reports: :func:`metric_curve` at its true progress
        with this job's hidden shape, plus noise (none once the target is reached)."""
        spec = self.spec
        value = metric_curve(
            min(self.run.progress, 1.0), target=spec.target_value,
            higher_is_better=spec.target_op == ">=", shape=self.metric_shape,
        )  # fmt: skip
        if self.run.reached or not math.isfinite(value):
            return value
        gap = (abs(spec.target_value) or 1.0) * self.metric_shape.margin
        return value + float(self.metric_rng.normal(0.0, METRIC_NOISE * gap))

    def _efficiency(self, cfg: Config) -> float:
        """Base-batch samples one sample at ``cfg``'s global batch is worth, as the job can
        judge it: Pollux's efficiency (``core/goodput.py``) from its latest observed gradient
        statistics, its base batch the smallest global batch it may train with (the
        estimator's), 1 for a job that keeps a declared global batch or has no statistics."""
        if self.spec.global_batch or self.grad_sums is None:
            return 1.0
        var, sqr = self.grad_sums
        base = self.spec.min_gpus * self.spec.min_batch
        return efficiency(var=var, sqr=sqr, batch=cfg.step_batch, base_batch=base)


@dataclass(frozen=True)
class MetricShape:
    """A job's hidden learning curve: the metric's asymptote beyond the target (``margin``,
    a fraction of the target), its start (``start``, a multiple of the target) and the
    curve's exponent ``alpha``."""

    margin: float
    start: float
    alpha: float


def draw_metric_shape(rng: np.random.Generator, *, higher_is_better: bool) -> MetricShape:
    """A job's hidden learning curve: margin 2-6 % of the target, exponent 0.5-2, a metric
    that starts at 0 (higher is better) or at 3-8 times the target (lower is better)."""
    margin = float(rng.uniform(0.02, 0.06))
    alpha = float(np.exp(rng.uniform(math.log(0.5), math.log(2.0))))
    start = 0.0 if higher_is_better else float(rng.uniform(3.0, 8.0))
    return MetricShape(margin=margin, start=start, alpha=alpha)


def metric_curve(
    progress: float, *, target: float, higher_is_better: bool, shape: MetricShape
) -> float:
    """The validation metric at true ``progress`` (0..1): a saturating learning curve
    ``v = A - (A - v0) / (1 + k p) ** alpha`` (higher is better; mirrored when lower is
    better) from v0 = start x target toward the asymptote A = target x (1 +- margin),
    with k such that it meets the target exactly at progress 1. The policies never see this
    function: they fit a curve of their own to the noisy reports (``core/tta.py``)."""
    if not math.isfinite(target):
        return target
    sign = 1.0 if higher_is_better else -1.0
    asymptote = target + sign * (abs(target) or 1.0) * shape.margin
    v0 = shape.start * target
    k = float(((asymptote - v0) / (asymptote - target)) ** (1.0 / shape.alpha)) - 1.0
    return asymptote - (asymptote - v0) / float((1.0 + k * max(progress, 0.0)) ** shape.alpha)


def _gpu_weight(cfg: Config) -> float:
    """GPUs a job occupies: its GPU count, or half a GPU when it shares one."""
    return 0.5 if cfg.shared else float(cfg.gpus)
