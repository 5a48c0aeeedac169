"""Taking the controller lock from under a running controller, for the leader tests.

``steal_the_lead(url)`` does what a Postgres restart or a network cut does to the leader's
lock (its session killed with ``pg_terminate_backend``), or what removing the SQLite lock
file does; ``lock_waiters(url)`` counts the sessions of that database waiting for a lock;
``read(url, statement)`` reads on a connection of its own.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from sqlalchemy import Connection, Executable, text

from icefrog_slurm.store import leader
from icefrog_slurm.store.sql import make_engine
from tests.integration.conftest import wait_for

POSTGRES_ONLY = pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
"""Run a ``db_url`` test on Postgres alone (the tick's row-lock guard is Postgres's)."""

_KEY = {"hi": leader.ADVISORY_KEY >> 32, "lo": leader.ADVISORY_KEY & 0xFFFFFFFF}


def steal_the_lead(url: str) -> None:
    engine = make_engine(url)
    try:
        path = leader.lock_path(engine.url)
        if path is not None:
            os.unlink(path)
            return
        with engine.connect() as conn:
            [(pid, killed)] = conn.execute(
                text(f"SELECT pid, pg_terminate_backend(pid) {_HOLDERS}"), _KEY
            ).all()
            assert killed
            # the session ends (and frees the lock) a moment after the signal
            wait_for("the killed session's lock to go", lambda: _lock_gone(conn, pid))
    finally:
        engine.dispose()


_HOLDERS = (
    "FROM pg_locks WHERE locktype = 'advisory' AND objid = :lo AND classid = :hi"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def _lock_gone(conn: Connection, pid: int) -> bool:
    return not conn.execute(
        text(f"SELECT pid {_HOLDERS} AND pid = :pid"), {**_KEY, "pid": pid}
    ).all()


def lock_waiters(url: str) -> int:
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    [(n,)] = read(url, text(f"{waiting} AND datname = current_database()"))
    return int(n)


def read(url: str, statement: Executable) -> list[tuple[Any, ...]]:
    """The rows of one statement, on a connection of its own (outside every store)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(statement)]
    finally:
        engine.dispose()
