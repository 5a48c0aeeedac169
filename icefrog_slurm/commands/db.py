"""``icefrog db current | history | upgrade [REV] | downgrade REV``: the state store's schema.

The database is ``--url URL``, else ``store.url`` of ``--config FILE`` (default
/etc/icefrog/icefrog.toml when it exists, else the built-in default: a SQLite file in
/var/lib/icefrog).

- ``current`` prints the database's revision; it only reads (a SQLite file that does not
  exist is reported, never created).
- ``history`` prints the revisions this icefrog knows, newest first; no database is read.
- ``upgrade [REV]`` migrates to REV (default ``head``, the newest); for SQLite the file and
  its missing folders (mode 0755) are made.
- ``downgrade REV`` migrates down to REV (``base``: every table dropped, the data with it).

Only an empty database or one of icefrog's is migrated: another application's (tables
without an icefrog revision) or one at a revision this icefrog does not know is left
untouched, exit 2 naming it; so is a revision this icefrog does not know (``migrate.py``),
and any database while a controller runs on it (holds the leader lock). A migration holds
that lock until it is done, so no controller takes the lead meanwhile.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import Settings, load_settings

if TYPE_CHECKING:
    from icefrog_slurm.store.migrate import DbState

DEFAULT_CONFIG = "/etc/icefrog/icefrog.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    current = sub.add_parser("current", help="print the database's schema revision")
    _add_source(current)
    sub.add_parser("history", help="list the schema revisions this icefrog knows")
    up = sub.add_parser("upgrade", help="migrate the database to the newest schema (or REV)")
    _add_source(up)
    up.add_argument("rev", nargs="?", metavar="REV", help="target revision (default: head)")
    up.add_argument("--revision", help=argparse.SUPPRESS)  # the older spelling of REV
    down = sub.add_parser("downgrade", help="migrate the database down to REV (base: empty)")
    _add_source(down)
    down.add_argument("rev", metavar="REV", help="target revision, e.g. 0004, -1 or base")


def _add_source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--config", metavar="FILE", help=f"settings file (default {DEFAULT_CONFIG})"
    )
    source.add_argument(
        "--url", help="database URL, e.g. postgresql+psycopg://icefrog@host/icefrog"
    )


def database_url(args: argparse.Namespace) -> str:
    """The URL chosen by --url, --config or the defaults."""
    if args.url is not None:
        return str(args.url)
    if args.config is not None:
        return load_settings(args.config).store.url
    if Path(DEFAULT_CONFIG).is_file():
        return load_settings(DEFAULT_CONFIG).store.url
    return Settings().store.url


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL (None for other databases and in-memory SQLite);
    a malformed URL is an InputError."""
    from icefrog_slurm.store import dburl

    parsed = dburl.parse(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Path(str(parsed.database))
    return None


def run(args: argparse.Namespace) -> int:
    from icefrog_slurm.store import migrate

    action = args.db_command
    if action == "history":
        head = migrate.head_revision()
        for rev in migrate.history():
            mark = " (head)" if rev.revision == head else ""
            print(f"{rev.down_revision or '<base>'} -> {rev.revision}{mark}, {rev.doc}")
        return 0
    url = database_url(args)
    if action == "current":
        known = {rev.revision for rev in migrate.history()}
        return _current(migrate.inspect_database(url), migrate.head_revision(), known)
    if action == "upgrade":
        if args.rev is not None and args.revision is not None:
            raise InputError("give the revision once: REV or --revision")
        revision = args.rev or args.revision or "head"
        _make_sqlite_folder(url)
        with migrate.leader_locked(url):  # no controller takes the lead meanwhile
            migrate.upgrade(url, revision)
    else:
        with migrate.leader_locked(url):
            migrate.downgrade(url, args.rev)
    state = migrate.inspect_database(url)
    print(f"icefrog db {action}: {state.shown} is at revision {state.revision or 'base'}")
    return 0


def _current(state: DbState, head: str | None, known: set[str]) -> int:
    if not state.exists:
        raise InputError(f"database {state.shown} does not exist: run `icefrog db upgrade`")
    if state.foreign:
        names = printable(", ".join(state.tables), 200)
        raise InputError(
            f"database {state.shown} holds tables ({names}) but no icefrog schema revision: "
            "not an icefrog database"
        )
    if state.revision is None:
        print(f"{state.shown}: no icefrog schema (empty): run `icefrog db upgrade`")
    elif state.revision not in known:
        raise InputError(
            f"database {state.shown} is at revision {printable(state.revision, 80)}, not one "
            "of this icefrog's schema (another application's, or a newer icefrog's)"
        )
    elif state.revision == head:
        print(f"{state.shown}: revision {state.revision} (head)")
    else:
        print(f"{state.shown}: revision {state.revision}, the newest is {head}")
    return 0


def _make_sqlite_folder(url: str) -> None:
    path = sqlite_file(url)
    if path is not None:
        from icefrog_slurm.commands.state_folders import STATE_MODE, make_folder

        make_folder(path.absolute().parent, STATE_MODE)
