"""The hooks that measure a training step: the per-layer gradient statistics (spec eq 3's
variances, icefrog_launcher.stats) and the profile of (a, m) (spec section 9, step 2,
icefrog_launcher.profiler), which the trainer reports once an epoch.

Which steps are measured: the statistics every ``stats_every`` optimizer steps (with one
replica also the step after, for the pair estimator), the timings every ``profile_every``;
only steps whose micro-batches are all full. The DDP communication hook takes each
bucket's local gradient norms before the all-reduce overwrites them; the optimizer's step
pre-hook closes the step (its averaged gradients, its end time).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from icefrog_launcher.profiler import StepTimer, peak_memory_bytes, utilization
from icefrog_launcher.stats import GradStatsCollector
from icefrog_slurm.core.samples import ProfileSample

if TYPE_CHECKING:  # torch.distributed re-exports it without marking it public
    from torch._C._distributed_c10d import GradBucket


class StepProbes:
    """Timer, statistics and the flags saying whether the current step feeds them."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        device: torch.device,
        *,
        world: int,
        stats_every: int,
        profile_every: int,
    ) -> None:
        self.timer = StepTimer(device)
        self.stats = GradStatsCollector(len(layers), stats_every)
        self.world = world
        self.profile_every = max(1, profile_every)
        self.synced_numel = 0  # gradient elements all-reduced so far (frozen ones never are)
        self.measuring = False  # this step feeds the gradient statistics
        self.timing = False  # this step is timed (synchronising CUDA at the marks)
        self.last_profile: ProfileSample | None = None
        self.layer_of = {id(p): i for i, layer in enumerate(layers) for p in layer.parameters()}
        self._bucket_index: dict[tuple[int, ...], torch.Tensor] = {}  # DDP bucket -> layers
        self._params: list[torch.Tensor] = []
        self._index = torch.zeros(0, dtype=torch.long)

    def plan(self, step: int) -> None:
        """Whether optimizer step ``step`` (the next one) is measured and timed."""
        self.measuring = self.stats.measuring(step, self.world)
        self.timing = step % self.profile_every == 0

    def micro_batch(self, full: bool) -> None:
        """A micro-batch of the step is handed out: a step with one not full is neither."""
        self.measuring, self.timing = self.measuring and full, self.timing and full

    def watch(self, trainable: Sequence[torch.Tensor]) -> None:
        """The trainable parameters (after a freeze change) whose layers are measured."""
        index = [self.layer_of.get(id(p), -1) for p in trainable]
        self._params = [p for p, i in zip(trainable, index, strict=True) if i >= 0]
        self._index = torch.tensor([i for i in index if i >= 0], dtype=torch.long)

    # -- hooks -----------------------------------------------------------------------
    def now(self) -> float:
        return self.timer.now() if self.timing else time.perf_counter()

    def backward_started(self, grad: torch.Tensor) -> None:
        self.timer.bwd_start = time.perf_counter()

    def comm_hook(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        self.timer.last_bucket = time.perf_counter()
        self.synced_numel += bucket.buffer().numel()
        if self.measuring:
            pairs = [
                (self.layer_of[id(p)], g)
                for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)
                if id(p) in self.layer_of
            ]
            if pairs:
                layers = tuple(i for i, _ in pairs)
                index = self._bucket_index.get(layers)
                if index is None:
                    index = self._bucket_index[layers] = torch.tensor(layers, dtype=torch.long)
                self.stats.add_local(index, [g for _, g in pairs])
        group = dist.group.WORLD  # the group allreduce_hook takes for None
        assert group is not None  # DDP exists only in an initialised process group
        return default_hooks.allreduce_hook(group, bucket)

    def before_step(self, *, step: int, local_batch: int) -> None:
        """The optimizer is about to step: ``local_batch`` samples behind this replica's
        gradient (k x m with accumulation)."""
        end = self.now()
        if self.measuring and self._params:
            grads = [p.grad for p in self._params if p.grad is not None]
            if len(grads) == len(self._params):
                self.stats.finish_step(
                    self._index, grads, step=step, local_batch=local_batch, world=self.world
                )
        self.timer.record(end, self.timing)

    # -- per epoch -------------------------------------------------------------------
    def profile(
        self, *, batch: int, frozen: int, shared: bool, device: torch.device, micro_steps: int
    ) -> dict[str, object] | None:
        """The epoch's profile report (None when no step was timed), for a micro-step of
        (world, batch): an optimizer step's iteration and sync (one all-reduce) over its
        ``micro_steps``; forward and backward are the last micro-step's (docs/trainer.md)."""
        means = self.timer.take()
        if means is None or means["iter"] <= 0:
            return None
        t_iter = means["iter"] / micro_steps
        sample = ProfileSample(
            gpus=self.world,
            batch=batch,
            frozen=frozen,
            shared=shared,
            t_fwd_s=means["fwd"],
            t_bwd_s=max(means["bwd"], 0.0),
            t_sync_s=max(means["sync"], 0.0) / micro_steps,
            t_iter_s=t_iter,
            samples_per_s=self.world * batch / t_iter,
            peak_mem_bytes=peak_memory_bytes(device),
            gpu_util=utilization(device, means["cpu"], means["iter"]),
        )
        self.last_profile = sample
        return {"samples": [dataclasses.asdict(sample)]}
