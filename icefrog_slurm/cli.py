"""The ``icefrog`` command: parse, load settings, wire adapters, call one function.

Each subcommand lives in its own module with ``add_arguments(parser)`` and ``run(args) -> int``;
modules are imported only when their subcommand runs, so ``icefrog tune`` never loads
SQLAlchemy and ``icefrog launch`` (job side, torch) never loads the controller.

Errors end a command in one printable line, ``icefrog COMMAND: error: MESSAGE``: an
:class:`IcefrogError` exits with its code (an InputError, bad input, with 2); a file error no
command foresaw names the file (2 for a bad path, 1 for a system fault such as a full disk);
argparse's own errors exit 2. A reader of the output that left (``icefrog squeue | head -1``)
ends the command quietly with exit code 141, as SIGPIPE ends Slurm's tools. Anything else is
a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import select
import signal
import sys
from collections.abc import Sequence

from icefrog_slurm import __version__
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.jsonio import printable

MAX_MESSAGE = 2000
"""An error line is cut to this many characters (it may quote hostile input)."""
PATH_ERRNOS = frozenset(
    {errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.EACCES, errno.EPERM,
     errno.ENAMETOOLONG, errno.ELOOP}
)  # fmt: skip
"""A file error with one of these is a bad path given by the user (exit 2); any other
(a full disk, an I/O error) exits 1, still as one line naming the file."""

# name -> (module, one-line help). Add a subcommand by adding a line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "tune": ("icefrog_slurm.commands.tune", "Layer Tuner what-if: best batch and freeze depth"),
    "db": ("icefrog_slurm.commands.db", "State store schema: current, history, upgrade, downgrade"),
    "admin": (
        "icefrog_slurm.commands.admin",
        "icefrog admin install-files DEST: the systemd unit, example configs, guides",
    ),
    "trace": ("icefrog_slurm.commands.trace", "Sample evaluation workloads from the Philly trace"),
    "controller": ("icefrog_slurm.commands.controller", "The scheduling daemon (one per cluster)"),
    "squeue": ("icefrog_slurm.commands.squeue", "Active jobs and their latest decision"),
    "sacct": ("icefrog_slurm.commands.sacct", "Accounting of running and finished jobs"),
    "show": ("icefrog_slurm.commands.show", "icefrog show job ID: a job's trajectory"),
    "launch": (
        "icefrog_launcher.cli",
        "Run a training script under torchrun in a Slurm allocation",
    ),
    "submit": (
        "icefrog_slurm.commands.submit",
        "Write a training job's batch script, submit it held",
    ),
    "solve": ("icefrog_slurm.commands.solve", "One IceShare round: who waits, runs, shares"),
    "simulate": ("icefrog_slurm.commands.simulate", "Trace-driven simulation of the policies"),
    "evaluate": (
        "icefrog_slurm.commands.evaluate",
        "The evaluation tables: simulations, resumable",
    ),
}


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = argparse.ArgumentParser(
        prog="icefrog",
        description="ICEFROG on Slurm: layer freezing as a scheduling variable.",
    )
    parser.add_argument("--version", action="version", version=f"icefrog {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sp)
            sp.set_defaults(_run=module.run, _parser=sp)
    return parser, chosen


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; its :class:`IcefrogError` becomes one line on stderr and the
    error's exit code (2 for bad input; argparse's own errors exit 2 as well)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser, _ = build_parser(args_list)
    args, extra = parser.parse_known_args(args_list)
    if extra:  # the subcommand's usage, not the top level's (exits 2)
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    run = getattr(args, "_run", None)
    if run is None:
        parser.error("give a COMMAND (icefrog --help lists them)")
    try:
        code: int = run(args)
        sys.stdout.flush()  # here, so that a reader who left is seen here too
    except BrokenPipeError:
        if not _stdout_reader_left():
            raise  # a pipe of the command's own (a child's stdin): a bug, let it show
        return _quiet_stdout()
    except IcefrogError as exc:
        return _fail(args.command, str(exc), exc.exit_code)
    except OSError as exc:
        if exc.filename is None:  # not about a path the user gave: a bug, let it show
            raise
        where = f"{exc.filename}" + ("" if exc.filename2 is None else f" -> {exc.filename2}")
        code = 2 if exc.errno in PATH_ERRNOS else 1
        return _fail(args.command, f"{where}: {exc.strerror or exc}", code)
    except KeyboardInterrupt:
        return 130
    return code


SIGPIPE_EXIT = 128 + signal.SIGPIPE
"""The exit code of a command whose output's reader left (``icefrog squeue | head -1``): what
a shell reports for a tool that SIGPIPE ended, as Slurm's own tools are."""


def _stdout_reader_left() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll reports POLLERR)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by an object without a file
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _quiet_stdout() -> int:
    """The reader of stdout left: as Python's documentation recommends (the signal module's
    note on SIGPIPE), point stdout at /dev/null so that the interpreter's last flush of what
    is still buffered does not fail again with a traceback; no message."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_EXIT


def _fail(command: str, message: str, code: int) -> int:
    print(f"icefrog {command}: error: {printable(message, MAX_MESSAGE)}", file=sys.stderr)
    return code
