"""The Model Trainer: what a user adds to an ordinary PyTorch training loop.

    trainer = Trainer(model, optimizer, train_set)          # layers: top-level children
    for epoch in trainer.epochs():                          # restores, applies decisions
        for x, y in trainer.loader:                         # per-GPU batch from the decision
            optimizer.zero_grad()
            loss_fn(trainer.model(x), y).backward()
            optimizer.step()
        trainer.report_metric(evaluate(model))              # every rank calls it

It owns: the freeze state (the first ``l`` layers get ``requires_grad=False``, their
gradients ``None``, and because the input needs no gradient autograd records nothing for
them: backward really stops at the boundary); DDP over the trainable parameters only,
rebuilt when ``l`` changes; the statistics and profile hooks; checkpoints at every epoch end
and on a stop signal; the reports to the controller; and the end of the job (target metric
reached, or the work budget spent: icefrog_launcher.budget) with the reason.

A job declared with ``--global-batch B`` trains on ``a`` processes with the per-GPU batch
m = ceil(B / a) clipped to the declared range (``protocol.fixed_per_gpu_batch``, the rule
the controller decides with) and accumulates k = ceil(B / (a x m)) micro-steps an optimizer
step (icefrog_launcher.accumulate), so a step covers a x m x k samples, B when the integers
allow. Without a global batch m is the decision's and k = 1, and each optimizer step runs
at the user's learning rate times the LR rule's factor for the global batch against the
base batch (icefrog_launcher.lr; ``auto`` by default: linear for the Adam family, sqrt for
other optimizers; the user's value is back in the param groups after the step, so
checkpoints and schedulers see only it).

The checkpoint also holds every registered object (``scheduler=``, ``scaler=``,
``register_state``: icefrog_launcher.state), restored exactly on resume.

One optimizer holds every parameter: a frozen parameter has ``grad None``, so PyTorch's
optimizers skip it and its state (e.g. Adam's moments and step) waits unchanged until it is
unfrozen. (A user calling ``zero_grad(set_to_none=False)`` still gets ``None`` for frozen
parameters: their gradients are dropped when frozen and autograd never sets them again.)
"""

from __future__ import annotations

import atexit
import copy
import gc
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from icefrog_launcher import checkpoint, rng
from icefrog_launcher.accumulate import Accumulation, group_counts
from icefrog_launcher.budget import Limit
from icefrog_launcher.config import JobConfig
from icefrog_launcher.data import ElasticDataLoader, SizedDataset
from icefrog_launcher.decision import read_decision
from icefrog_launcher.launch import REQUEUE_EXIT_CODE
from icefrog_launcher.lr import (
    DEFAULT_RULE,
    DEFAULT_WARMUP_STEPS,
    Scaling,
    parse_rule,
    target_factor,
    training_sums,
)
from icefrog_launcher.model import ElasticModel
from icefrog_launcher.position import DataPosition
from icefrog_launcher.probes import StepProbes
from icefrog_launcher.profiler import find_layers, layer_flops, param_bytes
from icefrog_launcher.reports import Reporter
from icefrog_launcher.sharing import SharingGuard, without_sharing
from icefrog_launcher.state import StateRegistry
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.protocol import (
    GRAD_REPORTS_PER_EPOCH,
    Decision,
    FinishedReport,
    GradStats,
    MetricReport,
    ProgressReport,
    accumulation_steps,
    fixed_per_gpu_batch,
)
from icefrog_slurm.runfiles import CHECKPOINT_MARKER
from icefrog_slurm.security import write_atomic

ADAM_FAMILY = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adamax,
)
"""The optimizers ``lr_rule="auto"`` scales linearly (``sqrt`` for every other;
icefrog_launcher.lr)."""

MID_EPOCH_STATS_MIN_S = 60.0
"""The least time between two gradient-statistics reports: within an epoch the trainer
reports the statistics so far after every further 1/GRAD_REPORTS_PER_EPOCH of it, but not
sooner than this after the last report (a short epoch reports at its end only; the
controller reads them once a round)."""

END_WAIT = timedelta(seconds=120)
"""How long a rank that finished waits at exit for the others to reach theirs."""

Finish = Literal["target_reached"] | Limit
"""Why a job ends (FinishedReport.reason): its target, or the limit that ended it
(icefrog_launcher.budget)."""


class Trainer:
    """See the module docstring. ``env`` defaults to os.environ (torchrun's and the
    launcher's variables); ``config`` overrides the launcher's variables. ``scheduler``
    and ``scaler`` (an LR scheduler, a ``torch.amp.GradScaler``: anything with
    ``state_dict``/``load_state_dict``) are checkpointed as ``register_state`` objects named
    so, and step with the optimizer when gradients accumulate. ``loader_args``
    are ``torch.utils.data.DataLoader``'s own for ``trainer.loader`` (``num_workers``,
    ``pin_memory``, ``collate_fn``...; not the batch size, order or sampler, which are the
    elastic loader's: icefrog_launcher.data)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: SizedDataset,
        *,
        layers: Sequence[nn.Module] | None = None,
        shuffle: bool = True,
        config: JobConfig | None = None,
        env: Mapping[str, str] | None = None,
        stats_every: int = 8,
        profile_every: int = 4,
        scheduler: object = None,
        scaler: object = None,
        loader_args: Mapping[str, Any] | None = None,
        lr_rule: str = DEFAULT_RULE,
        lr_warmup_steps: int = DEFAULT_WARMUP_STEPS,
    ) -> None:
        env = dict(os.environ) if env is None else dict(env)
        self.config = config or JobConfig.from_env(env)
        adam = isinstance(optimizer, ADAM_FAMILY)
        self.lr_scaling = Scaling(parse_rule(lr_rule, adam=adam), max(0, int(lr_warmup_steps)))
        self._lr_kept: list[float] | None = None  # the user's lrs while a step runs scaled
        self._said_lr: tuple[int, float] | None = None
        self._lr_stats = (0.0, 0.0)  # the smoothed statistics the adascale rule reads
        # eighths of the epoch whose statistics were reported, and when the last were
        self._grad_part, self._grad_sent = 0, time.monotonic()
        self.rank, self.world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
        local_rank = int(env.get("LOCAL_RANK", "0"))
        self._own_group = False  # whether the trainer made the process group (and ends it)
        self._ended = False  # the loop ended normally: every rank passed the end barrier
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            self._own_group = True
            # ended at exit, not when the loop ends: the script may still use
            # torch.distributed after it (icefrog_launcher.trainer._teardown)
            atexit.register(self._teardown)
        cuda = torch.cuda.is_available()
        self.device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        node = env.get("SLURMD_NODENAME") or socket.gethostname()
        print(f"icefrog trainer: rank {self.rank} of {self.world} on {node}", file=sys.stderr)
        self.module = model.to(self.device)
        self.optimizer = optimizer
        self.layers = find_layers(model, layers)
        # the data position, shared with the loader (which moves it) and checkpointed here
        self.data_position = DataPosition(batch=self.config.batch[0])
        self.loader = ElasticDataLoader(
            dataset,
            self.data_position,
            rank=self.rank,
            world=self.world,
            seed=self.config.seed,
            shuffle=shuffle,
            before_step=self.step_boundary,
            on_step=self.consumed,
            to_device=self.to_device,
            loader_args=loader_args,
        )
        self.probes = StepProbes(
            self.layers,
            self.device,
            world=self.world,
            stats_every=stats_every,
            profile_every=profile_every,
        )
        self.timer, self.stats = self.probes.timer, self.probes.stats
        self.reporter = Reporter(
            inbox=self.config.inbox,
            slurm_job_id=self.config.slurm_job_id,
            job_name=self.config.job_name,
            enabled=self.rank == 0,
        )
        self.ddp: DistributedDataParallel | None = None
        self.samples_done = self.step = 0
        self.effective_done = 0.0
        self.frozen, self.psi = 0, 1.0
        self.decision_round, self.shared = -1, False
        # an out-of-memory while shared is a sharing failure (icefrog_launcher.sharing)
        SharingGuard(
            self.config.workdir, rank=self.rank, shared=lambda: self.shared, register=self._register
        ).install()
        self.metric: float | None = None
        self.finished: Finish | Literal[""] = ""
        self._stop: int | None = None
        self._said_global: tuple[int, int, int] | None = None  # the (a, m, k) last said
        self.table = self._measure_layers(dataset)
        self.max_frozen = self.table.max_frozen_from_fraction(self.config.max_frozen)
        self._ckpt_number = checkpoint.latest_number(self.config.checkpoint_dir) + 1
        self.registry = StateRegistry(verbose=self.rank == 0)
        # the restored optimizer's param groups without their params, until the first epoch
        self._groups: list[dict[str, Any]] | None = None
        held = {"scheduler": scheduler, "scaler": scaler}
        for name, obj in held.items():
            if obj is not None:
                self.registry.register(name, obj)
                self._check_schedule(name, obj)
        self.accumulation = Accumulation(verbose=self.rank == 0)
        if self.config.global_batch:
            self.accumulation.install(optimizer, [o for o in held.values() if o is not None])
        self.model = ElasticModel(self.module, lambda: self.ddp, self.accumulation, self.probes)
        self._restore()
        self.set_frozen(self.frozen, force=True)
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, self._on_signal)

    # -- the data position (icefrog_launcher.position) ----------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch being trained: epochs finished so far."""
        return self.data_position.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.data_position.epoch = value

    @property
    def position(self) -> int:
        """Samples of this epoch consumed, all ranks together."""
        return self.data_position.samples

    @position.setter
    def position(self, value: int) -> None:
        self.data_position.samples = value

    @property
    def batch(self) -> int:
        """The per-GPU batch of the next step."""
        return self.data_position.batch

    @batch.setter
    def batch(self, value: int) -> None:
        self.data_position.batch = value

    # -- layers and freezing ---------------------------------------------------------
    def _measure_layers(self, dataset: SizedDataset) -> LayerTable:
        names = {id(m): n for n, m in self.module.named_modules()}
        clone = copy.deepcopy(self.module)  # FLOP counting runs a step: keep the model intact
        clone_layers = [clone.get_submodule(names[id(layer)]) for layer in self.layers]
        count = min(self.batch, len(dataset))
        sample = self.loader.fetch(torch.arange(count))
        inputs = self.to_device(sample[0] if isinstance(sample, tuple | list) else sample)
        flops = layer_flops(clone, clone_layers, inputs)
        nbytes = [param_bytes(layer) for layer in self.layers]
        if sum(flops) <= 0:  # nothing the counter knows (e.g. custom ops): use sizes
            flops = list(nbytes)
        return LayerTable(flops=tuple(flops), param_bytes=tuple(nbytes))

    def set_frozen(self, frozen: int, force: bool = False) -> None:
        """Freeze exactly the first ``frozen`` layers and rebuild DDP over the rest."""
        frozen = max(0, min(frozen, self.max_frozen))
        if frozen == self.frozen and not force:
            return
        if frozen > self.frozen:
            self.stats.freeze_changed(self.frozen, frozen)
        for i, layer in enumerate(self.layers):
            for p in layer.parameters():
                p.requires_grad_(i >= frozen)
                if i < frozen:
                    p.grad = None
        self.frozen = frozen
        self.psi = self.stats.penalty(frozen)
        self._trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.accumulation.watch(self._trainable)
        self.probes.watch(self._trainable)
        self.ddp = None
        if self.world > 1 and self._trainable:
            self.ddp = DistributedDataParallel(
                self.module, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
            # DDP checks the hook's annotations at run time: give it an unannotated one
            self.ddp.register_comm_hook(None, lambda state, bucket: self.probes.comm_hook(bucket))

    # -- hooks (icefrog_launcher.probes) -------------------------------------------------
    @property
    def synced_numel(self) -> int:
        """Gradient elements all-reduced so far (frozen ones never are)."""
        return self.probes.synced_numel

    @property
    def last_profile(self) -> ProfileSample | None:
        return self.probes.last_profile

    def _before_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.probes.before_step(step=self.step, local_batch=self.accumulation.samples)
        factor = self.lr_scaling.factor()
        if factor != 1.0:  # the step runs at the rule's lr; the user's comes back after it
            self._lr_kept = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor

    def _after_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self._lr_kept is not None:
            for group, lr in zip(optimizer.param_groups, self._lr_kept, strict=True):
                group["lr"] = lr
            self._lr_kept = None
        self.lr_scaling.stepped()
        self.step += 1
        self.probes.plan(self.step)

    @property
    def base_batch(self) -> int:
        """B0, the global batch the user's learning rate is for: the smallest declared GPU
        count x the smallest per-GPU batch (the controller's base, core.goodput)."""
        return self.config.gpus[0] * self.config.batch[0]

    @property
    def lr_factor(self) -> float:
        """The factor the next optimizer step multiplies the user's learning rates by
        (icefrog_launcher.lr); 1 for a job with a fixed global batch."""
        return self.lr_scaling.factor()

    def _update_lr(self) -> None:
        """The rule's factor for this epoch's global batch and the latest statistics."""
        if self.config.global_batch:  # the declared batch is the one the lr is for
            return
        batch = self.world * self.batch
        var, sqr = self._lr_stats
        factor = target_factor(
            self.lr_scaling.rule, batch=batch, base_batch=self.base_batch, var=var, sqr=sqr
        )
        self.lr_scaling.retarget(factor)
        said = (batch, round(factor, 2))
        if self.rank == 0 and said != self._said_lr and (self._said_lr or factor != 1.0):
            self._said_lr = said
            print(
                f"icefrog trainer: global batch {batch} (base {self.base_batch}): "
                f"lr x {factor:.3g} ({self.lr_scaling.rule})",
                file=sys.stderr,
            )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop = signum

    # -- data ------------------------------------------------------------------------
    def to_device(self, batch: Any) -> Any:
        if self.device.type == "cpu":
            return batch
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, tuple | list):
            return type(batch)(self.to_device(b) for b in batch)
        return batch

    def consumed(self, global_count: int, local_count: int) -> None:
        """A step's samples (the loader has moved the data position past them): progress,
        psi-weighted (spec section 4)."""
        self.samples_done += global_count
        self.effective_done += self.psi * global_count
        left = self.loader.size - self.position + global_count  # this micro-batch's on
        step = self.batch * self.world
        self.accumulation.begin(
            local_count,
            lambda: group_counts(left, step, self.world, self.rank, self.accumulation.steps),
        )
        # measured: full micro-batches of a step of all its micro-steps
        full = local_count == self.batch and self.accumulation.group == self.accumulation.steps
        self.probes.micro_batch(full)
        self._mid_epoch_stats()

    def _mid_epoch_stats(self) -> None:
        """The gradient statistics so far, labelled with this epoch (its end's report
        replaces them), after every further 1/GRAD_REPORTS_PER_EPOCH of the epoch and no
        sooner than MID_EPOCH_STATS_MIN_S after the last report (rank 0). An eighth is read
        once (one copy from the device): with nothing measured yet, the next one is tried."""
        if not self.reporter.enabled or self.loader.size <= 0:
            return
        part = self.position * GRAD_REPORTS_PER_EPOCH // self.loader.size
        if not self._grad_part < part < GRAD_REPORTS_PER_EPOCH:
            return
        if time.monotonic() - self._grad_sent < MID_EPOCH_STATS_MIN_S:
            return
        self._grad_part = part
        got = self.stats.so_far(self.frozen)
        if got is not None:
            self._send_grad_stats(*got)

    def _send_grad_stats(self, var: Sequence[float], sqr: Sequence[float]) -> None:
        # reported as Pollux's traces record it and core.goodput reads it: the variance of a
        # base-batch gradient, tr(Sigma) / B0 (psi, a ratio of variances, is the same)
        base_var = tuple(v / self.base_batch for v in var)
        self.reporter.send("grad_stats", GradStats(self.epoch, self.frozen, base_var, tuple(sqr)))
        self._grad_sent = time.monotonic()

    def step_boundary(self) -> None:
        """Between two steps, and once more when the epoch's data is exhausted (before the
        loop's evaluation): on a stop signal rank 0 checkpoints; every rank exits 75.
        Other ranks keep stepping until rank 0 has stopped (their collective then fails),
        so rank 0 never waits on a peer that left. With accumulation only between two
        optimizer steps: a checkpoint never holds half a step's gradients. A signal that
        comes while the loop runs outside the loader (its evaluation) is served at the
        epoch end's checkpoint (:meth:`epochs`)."""
        if self._stop is not None and self.rank == 0 and self.accumulation.at_boundary:
            self._save()
            self._exit_requeue(f"signal {self._stop}")

    def _exit_requeue(self, why: str) -> None:
        if self.rank == 0:
            write_atomic(Path(self.config.workdir) / CHECKPOINT_MARKER, why.encode())
            print(f"icefrog trainer: checkpointed; requeue requested ({why})", file=sys.stderr)
        raise SystemExit(REQUEUE_EXIT_CODE)

    # -- epochs ----------------------------------------------------------------------
    def epochs(self) -> Iterator[int]:
        """Yield epoch numbers until the target is reached or the work budget is spent
        (or the cap on physical epochs reached: icefrog_launcher.budget). A stop signal
        that came after the epoch's data was exhausted (during the loop's evaluation) is
        served as soon as the loop body returns: rank 0 exits 75 after the epoch end's
        checkpoint, which holds the whole epoch and its metric."""
        if self.finished:
            self._end_barrier()
            return
        self._register()
        self.registry.close()
        self._restore_groups()
        self.apply_decision(first=True)
        while (limit := self._limit()) is None:
            self.probes.plan(self.step)
            self._update_lr()
            yield self.epoch
            if self._end_epoch():
                self._end_barrier()
                return
            if self._stop is not None and self.rank == 0:  # the epoch end's checkpoint is it
                self._exit_requeue(f"signal {self._stop}")
            self.apply_decision(first=False)
        self._finish(limit)
        self._end_barrier()

    def _end_barrier(self) -> None:
        """Every rank leaves the loop together: rank 0's last checkpoint and reports are
        written before any rank goes on to the script's own end."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
        self._ended = True

    def _teardown(self) -> None:
        """At interpreter exit, for a process group the trainer made: after a loop that
        ended normally, wait (at most END_WAIT) for every rank to reach its exit, so no rank
        ends the group while another still uses it; then drop the DDP wrapper (its reducer
        holds the group) and destroy the group while the interpreter is whole. Left to the
        interpreter's own teardown, the group's threads could outlive it: the process is
        then aborted ("terminate called without an active exception") and torchrun takes
        the finished run for a failure. A loop left by an exception or a stop signal (exit
        75, the other ranks possibly still in a collective) skips the wait."""
        if not (self._own_group and dist.is_initialized()):
            return
        try:
            if self._ended:
                dist.barrier(async_op=True).wait(timeout=END_WAIT)
        except Exception as exc:  # a peer that failed: nothing left to end with it
            print(f"icefrog trainer: exit barrier: {exc}", file=sys.stderr)
            return
        self.ddp = None
        gc.collect()
        dist.destroy_process_group()

    def _limit(self) -> Limit | None:
        """The limit that ends the job now, checked at epoch ends only: the last epoch may
        overshoot the budget by less than one epoch's effective samples. Rank 0's progress
        decides (psi comes from each rank's own statistics), so every rank stops together."""
        box: list[Limit | None] = [
            self.config.budget(self.loader.size).ended_by(
                epochs=self.epoch,
                samples_done=self.samples_done,
                effective_done=self.effective_done,
            )
        ]
        if self.world > 1:
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def report_metric(self, value: float, name: str | None = None) -> None:
        """Report the validation metric of this epoch. Call it on every rank: rank 0's
        value is the one used (broadcast), so all ranks agree on stopping."""
        box = [float(value)]
        if self.world > 1:
            dist.broadcast_object_list(box, src=0)
        self.metric = box[0]
        target = self.config.target
        label = name or (target.metric if target else "metric")
        self.reporter.send("metric", MetricReport(epoch=self.epoch, name=label, value=self.metric))

    def register_state(self, name: str, obj: object) -> None:
        """Checkpoint ``obj`` (anything with ``state_dict()``/``load_state_dict()``: an EMA,
        a counter, another scheduler) under ``name``, and restore it now from the checkpoint
        being resumed. Before the first epoch only (icefrog_launcher.state)."""
        self.registry.register(name, obj)
        self._check_schedule(name, obj)

    def _check_schedule(self, name: str, obj: object) -> None:
        """Warn of a OneCycleLR: it counts a fixed total of optimizer steps and raises past
        it, while the steps an epoch change with the per-GPU batch a decision sets (a
        smaller batch makes more). docs/trainer.md gives the schedule by progress instead."""
        if self.rank == 0 and isinstance(obj, torch.optim.lr_scheduler.OneCycleLR):
            print(
                f"icefrog trainer: warning: {name!r} is a OneCycleLR: its total_steps counts "
                "optimizer steps, and the steps an epoch change with the batch the "
                "controller decides (a smaller batch makes more; past total_steps it "
                "raises); schedule by trainer.effective_done instead (LambdaLR: "
                "docs/trainer.md)",
                file=sys.stderr,
            )

    @property
    def accumulating(self) -> bool:
        """True on a micro-batch that does not end an optimizer step (its optimizer.step()
        does nothing): step your own per-step objects (an EMA) when it is False."""
        return not self.accumulation.final

    def _end_epoch(self) -> bool:
        """Report, checkpoint and start the next epoch; whether the job has finished."""
        var, sqr = self.stats.end_epoch(self.frozen)
        self._lr_stats = self.lr_scaling.observe(*training_sums(var, sqr, self.frozen))
        self._send_grad_stats(var, sqr)
        self._send_profile()
        self.epoch, self.position, self._grad_part = self.epoch + 1, 0, 0
        self.psi = self.stats.penalty(self.frozen)
        target = self.config.target
        if target is not None and self.metric is not None and target.reached(self.metric):
            self.finished = "target_reached"
        elif (limit := self._limit()) is not None:
            self.finished = limit
        path = self._save(every_rank=True)
        self.reporter.send(
            "progress",
            ProgressReport(self.epoch, self.samples_done, self.effective_done, str(path or "")),
        )
        if self.finished:
            self._finish(self.finished)
            return True
        return False

    def _finish(self, reason: Finish) -> None:
        self.finished = reason
        metric = self.metric if self.metric is not None else 0.0
        self.reporter.send("finished", FinishedReport(reason, self.epoch, metric))
        if self.rank == 0:
            target = self.config.target
            done = self.config.budget(self.loader.size).effective_epochs(
                epochs=self.epoch,
                samples_done=self.samples_done,
                effective_done=self.effective_done,
            )
            print(
                f"icefrog trainer: finished: {reason} after {self.epoch} epochs, "
                f"{done:.2f} full-model-equivalent (metric {metric:g}, target {target or 'none'})",
                file=sys.stderr,
            )

    def _send_profile(self) -> None:
        report = self.probes.profile(
            batch=self.batch,
            frozen=self.frozen,
            shared=self.shared,
            device=self.device,
            micro_steps=self.accumulation.steps,
        )
        if report is not None:
            self.reporter.send("profile", report)

    def _register(self) -> None:
        spec = self.config.declaration.job_spec(
            samples_per_epoch=self.loader.size,
            layer_flops=self.table.flops,
            layer_param_bytes=self.table.param_bytes,
        )
        self.reporter.send("register", without_sharing(spec, self.config.workdir))

    # -- decisions -------------------------------------------------------------------
    def apply_decision(self, first: bool) -> None:
        """Adopt the controller's batch and freeze depth (rank 0 reads, all agree). A new
        round asking for another GPU count stops the job for a requeue (after the
        checkpoint just written) unless this is the start of the run. An unmanaged job
        (``config.managed`` False) reads none: its allocation is what Slurm gave it."""
        reads = self.rank == 0 and self.config.managed
        box: list[Decision | None] = [read_decision(self.config.decision_path) if reads else None]
        if self.world > 1:
            dist.broadcast_object_list(box, src=0)
        decision = box[0]
        if first:
            self._set_batch(None)
        if decision is None or (decision.round == self.decision_round and not first):
            return
        self.decision_round = decision.round
        if not first and decision.gpus != self.world:
            self._exit_requeue(f"decision round {decision.round}: {decision.gpus} GPUs")
        self._set_batch(decision.batch)
        self.shared = decision.shared
        legal = [b for b in self.table.candidates(self.max_frozen) if b <= decision.frozen]
        self.set_frozen(max(legal, default=0))

    def _set_batch(self, decided: int | None) -> None:
        """The per-GPU batch m and the micro-steps k of an optimizer step. With a global
        batch B: m = fixed_per_gpu_batch(B, a, lo, hi) and k = accumulation_steps(B, a, m),
        the rule the controller decides with (icefrog_slurm.protocol); otherwise the
        decision's m clipped to the declared range (``decided``; None: keep it) and k = 1."""
        lo, hi = self.config.batch
        wanted = self.config.global_batch
        if not wanted:
            if decided is not None:
                self.batch = max(lo, min(decided, hi))
            return
        self.batch = fixed_per_gpu_batch(wanted, self.world, lo, hi)
        steps = accumulation_steps(wanted, self.world, self.batch)
        self.accumulation.set_steps(steps)
        said = (self.world, self.batch, steps)
        if self.rank == 0 and said != self._said_global:
            self._said_global = said
            print(
                f"icefrog trainer: --global-batch {wanted}: a step covers {self.world} x "
                f"{self.batch} x {steps} micro-steps = {self.world * self.batch * steps} samples",
                file=sys.stderr,
            )

    # -- checkpoints -----------------------------------------------------------------
    def _save(self, *, every_rank: bool = False) -> Path | None:
        """Rank 0 writes a checkpoint (its path; None on the other ranks). ``every_rank``:
        every rank calls it (an epoch end) and the checkpoint holds each rank's generator
        states (icefrog_launcher.rng); otherwise only rank 0's (a stop: the other ranks are
        still stepping)."""
        rngs: list[Any] = [rng.capture(self.device)]
        if every_rank and self.world > 1:
            gathered: list[Any] | None = [None] * self.world if self.rank == 0 else None
            dist.gather_object(rngs[0], gathered, dst=0)
            rngs = gathered or rngs
        if self.rank != 0:
            return None
        state = {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch,
            "position": self.position,
            "samples_done": self.samples_done,
            "effective_done": self.effective_done,
            "frozen": self.frozen,
            "batch": self.batch,
            "decision_round": self.decision_round,
            "finished": self.finished,
            "world": self.world,
            "stats": self.stats.state_dict(),
            "objects": self.registry.state_dict(),
            "lr_scaling": self.lr_scaling.state_dict(),
            "rng": rngs,
            "step": self.step,
        }
        path = checkpoint.save(self.config.checkpoint_dir, self._ckpt_number, state)
        self._ckpt_number += 1
        return path

    def _restore_groups(self) -> None:
        """The first epoch starts: the optimizer's param groups get back the checkpoint's
        hyperparameters (lr, momentum, initial_lr...). An object the script made after the
        Trainer may have changed them since the restore (a warm-up scheduler's constructor
        multiplies the lr by its start factor); its own state is the checkpoint's, so the
        groups must be too."""
        if self._groups is None:
            return
        for group, saved in zip(self.optimizer.param_groups, self._groups, strict=False):
            group.update(copy.deepcopy(saved))
        self._groups = None

    def _restore(self) -> None:
        found = checkpoint.load_latest(self.config.checkpoint_dir)
        if found is None:
            torch.manual_seed(self.config.seed + self.rank)
            return
        number, state = found
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._groups = copy.deepcopy(
            [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        )
        self.registry.restore(state.get("objects", {}))  # a checkpoint from before: none
        for key in ("epoch", "position", "samples_done", "effective_done", "frozen", "batch"):
            setattr(self, key, state[key])
        self.decision_round, self.finished = state["decision_round"], state["finished"]
        self.stats.load_state_dict(state["stats"])
        self.lr_scaling.load_state_dict(state.get("lr_scaling", {}))  # before: none
        self._lr_stats = (self.lr_scaling.var, self.lr_scaling.sqr)
        self.step = state.get("step", 0)  # a checkpoint from before: none
        rngs = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]  # before
        if self.rank < len(rngs):
            rng.restore(rngs[self.rank], self.device)
        else:  # a stop saves rank 0's streams alone: derive one from the progress
            torch.manual_seed(self.config.seed + 7919 * self.rank + self.samples_done)
        if self.rank == 0:
            print(
                f"icefrog trainer: resumed from checkpoint {number} (epoch {self.epoch}, "
                f"{self.samples_done} samples, {self.world} processes, was {state['world']})",
                file=sys.stderr,
            )
