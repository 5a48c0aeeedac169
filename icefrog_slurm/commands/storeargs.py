"""What the report commands share: where the store is, opening it read-only, the output.

Any user runs the reports, so the database URL comes from places a user can read, first
found wins (command-line options before the environment, as in Slurm's own tools):

1. ``--db URL``;
2. ``--config FILE``: its ``[reports] url``, else its ``store.url``;
3. the environment variable ``ICEFROG_DB``;
4. the reports file, ``ICEFROG_REPORTS_CONFIG`` or else ``/etc/icefrog/reports.toml`` when
   it exists: its ``[reports] url`` when set;
5. the controller's ``/etc/icefrog/icefrog.toml`` when it exists: ``[reports] url``, else
   ``store.url``; a file the user may not read (mode 0600, as when it holds a password) is
   one line saying what to set instead, exit 2;
6. the default store, ``sqlite:////var/lib/icefrog/icefrog.db``.

The store is opened read-only (``store/readonly.py``): nothing is written or created, and a
SQLite file that does not exist is an error. The ``[reports]`` table that applies is the one
of the file the URL came from (of the reports file in step 5; defaults for ``--db`` and
``ICEFROG_DB``).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from icefrog_slurm.commands.db import DEFAULT_CONFIG, sqlite_file
from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import ReportsSettings, Settings, load_settings
from icefrog_slurm.store.sql import SqlStore

CONTROLLER_CONFIG = DEFAULT_CONFIG
"""The controller's settings file, read when nothing else names the database."""
REPORTS_CONFIG = "/etc/icefrog/reports.toml"
"""The settings file every user may read: ``[reports] url`` (docs/admin-guide.md)."""
ENV_DB = "ICEFROG_DB"
ENV_REPORTS_CONFIG = "ICEFROG_REPORTS_CONFIG"
_WHAT_TO_SET = (
    f"give --db URL or set {ENV_DB}=URL, or ask your administrator for a reports file "
    f"({REPORTS_CONFIG}, [reports] url; see docs/user-guide.md)"
)


@dataclass(frozen=True)
class ReportSource:
    """Where a report reads: the URL, what chose it, and the ``[reports]`` table."""

    url: str
    origin: str
    reports: ReportsSettings


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--config",
        metavar="FILE",
        help=f"settings file: [reports] url, else store.url (default {REPORTS_CONFIG}, "
        f"then {CONTROLLER_CONFIG})",
    )
    source.add_argument(
        "--db", dest="url", metavar="URL", help=f"database URL (overrides ${ENV_DB})"
    )


def report_source(
    *, db: str | None, config: str | None, environ: Mapping[str, str] | None = None
) -> ReportSource:
    """The database a report reads (module docstring); InputError naming what is wrong."""
    env = os.environ if environ is None else environ
    if db is not None:
        return ReportSource(db, "--db", ReportsSettings())
    if config is not None:
        settings = _load(config, why="--config")
        return ReportSource(settings.reports.url or settings.store.url, config, settings.reports)
    if ENV_DB in env:
        if not env[ENV_DB].strip():
            raise InputError(f"{ENV_DB} is set but empty: unset it or set it to a database URL")
        return ReportSource(env[ENV_DB], ENV_DB, ReportsSettings())
    reports: ReportsSettings | None = None
    named = env.get(ENV_REPORTS_CONFIG)
    if named is not None:
        if not named:
            raise InputError(f"{ENV_REPORTS_CONFIG} is set but empty: unset it or name a file")
        reports = _load(named, why=ENV_REPORTS_CONFIG).reports
    elif _present(REPORTS_CONFIG):
        reports = _load(REPORTS_CONFIG, why="reports file").reports
    if reports is not None and reports.url:
        return ReportSource(reports.url, named or REPORTS_CONFIG, reports)
    if _present(CONTROLLER_CONFIG):
        settings = _load(CONTROLLER_CONFIG, why="controller settings")
        url = settings.reports.url or settings.store.url
        return ReportSource(url, CONTROLLER_CONFIG, reports or settings.reports)
    return ReportSource(Settings().store.url, "default", reports or ReportsSettings())


def _present(path: str) -> bool:
    """Whether ``path`` is there; one the user may not even look at counts as there, so
    that reading it says why it cannot be read."""
    try:
        os.stat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _load(path: str, *, why: str) -> Settings:
    """The settings file ``path``; a file the user may not read is one line saying what to
    set instead, a FIFO or device (opening it could wait for ever) is refused; any other
    fault is ``load_settings``'s line naming it."""
    shown = printable(path, 200)
    try:
        mode = os.stat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise InputError(f"{shown} ({why}): not a plain file")
        with open(path, "rb"):
            pass
    except PermissionError:
        raise InputError(f"{shown} ({why}): not readable by you: {_WHAT_TO_SET}") from None
    except OSError:
        pass  # missing, a folder...: load_settings names the fault
    return load_settings(path)


def open_store(args: argparse.Namespace) -> SqlStore:
    """The store the report reads, opened read-only (module docstring)."""
    return open_source(report_source(db=args.url, config=args.config))


def open_source(source: ReportSource) -> SqlStore:
    """``source``'s store, read-only; a SQLite file that is not there is an InputError."""
    path = sqlite_file(source.url)
    if path is not None and not path.is_file():
        origin = "" if source.origin in ("--db", "default") else f" (from {source.origin})"
        raise InputError(
            f"no state store at {path}{origin}: give --db or --config, "
            "or create it with `icefrog db upgrade`"
        )
    return SqlStore(source.url, readonly=True)


def now() -> float:
    """The report's current time (the one clock read of a report command)."""
    return time.time()


def print_lines(lines: Iterable[str]) -> None:
    """``lines`` on stdout, flushed; a reader that left (``| head``) raises BrokenPipeError,
    which ends the command quietly in ``cli.main`` (also ``squeue -i``'s loop)."""
    for line in lines:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


def print_json(value: Any) -> None:
    print_lines([json.dumps(value, indent=2)])
