"""Opening the state store to read only: what the reports (``icefrog squeue``, ``sacct``,
``show job``) run by any user use; the controller's read-write engine is ``sql.make_engine``.

:func:`make_readonly_engine` never writes, never creates a file and sets no pragma that
would:

- SQLite: the file is opened as a ``file:`` URI with ``mode=ro`` (no WAL pragma; the
  database stays in the WAL mode the controller set). While the controller has the database
  open its ``-wal`` and ``-shm`` files exist (with the database file's mode), and a
  read-only connection reads through them. When they are not there (the controller stopped
  cleanly), SQLite would have to create them, which a user who cannot write the folder
  cannot do ("attempt to write a readonly database") and root should not; the file is then
  opened ``immutable=1`` as well: no lock and no ``-shm``, only the database file, which
  a writer that starts meanwhile changes only at a checkpoint (after about 1000 pages of
  its log, or when it closes), so a report read then almost always sees the state before
  it (a checkpoint in the middle of the read could make it fail: run the report again).
  The choice is made at each connection (one a transaction: no pool); a connection
  refused read-only because the ``-wal`` went away between the look and the open is
  retried once immutable.
- Postgres: the session runs with ``default_transaction_read_only=on`` (unless the URL sets
  ``options``), libpq's keepalives and a connect timeout, so even a role that may write
  writes nothing through a report, and an unreachable server fails within seconds.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import NullPool

from icefrog_slurm.errors import InputError
from icefrog_slurm.extras import require
from icefrog_slurm.store import dburl

SQLITE_TIMEOUT_S = 30.0
"""How long a read-only SQLite connection waits for a lock (the controller's checkpoint)."""
PG_CONNECT_TIMEOUT_S = 10
"""Seconds a report waits for the Postgres server to answer before it fails."""
_PG_READONLY = {
    "options": "-c default_transaction_read_only=on",
    "connect_timeout": PG_CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def make_readonly_engine(url: str) -> Engine:
    """An engine over ``url`` that cannot write (module docstring); bad URLs are InputError.
    An in-memory or ``uri=true`` SQLite URL is refused: there is no file to read."""
    parsed = dburl.parse(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_readonly(parsed)
        if parsed.get_driver_name() == "psycopg":
            require("psycopg", "postgres", f"a {parsed.drivername}:// database URL")
        extra = {k: v for k, v in _PG_READONLY.items() if k not in parsed.query}
        return create_engine(parsed, pool_pre_ping=True, connect_args=extra)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise InputError(f"database URL {dburl.shown(parsed)}: {exc}") from None
    except ModuleNotFoundError as exc:  # a driver that is not installed
        raise InputError(
            f"a {parsed.drivername}:// database URL needs the module {exc.name}, which "
            "icefrog-slurm does not install: use postgresql+psycopg:// (the postgres extra)"
        ) from None


def _sqlite_readonly(parsed: URL) -> Engine:
    if parsed.database in (None, "", ":memory:") or parsed.query:
        raise InputError(
            f"database {dburl.shown(parsed)!r}: a report reads a SQLite database file "
            "(sqlite:////path/to/icefrog.db), with no query options"
        )
    path = os.path.abspath(str(parsed.database))
    # no pool: each transaction opens its own connection, so the WAL-or-immutable choice is
    # made again each time (a pooled immutable connection would never see the controller's
    # later commits, e.g. under squeue -i)
    engine = create_engine(parsed, creator=lambda: connect_readonly(path), poolclass=NullPool)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:  # pysqlite opens no transaction for reads by itself
        conn.exec_driver_sql("BEGIN")

    return engine


def connect_readonly(path: str) -> sqlite3.Connection:
    """A read-only connection to the SQLite file ``path`` (module docstring)."""
    immutable = not os.path.exists(path + "-wal")
    try:
        return _open(path, immutable=immutable)
    except sqlite3.OperationalError as exc:
        if immutable or "readonly" not in str(exc):
            raise
    return _open(path, immutable=True)  # the -wal went away between the look and the open


def _open(path: str, *, immutable: bool) -> sqlite3.Connection:
    options = "mode=ro&immutable=1" if immutable else "mode=ro"
    conn = sqlite3.connect(
        f"file:{quote(path)}?{options}",
        uri=True,
        timeout=SQLITE_TIMEOUT_S,
        check_same_thread=False,
        isolation_level=None,
    )
    if not immutable:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the open is lazy
    return conn
