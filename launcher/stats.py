"""Per-layer gradient statistics and the frozen penalty they feed (spec sections 5 and 13).

For layer ``i``, ``grad_var[i]`` estimates tr(Sigma_i), the trace of the per-sample gradient
covariance of the layer's parameters, and ``grad_sqr[i]`` estimates |G_i|^2, the squared
norm of the true gradient. Both are measured every ``every`` steps and averaged over the
epoch; measuring costs a few vector norms (see benchmarks/trainer.py for the overhead).

Two estimators, both from gradients the step computes anyway:

- several replicas (Pollux): a replica's gradient g_m over its m samples and the all-reduced
  g_B over B = n*m samples satisfy E|g_b|^2 = |G|^2 + tr(Sigma)/b, so
  ``tr(Sigma) = (mean_r |g_m,r|^2 - |g_B|^2) / (1/m - 1/B)`` and
  ``|G|^2 = |g_B|^2 - tr(Sigma)/B``. The local norms are taken in the DDP communication
  hook, before the all-reduce overwrites the bucket.
- one replica: two consecutive steps' gradients g1, g2 (batch m each, independent samples):
  ``tr(Sigma) = m |g1 - g2|^2 / 2`` and ``|G|^2 = <g1, g2>``.

For a frozen layer the reported values are those from the epoch before it was frozen
(spec eq 3 uses sigma^2_t0 of the frozen prefix at freeze time t0).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from icefrog_slurm.core.penalty import frozen_penalty


class GradStatsCollector:
    """Accumulates per-layer gradient variance and squared norm over an epoch."""

    def __init__(self, num_layers: int, every: int = 8) -> None:
        self.num_layers = num_layers
        self.every = every  # <= 0: statistics off
        self._sum_var = torch.zeros(num_layers, dtype=torch.float64)
        self._sum_sqr = torch.zeros(num_layers, dtype=torch.float64)
        self._count = torch.zeros(num_layers, dtype=torch.float64)
        self.last_var = [0.0] * num_layers  # the latest epoch's values (all layers)
        self.last_sqr = [0.0] * num_layers
        self.frozen_var = [0.0] * num_layers  # values at freeze time (eq 3's sigma^2_t0)
        self.frozen_sqr = [0.0] * num_layers
        self._local = torch.zeros(num_layers, dtype=torch.float64)
        self._previous: list[torch.Tensor] | None = None  # one-replica estimator

    # -- per step --------------------------------------------------------------------
    def measuring(self, step: int, world: int) -> bool:
        """Whether this step is measured (and, with one replica, the step after it)."""
        if self.every <= 0:
            return False
        return step % self.every == 0 or (world == 1 and step % self.every == 1)

    def add_local(self, layer_index: torch.Tensor, grads: list[torch.Tensor]) -> None:
        """Add squared norms of local gradients (called in the DDP hook, pre all-reduce)."""
        if grads:
            norms = torch.stack(torch._foreach_norm(grads)).double() ** 2
            self._local.index_add_(0, layer_index, norms.cpu())

    def finish_step(
        self,
        layer_index: torch.Tensor,
        grads: list[torch.Tensor],
        *,
        step: int,
        local_batch: int,
        world: int,
        group: Any = None,
    ) -> None:
        """Turn the step's (averaged) gradients into one estimate per measured layer."""
        if self.every <= 0:
            return
        if world > 1:
            self._finish_pollux(layer_index, grads, local_batch, world, group)
        elif step % self.every == 0:
            self._previous = [g.detach().clone() for g in grads]
        elif self._previous is not None and len(self._previous) == len(grads):
            self._finish_pair(layer_index, grads, local_batch)

    def _finish_pollux(
        self, index: torch.Tensor, grads: list[torch.Tensor], m: int, n: int, group: Any
    ) -> None:
        import torch.distributed as dist

        local = self._local.clone()
        self._local.zero_()
        dist.all_reduce(local, group=group)
        local /= n
        total = torch.zeros(self.num_layers, dtype=torch.float64)
        total.index_add_(0, index, torch.stack(torch._foreach_norm(grads)).double().cpu() ** 2)
        big = m * n
        var = (local - total) / (1.0 / m - 1.0 / big)
        sqr = total - var / big
        self._add(index, var, sqr)

    def _finish_pair(self, index: torch.Tensor, grads: list[torch.Tensor], m: int) -> None:
        assert self._previous is not None
        diffs = torch._foreach_sub(grads, self._previous)
        dots = [torch.sum(a * b) for a, b in zip(grads, self._previous, strict=True)]
        self._previous = None
        var = torch.zeros(self.num_layers, dtype=torch.float64)
        sqr = torch.zeros(self.num_layers, dtype=torch.float64)
        var.index_add_(0, index, torch.stack(torch._foreach_norm(diffs)).double().cpu() ** 2)
        sqr.index_add_(0, index, torch.stack(dots).double().cpu())
        self._add(index, var * (m / 2.0), sqr)

    def _add(self, index: torch.Tensor, var: torch.Tensor, sqr: torch.Tensor) -> None:
        seen = torch.zeros(self.num_layers, dtype=torch.float64)
        seen[index] = 1.0
        self._sum_var += var * seen
        self._sum_sqr += sqr * seen
        self._count += seen

    # -- per epoch -------------------------------------------------------------------
    def end_epoch(self, frozen: int) -> tuple[list[float], list[float]]:
        """The epoch's (grad_var, grad_sqr): frozen layers keep their at-freeze values."""
        for i in range(self.num_layers):
            if self._count[i] > 0:
                self.last_var[i] = max(float(self._sum_var[i] / self._count[i]), 0.0)
                self.last_sqr[i] = max(float(self._sum_sqr[i] / self._count[i]), 0.0)
        self._sum_var.zero_()
        self._sum_sqr.zero_()
        self._count.zero_()
        var = self.frozen_var[:frozen] + self.last_var[frozen:]
        sqr = self.frozen_sqr[:frozen] + self.last_sqr[frozen:]
        return var, sqr

    def freeze_changed(self, old: int, new: int) -> None:
        """Layers old..new-1 become frozen: remember their latest values (eq 3's t0)."""
        for i in range(old, new):
            self.frozen_var[i] = self.last_var[i]
            self.frozen_sqr[i] = self.last_sqr[i]

    def penalty(self, frozen: int) -> float:
        """psi (spec eq 3, icefrog_slurm.core.penalty): the at-freeze variances of the frozen
        prefix against the latest ones of the trainable suffix (estimates clipped at 0)."""
        if frozen <= 0:
            return 1.0
        prefix = math.fsum(max(v, 0.0) for v in self.frozen_var[:frozen])
        suffix = math.fsum(max(v, 0.0) for v in self.last_var[frozen:])
        return frozen_penalty(prefix, suffix)

    def state_dict(self) -> dict[str, list[float]]:
        return {
            "last_var": list(self.last_var),
            "last_sqr": list(self.last_sqr),
            "frozen_var": list(self.frozen_var),
            "frozen_sqr": list(self.frozen_sqr),
        }

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        for key in ("last_var", "last_sqr", "frozen_var", "frozen_sqr"):
            values = [float(v) for v in state[key]]
            if len(values) == self.num_layers:
                setattr(self, key, values)
