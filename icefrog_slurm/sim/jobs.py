"""Simulated training jobs: what a job does between two engine steps, per the hidden truth.

A :class:`SimJob` is one workload job's training run (``truth.TrainingRun``). While its Slurm
job runs it trains at the TRUE throughput of its configuration (GPUs and nodes it holds,
the per-GPU batch and frozen layers of its latest ``decision.json``, and on a shared GPU
the true shared speed with the jobs on the same GPU), loses
``controller.reallocation_overhead_s`` after every (re)start, and reports what a real job's
trainer would report: noisy profile samples of each new configuration, per-layer gradient
statistics and progress at every epoch, a finished report when it reaches its target.

Its effective progress (spec section 4) is what the trainer can know: samples x psi with psi
from its own *observed* gradient variances (eq 3), never the truth's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from icefrog_slurm.core.penalty import frozen_penalty
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.protocol import (
    Decision,
    FinishedReport,
    GradStats,
    JobSpec,
    MetricReport,
    ProgressReport,
    fixed_per_gpu_batch,
)
from icefrog_slurm.sim.truth import DEFAULT_NOISE, ProfileNoise, TaskTruth
from icefrog_slurm.sim.workload import TraceJob

PROFILE_SAMPLES_PER_CONFIG = 3
"""Profile samples a job reports for each (GPUs, batch, frozen, shared) it runs in."""

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
        self.effective_done += samples * self.observed_psi
        self._epoch_reports(reports)
        limit = MAX_WORK_FACTOR * self.spec.max_epochs * self.epoch_samples
        if finish is not None or self.samples_done >= limit:
            end = finish if finish is not None else t1
            self.done = True
            self.outcome.finish = end
            self.outcome.reached_target = self.run.reached
            if finish is not None:
                self.outcome.gpu_seconds -= (t1 - end) * _gpu_weight(cfg)
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
        epoch = int(self.samples_done // self.epoch_samples)
        if epoch <= self.epoch:
            return
        self.epoch = epoch
        stats = self.run.observe_grad_stats(epoch=epoch)
        frozen = stats.frozen
        self.observed_psi = frozen_penalty(
            sum(stats.grad_var[:frozen]), sum(stats.grad_var[frozen:])
        )
        reports.grad_stats = stats
        reports.metric = MetricReport(epoch, self.spec.target_metric, self._metric_value())
        reports.progress = ProgressReport(
            epoch=epoch,
            samples_done=int(self.samples_done),
            effective_samples_done=self.effective_done,
            checkpoint_path=f"{self.run_dir}/checkpoints/ckpt-{epoch}.pt",
        )

    def _metric_value(self) -> float:
        """A stand-in validation metric: the target approached in proportion to the true
        progress (the scheduler does not use the value; the finished report carries it)."""
        target, p = self.spec.target_value, min(self.run.progress, 1.0)
        if self.spec.target_op == ">=":
            return target * p
        return target * (1 + 4 * (1 - p)) if math.isfinite(target) else target


def _gpu_weight(cfg: Config) -> float:
    """GPUs a job occupies: its GPU count, or half a GPU when it shares one."""
    return 0.5 if cfg.shared else float(cfg.gpus)
