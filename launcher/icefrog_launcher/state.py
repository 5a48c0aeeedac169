"""The user's objects in the checkpoint: anything with ``state_dict()`` and
``load_state_dict()`` (an LR scheduler, a ``torch.amp.GradScaler``, EMA weights, counters).

    trainer = Trainer(model, optimizer, data, scheduler=sched, scaler=scaler)
    trainer.register_state("ema", ema)          # before the first epoch

As ``adaptdl.torch``'s ``State`` (a name, save and load) and TorchElastic's checkpoint
examples (one dictionary of state_dicts): each object is saved under its name with rank 0's
state at every checkpoint, and restored on every rank when it is registered, whatever
the process count was. A name comes once and before the first epoch. A checkpoint naming an
object nothing registered (the script dropped it) is warned about and ignored; an object the
checkpoint does not have (added since) is warned about and keeps its fresh state. A
state that would not load with ``weights_only=True`` is refused, naming the object, when it
is registered and at every save (icefrog_launcher.checkpoint.check_loadable).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from icefrog_launcher import checkpoint
from icefrog_slurm.errors import InputError

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@runtime_checkable
class Stateful(Protocol):
    """What can be registered: torch's own convention (schedulers, GradScaler, modules)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


class StateRegistry:
    """The registered objects by name, and the checkpoint's states not yet handed out.
    ``verbose``: print the warnings (rank 0 only, so they appear once)."""

    def __init__(self, *, verbose: bool = True) -> None:
        self.objects: dict[str, Stateful] = {}
        self._saved: dict[str, Any] | None = None  # None: no checkpoint was loaded
        self._closed = False
        self._verbose = verbose

    def register(self, name: str, obj: object) -> None:
        if self._closed:
            raise InputError(
                f"register_state({name!r}): register objects before the first epoch starts "
                "(they are restored from the checkpoint when registered)"
            )
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InputError(
                f"register_state: name {name!r}: 1-64 letters, digits, '_', '.' or '-'"
            )
        if name in self.objects:
            raise InputError(f"register_state({name!r}): that name is already registered")
        if not isinstance(obj, Stateful):
            raise InputError(
                f"register_state({name!r}): a {type(obj).__name__} has no "
                "state_dict()/load_state_dict()"
            )
        for other, known in self.objects.items():
            if known is obj:
                raise InputError(f"register_state({name!r}): already registered as {other!r}")
        checkpoint.check_loadable(f"register_state({name!r})", obj.state_dict())
        self.objects[name] = obj
        if self._saved is None:
            return
        if name in self._saved:
            obj.load_state_dict(self._saved.pop(name))
        else:
            self._warn(f"the checkpoint has no state for {name!r}: it starts fresh")

    def restore(self, saved: object) -> None:
        """A checkpoint's states: given to the objects registered so far, kept for those
        registered later (anything but a dictionary of them: none, with a warning)."""
        if not isinstance(saved, Mapping) or not all(isinstance(k, str) for k in saved):
            self._warn("the checkpoint's registered states are not a dictionary: none restored")
            saved = {}
        self._saved = dict(saved)
        for name, obj in self.objects.items():
            if name in self._saved:
                obj.load_state_dict(self._saved.pop(name))
            else:
                self._warn(f"the checkpoint has no state for {name!r}: it starts fresh")

    def close(self) -> None:
        """The first epoch starts: no more registrations; states nothing claimed are dropped."""
        if self._closed:
            return
        self._closed = True
        for name in sorted(self._saved or {}):
            self._warn(f"the checkpoint's state {name!r} belongs to no registered object: ignored")
        self._saved = {} if self._saved is not None else None

    def state_dict(self) -> dict[str, Any]:
        """Every object's state, each checked to load with ``weights_only=True``."""
        out = {}
        for name, obj in self.objects.items():
            state = obj.state_dict()
            checkpoint.check_loadable(f"register_state({name!r})", state)
            out[name] = state
        return out

    def _warn(self, text: str) -> None:
        if self._verbose:
            print(f"icefrog trainer: warning: {text}", file=sys.stderr)
