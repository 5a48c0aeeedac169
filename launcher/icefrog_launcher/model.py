"""``trainer.model``: what the training loop calls instead of its own model.

It calls the current DDP wrapper (rebuilt when the freeze depth changes) or, with one
process, the bare model; runs the forward under DDP's ``no_sync`` on a micro-step that does
not end an optimizer step (icefrog_launcher.accumulate), so the all-reduce happens once a
step; and sets the profile's forward marks and the hook that marks the start of backward
(icefrog_launcher.probes). Other attributes (``train``, ``eval``, ``parameters``...) are
the model's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from icefrog_launcher.accumulate import Accumulation
from icefrog_launcher.probes import StepProbes


class ElasticModel:
    """The model as the loop sees it; ``ddp()``: the current DDP wrapper, if any."""

    def __init__(
        self,
        module: nn.Module,
        ddp: Callable[[], DistributedDataParallel | None],
        accumulation: Accumulation,
        probes: StepProbes,
    ) -> None:
        self._module, self._ddp = module, ddp
        self._accumulation, self._probes = accumulation, probes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        probes, ddp = self._probes, self._ddp()
        probes.timer.fwd_start = probes.now()
        if ddp is not None and not self._accumulation.final:  # all-reduce on the last only
            with ddp.no_sync():
                out = ddp(*args, **kwargs)
        else:
            out = (ddp or self._module)(*args, **kwargs)
        probes.timer.fwd_end = probes.now()
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(probes.backward_started)
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The model's zero_grad, which does nothing while gradients accumulate (as the
        optimizer's: icefrog_launcher.accumulate)."""
        self._accumulation.zero_grad(self._module.zero_grad, set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)
