"""What the report commands share: ``--config FILE`` / ``--db URL``, the store, the output.

The database is ``--db URL``, else ``store.url`` of ``--config FILE``, else the defaults
of ``icefrog db upgrade`` (``commands/db.py``: one rule for every command). A SQLite file
that does not exist is an error (opening it would create an empty one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from icefrog_slurm.commands.db import DEFAULT_CONFIG, database_url, sqlite_file
from icefrog_slurm.errors import InputError
from icefrog_slurm.store.sql import SqlStore


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--config", metavar="FILE", help=f"settings file (default {DEFAULT_CONFIG})"
    )
    source.add_argument(
        "--db", dest="url", metavar="URL", help="database URL (overrides the settings file)"
    )


def open_store(args: argparse.Namespace) -> SqlStore:
    url = database_url(args)
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        raise InputError(
            f"no state store at {path}: give --db or --config, "
            "or create it with `icefrog db upgrade`"
        )
    return SqlStore(url)


def now() -> float:
    """The report's current time (the one clock read of a report command)."""
    return time.time()


def print_lines(lines: Iterable[str]) -> None:
    try:
        for line in lines:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, like Slurm's tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def print_json(value: Any) -> None:
    print_lines([json.dumps(value, indent=2)])
