"""The one-active-controller lock: a Postgres advisory lock, or a file lock beside SQLite.

``try_lead(engine)`` returns a held :class:`LeaderLock`, or None when another controller
holds it. The Postgres lock lives on a dedicated connection (it ends with the session, so
a killed controller's lock goes with its connection); the SQLite one is ``flock`` on
``<database>.leader``, released by the kernel when the process dies.
"""

from __future__ import annotations

import fcntl
import os
from typing import Protocol

from sqlalchemy import Connection, Engine, text

# pg_advisory_lock key: any fixed 64-bit number, the same for every icefrog controller.
ADVISORY_KEY = 0x1CEF_0000_0001


class LeaderLock(Protocol):
    def release(self) -> None: ...


class _PgLock:
    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn

    def release(self) -> None:
        if self._conn is not None:
            self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
            self._conn.close()
            self._conn = None


class _FileLock:
    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def try_lead(engine: Engine) -> LeaderLock | None:
    """Take the controller lock if it is free; None if another controller holds it."""
    if engine.dialect.name == "postgresql":
        conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY}).scalar()
        if got:
            return _PgLock(conn)
        conn.close()
        return None
    database = engine.url.database
    if engine.dialect.name != "sqlite" or database in (None, "", ":memory:"):
        return _FileLock(None)  # one process only: nothing to exclude
    fd = os.open(f"{database}.leader", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return _FileLock(fd)
