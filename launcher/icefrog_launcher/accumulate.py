"""Gradient accumulation for a job that keeps a global batch (``--global-batch B``).

On ``a`` processes the per-GPU batch is m = ``protocol.fixed_per_gpu_batch(B, a, lo, hi)``
and an optimizer step takes k = ``protocol.accumulation_steps(B, a, m)`` micro-steps: the one
rule the estimator and the simulator plan with. The user's loop does not change
(``for x, y in trainer.loader: optimizer.zero_grad(); loss.backward(); optimizer.step()``);
the trainer makes the micro-steps transparent:

- the loader hands out micro-batches of m a process, in one global order, so the samples of
  an optimizer step are the same set on any process count;
- ``optimizer.step()`` does nothing on all but the last micro-step of a step; while k > 1
  ``optimizer.zero_grad()`` does nothing either: the trainer zeroes the gradients itself when
  it hands out the first micro-batch of a step;
- autograd scales each micro-step's gradient as it accumulates it (a hook on every trainable
  parameter) by the micro-batch's share of the process's samples in the step (1/k when the
  micro-batches are full), so the step's gradient is the mean over its k x a x m samples
  (loss terms on the parameters themselves included), and what the loop reads between
  backward and step (gradient clipping, a GradScaler's unscale) is already that mean;
- DDP all-reduces on the last micro-step only (the earlier forwards run under ``no_sync``);
- the ``scheduler`` and ``scaler`` given to the Trainer step with the optimizer: their
  ``step()`` (and the scaler's ``update()`` and ``unscale_()``) do nothing on the other
  micro-steps, so the AMP loop may call ``scaler.unscale_(optimizer)`` at every
  micro-step: it unscales the whole step's gradient once, on its last micro-step. Gradient
  clipping (anything that reads or changes the gradient as a whole) belongs under
  ``if not trainer.accumulating:``: on the other micro-steps the gradients hold a part of
  the step's (and, with a scaler, still scaled); an ``unscale_`` on such a micro-step is
  warned about once, as the sign of a loop that clips there.

An epoch's last step has fewer or smaller micro-batches when fewer samples are left; the
shares keep its gradient the mean over its own samples. ``step`` and ``zero_grad`` are
replaced on the optimizer object itself (as torch's LR schedulers wrap
``optimizer.step``), only for a job with a global batch.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from icefrog_launcher.data import local_count, step_counts

Method = Callable[..., Any]


class Accumulation:
    """Where the current micro-batch stands in its optimizer step."""

    def __init__(self, *, verbose: bool = True) -> None:
        self.verbose = verbose  # print the warning (rank 0 only, so it appears once)
        self.warned = False  # an unscale_ on a micro-step not ending its step was warned of
        self.steps = 1  # k: micro-steps an optimizer step
        self.group = 1  # micro-steps of the current optimizer step (fewer at an epoch's end)
        self.index = 0  # the next micro-batch's place in its step: 0 = a step starts
        self.final = True  # the current micro-batch ends its optimizer step
        self.samples = 0  # this process's samples in the current optimizer step
        self.factor = 1.0  # the current micro-batch's share of them (its gradient's scale)
        self._zero: Method | None = None  # the optimizer's own zero_grad
        self._params: list[torch.Tensor] = []
        self._hooks: list[RemovableHandle] = []

    @property
    def at_boundary(self) -> bool:
        """Between two optimizer steps (no gradient of a step in progress)."""
        return self.index == 0

    def install(self, optimizer: torch.optim.Optimizer, held: Iterable[object]) -> None:
        """Take over ``optimizer``'s step and zero_grad, and the step/update of ``held``."""
        self._zero = optimizer.zero_grad
        _replace(optimizer, "step", self._held)
        _replace(optimizer, "zero_grad", self._zero_grad)
        for obj in held:
            _hold(obj, self)

    def set_steps(self, steps: int) -> None:
        """k for the steps from now on (an epoch boundary)."""
        self.steps, self.group, self.index, self.final = max(1, steps), 1, 0, True
        self.watch(self._params)

    def watch(self, params: Iterable[torch.Tensor]) -> None:
        """The trainable parameters (after a freeze change): scale their gradients while k > 1."""
        self._params = list(params)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.steps > 1:
            self._hooks = [p.register_hook(self._scale) for p in self._params if p.requires_grad]

    def begin(self, local: int, counts: Callable[[], list[int]]) -> None:
        """A micro-batch of ``local`` samples is handed out; ``counts()``: this process's
        samples in each micro-batch of the step it starts (asked at a step's start only)."""
        if self.index == 0:
            shares = (counts() or [local]) if self.steps > 1 else [local]
            self.group, self.samples = len(shares), sum(shares)
            if self.steps > 1 and self._zero is not None:
                self._zero(set_to_none=True)
        self.factor = local / self.samples if self.samples > 0 else 1.0
        self.final = self.index >= self.group - 1
        self.index = 0 if self.final else self.index + 1

    def zero_grad(self, original: Method, *args: Any, **kwargs: Any) -> Any:
        """``original`` (a zero_grad) unless gradients accumulate (the trainer zeroes them)."""
        return None if self.steps > 1 else original(*args, **kwargs)

    def held_unscale(self) -> None:
        """A held object's ``unscale_`` was called on a micro-step that does not end its
        optimizer step: it did nothing; say once what that means for clipping."""
        if self.verbose and not self.warned:
            print(
                "icefrog trainer: warning: scaler.unscale_() before the last micro-step of "
                f"an optimizer step ({self.steps} micro-steps a step: --global-batch) does "
                "nothing; the last one unscales the whole step's gradient. Clip gradients "
                "only when not trainer.accumulating: before, they hold a part of the "
                "step's gradient, still scaled",
                file=sys.stderr,
            )
        self.warned = True

    def _scale(self, grad: torch.Tensor) -> torch.Tensor | None:
        return grad * self.factor if self.factor != 1.0 else None

    def _held(self, original: Method) -> Method:
        def call(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **kwargs) if self.final else None

        return call

    def _zero_grad(self, original: Method) -> Method:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.zero_grad(original, *args, **kwargs)

        return call


def group_counts(left: int, step: int, world: int, rank: int, steps: int) -> list[int]:
    """Rank ``rank``'s samples in each micro-batch of an optimizer step of ``steps``
    micro-steps that starts with ``left`` samples left in the epoch, ``step`` a micro-step
    (the loader's rule, icefrog_launcher.data: full steps, then a remainder of at least
    ``world``)."""
    counts = step_counts(min(left, steps * step), step, world)
    return [local_count(c, rank, world) for c in counts]


def _hold(obj: object, accumulation: Accumulation) -> None:
    """``obj``'s step(), update() and unscale_() do nothing while the micro-step is not the
    last. Done by a subclass of its own class, not by attributes of the object: a
    scheduler's state_dict() is its ``__dict__``, which must stay free of them."""
    cls = type(obj)
    names = [n for n in ("step", "update", "unscale_") if callable(getattr(cls, n, None))]

    def held(name: str) -> Method:
        def method(self: object, *args: Any, **kwargs: Any) -> Any:
            if not accumulation.final:
                if name == "unscale_":
                    accumulation.held_unscale()
                return None
            return getattr(super(subclass, self), name)(*args, **kwargs)

        return method

    subclass = type(cls.__name__, (cls,), {n: held(n) for n in names})
    subclass.__qualname__ = cls.__qualname__
    subclass.__module__ = cls.__module__
    obj.__class__ = subclass


def _replace(obj: object, name: str, wrap: Callable[[Method], Method]) -> None:
    """Replace ``obj.name`` by ``wrap(obj.name)``, as a method of ``obj`` (torch's LR
    schedulers re-bind ``optimizer.step.__func__`` to the optimizer when they wrap it)."""
    original = getattr(obj, name)
    inner = wrap(original)

    def method(_self: object, *args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs)

    if hasattr(original, "_wrapped_by_lr_sched"):  # keep the mark a scheduler looks for
        method._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    setattr(obj, name, types.MethodType(method, obj))
