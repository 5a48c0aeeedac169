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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from icefrog_slurm.core.penalty import frozen_penalty

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class GradStatsCollector:
    """Accumulates per-layer gradient variance and squared norm over an epoch."""

    def __init__(self, num_layers: int, every: int = 8) -> None:
        self.num_layers = num_layers
        self.every = every  # <= 0: statistics off
        self.last_var = [0.0] * num_layers  # the latest epoch's values (all layers)
        self.last_sqr = [0.0] * num_layers
        self.frozen_var = [0.0] * num_layers  # values at freeze time (eq 3's sigma^2_t0)
        self.frozen_sqr = [0.0] * num_layers
        # one-replica estimator: the previous measured step's gradients (a list at run time,
        # a tuple in torch's stubs)
        self._previous: tuple[torch.Tensor, ...] | list[torch.Tensor] | None = None
        self._previous_step = -1  # the step those gradients are of
        # Sums over the epoch, kept on the gradients' device so that measuring a step never
        # waits for the GPU (one copy to the host per epoch, in end_epoch); rows: var, sqr,
        # count, local. Created at the first measured step.
        self._acc: torch.Tensor | None = None
        self._indices: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def _on(self, device: torch.device) -> torch.Tensor:
        if self._acc is None or self._acc.device != device:
            old = self._acc
            self._acc = torch.zeros(4, self.num_layers, dtype=torch.float64, device=device)
            if old is not None:
                self._acc += old.to(device)
        return self._acc

    def _index(self, index: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``index`` on ``device``, copied once per (index tensor, device)."""
        key = (id(index), device)
        hit = self._indices.get(key)
        if hit is None or hit[0] is not index:
            if len(self._indices) > 256:  # callers keep their index tensors; bound it anyway
                self._indices.clear()
            hit = (index, index.to(device))
            self._indices[key] = hit
        return hit[1]

    # -- per step --------------------------------------------------------------------
    def measuring(self, step: int, world: int) -> bool:
        """Whether this step is measured (and, with one replica, the step after it)."""
        if self.every <= 0:
            return False
        return step % self.every == 0 or (world == 1 and step % self.every == 1)

    def add_local(self, layer_index: torch.Tensor, grads: list[torch.Tensor]) -> None:
        """Add squared norms of local gradients (called in the DDP hook, pre all-reduce)."""
        if grads:
            device = grads[0].device
            norms = torch.stack(torch._foreach_norm(grads)).double() ** 2
            self._on(device)[3].index_add_(0, self._index(layer_index, device), norms)

    def finish_step(
        self,
        layer_index: torch.Tensor,
        grads: list[torch.Tensor],
        *,
        step: int,
        local_batch: int,
        world: int,
        group: ProcessGroup | None = None,
    ) -> None:
        """Turn the step's (averaged) gradients into one estimate per measured layer."""
        if self.every <= 0 or not grads:
            return
        if world > 1:
            self._previous = None  # a pair is two steps of one replica
            self._finish_pollux(layer_index, grads, local_batch, world, group)
        elif step % self.every == 0:
            self._previous = torch._foreach_mul(grads, 1.0)  # a copy, in one launch
            self._previous_step = step
        elif (
            self._previous is not None
            and self._previous_step == step - 1
            and len(self._previous) == len(grads)
        ):
            self._finish_pair(layer_index, grads, local_batch)
        else:  # not the step after it (a resume elsewhere): no pair
            self._previous = None

    def _finish_pollux(
        self,
        index: torch.Tensor,
        grads: list[torch.Tensor],
        m: int,
        n: int,
        group: ProcessGroup | None,
    ) -> None:
        import torch.distributed as dist

        device = grads[0].device
        acc, idx = self._on(device), self._index(index, device)
        local = acc[3].clone()  # on the device: NCCL reduces device tensors only
        acc[3].zero_()
        dist.all_reduce(local, group=group)
        local /= n
        total = torch.zeros_like(local)
        total.index_add_(0, idx, torch.stack(torch._foreach_norm(grads)).double() ** 2)
        big = m * n
        var = (local - total) / (1.0 / m - 1.0 / big)
        sqr = total - var / big
        self._add(idx, var, sqr)

    def _finish_pair(self, index: torch.Tensor, grads: list[torch.Tensor], m: int) -> None:
        assert self._previous is not None
        previous, self._previous = self._previous, None
        device = grads[0].device
        if previous[0].device != device:  # restored from a checkpoint
            previous = [g.to(device) for g in previous]
        idx = self._index(index, device)
        # |g1 - g2|^2 and <g1, g2> = (|g1 + g2|^2 - |g1 - g2|^2) / 4, two fused launches each
        diff = torch.stack(torch._foreach_norm(torch._foreach_sub(grads, previous))).double() ** 2
        both = torch.stack(torch._foreach_norm(torch._foreach_add(grads, previous))).double() ** 2
        var = torch.zeros(self.num_layers, dtype=torch.float64, device=device)
        sqr = torch.zeros_like(var)
        var.index_add_(0, idx, diff * (m / 2.0))
        sqr.index_add_(0, idx, (both - diff) / 4.0)
        self._add(idx, var, sqr)

    def _add(self, index: torch.Tensor, var: torch.Tensor, sqr: torch.Tensor) -> None:
        acc = self._on(var.device)
        seen = torch.zeros_like(var)
        seen[index] = 1.0
        acc[0] += var * seen
        acc[1] += sqr * seen
        acc[2] += seen

    # -- per epoch -------------------------------------------------------------------
    def end_epoch(self, frozen: int) -> tuple[list[float], list[float]]:
        """The epoch's (grad_var, grad_sqr): frozen layers keep their at-freeze values."""
        self.last_var, self.last_sqr, _ = self._averages()
        if self._acc is not None:
            self._acc.zero_()
        return self._with_frozen(frozen, self.last_var, self.last_sqr)

    def so_far(self, frozen: int) -> tuple[list[float], list[float]] | None:
        """What :meth:`end_epoch` would return now, the epoch going on (nothing reset); None
        while no step of this epoch has been measured."""
        var, sqr, seen = self._averages()
        return self._with_frozen(frozen, var, sqr) if seen else None

    def _with_frozen(
        self, frozen: int, var: list[float], sqr: list[float]
    ) -> tuple[list[float], list[float]]:
        """The first ``frozen`` layers' at-freeze values, the rest's from ``var``/``sqr``."""
        return self.frozen_var[:frozen] + var[frozen:], self.frozen_sqr[:frozen] + sqr[frozen:]

    def _averages(self) -> tuple[list[float], list[float], bool]:
        """Each layer's averages over the epoch's measured steps (its last values where
        none), and whether any step was measured: one wait for the device."""
        var, sqr, seen = list(self.last_var), list(self.last_sqr), False
        if self._acc is not None:
            sums = self._acc.to("cpu", copy=True)
            for i in range(self.num_layers):
                count = float(sums[2, i])
                if count > 0:
                    var[i] = max(float(sums[0, i]) / count, 0.0)
                    sqr[i] = max(float(sums[1, i]) / count, 0.0)
                    seen = True
        return var, sqr, seen

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

    def state_dict(self) -> dict[str, Any]:
        """The latest and at-freeze values, the sums of the epoch so far (``sums``: var,
        sqr and count per layer; one copy from the device) and, with one replica between a
        measured step and the next, that step's gradients (``previous``, on the CPU): a run
        resumed mid-epoch measures what the uninterrupted one would."""
        sums = self._acc[:3].tolist() if self._acc is not None else []
        previous = [g.cpu() for g in self._previous] if self._previous is not None else []
        return {
            "last_var": list(self.last_var),
            "last_sqr": list(self.last_sqr),
            "frozen_var": list(self.frozen_var),
            "frozen_sqr": list(self.frozen_sqr),
            "sums": sums,
            "previous": previous,
            "previous_step": self._previous_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in ("last_var", "last_sqr", "frozen_var", "frozen_sqr"):
            values = [float(v) for v in state[key]]
            if len(values) == self.num_layers:
                setattr(self, key, values)
        sums = state.get("sums", [])  # a checkpoint from before: none
        self._acc = None
        if len(sums) == 3 and all(len(row) == self.num_layers for row in sums):
            self._acc = torch.zeros(4, self.num_layers, dtype=torch.float64)
            self._acc[:3] = torch.tensor(sums, dtype=torch.float64)
        self._previous = list(state.get("previous", [])) or None
        self._previous_step = int(state.get("previous_step", -1))
