"""Run ``icefrog controller`` and SIGKILL it at a chosen point (for the kill tests only).

    python -m tests.integration.controller.kill_runner --at REGEX [--nth N] -- ARGS...

``ARGS`` are ``icefrog controller``'s own. The process kills itself at the N-th point whose
name matches REGEX (``re.fullmatch``). The points, by name:

- ``<action>:done`` and ``<action>:logged``, ``link:logged``: a reconcile step (a Slurm
  command returned; its outcome logged), from the controller's ``after_step`` hook, which
  :func:`watch_steps` hands to the controller the command builds;
- ``decision:temp``: decision.json's temporary file is complete, not yet renamed;
- ``run:<tool>`` / ``run:scontrol <subcommand>``: one Slurm command returned, also inside a
  backend method (``run:scontrol release`` is between the release and the ``StartTime=now``
  of ``release_now``; ``run:sbatch`` between a resubmission's sbatch and its scancel);
- ``drain:commit``: a store transaction inside a drain of the report inbox committed.

The same pieces (:func:`killer`, :func:`watch_commands`, :func:`watch_drains`) serve
tests that run a controller in a forked child.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from icefrog_slurm.commands import controller

Hook = Callable[[str], None]
RECONCILE_STEPS = r"[a-z_]+:(done|logged)"
_SLURM_TOOLS = frozenset({"sbatch", "scontrol", "scancel", "squeue", "sinfo", "sacct"})


def killer(at: str, nth: int = 1) -> Hook:
    """A hook that SIGKILLs this process at the ``nth`` point matching ``at``."""
    pattern, seen = re.compile(at), [0]

    def hook(point: str) -> None:
        if pattern.fullmatch(point):
            seen[0] += 1
            if seen[0] >= nth:
                print(f"kill_runner: killed at {point} (#{seen[0]})", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


def command_point(argv: object) -> str | None:
    """``run:`` point name of a command line (``setpriv ... -- sbatch`` is ``sbatch``)."""
    if not isinstance(argv, (list, tuple)):
        return None
    words = [os.path.basename(str(a)) for a in argv]
    for i, word in enumerate(words):
        if word in _SLURM_TOOLS:
            rest = words[i + 1 : i + 2] if word == "scontrol" else []
            return " ".join([word, *(w for w in rest if not w.startswith("-"))])
    return None


def watch_commands(hook: Hook) -> None:
    """Call ``hook("run:...")`` after each Slurm command this process runs."""
    real = subprocess.run

    def run(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        point = command_point(args[0] if args else kwargs.get("args"))
        if point is not None:
            hook(f"run:{point}")
        return result

    subprocess.run = run  # type: ignore[assignment]


def watch_steps(hook: Hook) -> None:
    """Give ``icefrog controller``'s controller and job files ``hook`` as their
    ``after_step`` (reconcile steps, ``decision:temp``); the command never sets one."""
    for name in ("Controller", "FsJobFiles"):  # the names commands.controller builds them by
        setattr(controller, name, functools.partial(getattr(controller, name), after_step=hook))


def watch_drains(hook: Hook) -> None:
    """Call ``hook("drain:commit")`` after each store transaction a drain commits."""
    from icefrog_slurm.store.inbox import ReportInbox
    from icefrog_slurm.store.sql import SqlStore

    draining = [False]
    real_drain, real_transaction = ReportInbox.drain, SqlStore.transaction

    def drain(self: ReportInbox) -> Any:
        draining[0] = True
        try:
            return real_drain(self)
        finally:
            draining[0] = False

    @contextmanager
    def transaction(self: SqlStore, **kwargs: Any) -> Iterator[Any]:
        with real_transaction(self, **kwargs) as tx:
            yield tx
        if draining[0]:
            hook("drain:commit")

    ReportInbox.drain = drain  # type: ignore[method-assign]
    SqlStore.transaction = transaction  # type: ignore[assignment,method-assign]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="kill_runner")
    parser.add_argument("--at", required=True, help="regular expression of point names")
    parser.add_argument("--nth", type=int, default=1, help="kill at the N-th match")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- icefrog controller's")
    ns = parser.parse_args(argv)
    rest = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    hook = killer(ns.at, ns.nth)
    watch_commands(hook)
    watch_steps(hook)
    watch_drains(hook)
    ctl = argparse.ArgumentParser(prog="icefrog controller")
    controller.add_arguments(ctl)
    return controller.run(ctl.parse_args(rest))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
