"""``icefrog db upgrade``: create or migrate the state store's database.

The database is ``--url URL``, else ``store.url`` of ``--config FILE`` (default
/etc/icefrog/icefrog.toml when it exists, else the built-in default: a SQLite file in
/var/lib/icefrog). For SQLite the file's folder is created. Only an empty database or one of
icefrog's is migrated: another application's (tables without an icefrog revision) or one at
a revision this icefrog does not know is left untouched, exit 2 naming it (``migrate.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sqlalchemy.engine import make_url

from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import Settings, load_settings

DEFAULT_CONFIG = "/etc/icefrog/icefrog.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = sub.add_parser("upgrade", help="migrate the database to the newest schema")
    source = up.add_mutually_exclusive_group()
    source.add_argument(
        "--config", metavar="FILE", help=f"settings file (default {DEFAULT_CONFIG})"
    )
    source.add_argument(
        "--url", help="database URL, e.g. postgresql+psycopg://icefrog@host/icefrog"
    )
    up.add_argument("--revision", default="head", help="target revision (default: head)")


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
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError, ValueError...
        raise InputError(f"database URL {printable(url, 200)!r}: {exc}") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Path(str(parsed.database))
    return None


def run(args: argparse.Namespace) -> int:
    from icefrog_slurm.store import migrate

    url = database_url(args)
    path = sqlite_file(url)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            folder = printable(str(path.parent), 200)
            raise InputError(f"{folder}: cannot make the folder: {exc.strerror or exc}") from None
    migrate.upgrade(url, args.revision)
    from icefrog_slurm.store.sql import make_engine

    engine = make_engine(url)
    try:
        revision = migrate.current_revision(engine)
    finally:
        engine.dispose()
    shown = printable(make_url(url).render_as_string(hide_password=True), 500)
    print(f"icefrog db upgrade: {shown} is at revision {revision}")
    return 0
