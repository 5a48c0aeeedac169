"""The one active controller: a lock, and a lease with a fencing token, re-proved every tick.

The lease is the single row of ``leader_lease``: ``epoch``, a fencing token every controller
that takes the lead increases by one, and ``holder`` (host and pid, for the logs).
``try_lead(engine)`` takes the lock, then bumps the epoch while holding it, and returns the
held :class:`SqlLease` (None while another controller holds the lock):

- Postgres: ``pg_try_advisory_lock`` on a dedicated connection (the lock ends with that
  session, so a killed controller's lock goes with its connection);
- SQLite: ``flock`` on ``<real path of the database>.leader``: the path is resolved first, so
  a symlink or another spelling of the path finds the same lock; the lock file must be a
  plain file of the controller's own uid (a symlink is never followed). A URL with no file
  to lock (``sqlite://`` in memory, a URI filename) or of another dialect is refused
  (InputError): nothing would keep a second controller out.

A lock that was taken once proves nothing later: its connection can drop (a network blip,
a Postgres restart, ``pg_terminate_backend``) while the controller runs on, and a standby
then takes the lock. So the lease is proved again and again:

- :meth:`SqlLease.hold` wraps every tick of the daemon. It checks that the lock is still held
  (Postgres: the lock's session is alive and still owns the advisory lock; SQLite: the lock
  file is still the file the path names) and that the epoch is still ours, else it raises
  :class:`LostLead` and the tick does not start. On Postgres it keeps the lease row locked
  ``FOR SHARE`` on a guard connection until the tick ends: a new leader's bump waits for
  that tick (at most ``TAKEOVER_WAIT_S``, then it lets go of the lock and tries later), so
  the two never enact at the same time.
- :meth:`SqlLease.check` runs first in every write transaction of a store that leads
  (``SqlStore.transaction``: the tick's, every reconcile step's, the inbox's): the epoch is
  read inside that transaction (``FOR SHARE`` on Postgres; under ``BEGIN IMMEDIATE`` on
  SQLite) and a stale one raises :class:`LostLead`, so the transaction rolls back before a
  step's Slurm command runs.

What is left: should the guard's own connection drop in the middle of a tick too (with the
lock's), or the SQLite lock file be removed then, a standby can take the lease while the old
leader's current reconcile step runs its Slurm command; that step's next write is refused,
so at most that one step overlaps.

Once lost, a lease stays lost. ``release`` lets go of the lock; the store then writes as an
ordinary client again (what a controller that stopped leading on purpose may do).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import NoReturn

from sqlalchemy import URL, Connection, Engine, select, text, update
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from icefrog_slurm.errors import IcefrogError, InputError, LostLead
from icefrog_slurm.store import dburl
from icefrog_slurm.store.models import LeaderLeaseRow

log = logging.getLogger(__name__)

# pg_advisory_lock key: any fixed 64-bit number, the same for every icefrog controller.
ADVISORY_KEY = 0x1CEF_0000_0001
TAKEOVER_WAIT_S = 10
"""How long a new leader's epoch bump waits for the previous leader's tick to end (Postgres)
before it lets go of the lock and tries again later."""
_LOCK_NOT_AVAILABLE = "55P03"  # Postgres SQLSTATE of a lock_timeout
_SERVER_KEEPALIVES = text(
    "SELECT set_config('tcp_keepalives_idle', '30', false),"
    " set_config('tcp_keepalives_interval', '10', false),"
    " set_config('tcp_keepalives_count', '3', false)"
)
"""On the lock's session: the server drops it (and the lock) within about a minute of
losing the controller on a cut network, so a standby can take over (the OS default: 2 h)."""


class SqlLease:
    """A held lead: the epoch this controller took, and the lock behind it."""

    def __init__(self, engine: Engine, epoch: int) -> None:
        self.engine, self.epoch = engine, epoch
        self.lost: str | None = None  # why, once lost
        self.released = False

    def check(self, conn: Connection) -> None:
        """Raise LostLead unless the lease row, read in ``conn``'s transaction, holds our
        epoch (locked ``FOR SHARE`` on Postgres until that transaction ends)."""
        if self.released:
            return
        if self.lost is not None:
            raise LostLead(self.lost)
        query = select(LeaderLeaseRow.epoch, LeaderLeaseRow.holder).where(LeaderLeaseRow.id == 1)
        row = conn.execute(query.with_for_update(read=True)).one_or_none()
        if row is None or row.epoch != self.epoch:
            now = "no lease row" if row is None else f"epoch {row.epoch} ({row.holder})"
            self._lose(f"the lease is at {now}; this controller led as epoch {self.epoch}")

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Prove the lead, and keep it proved for the block (module docstring)."""
        if self.lost is not None or self.released:
            raise LostLead(self.lost or "the lease was released")
        self._check_lock()
        with self.engine.connect() as conn, conn.begin():
            self.check(conn)
            if self.engine.dialect.name == "postgresql":
                yield  # the row stays locked FOR SHARE: no bump until the block ends
                return
        yield

    def release(self) -> None:
        """Let go of the lock (idempotent); the store no longer checks the epoch."""
        self.released = True

    def _check_lock(self) -> None:
        """Raise LostLead unless the lock is still held (by subclasses)."""

    def _lose(self, why: str) -> NoReturn:
        self.lost = why
        log.error("lost the lead (epoch %d): %s", self.epoch, why)
        raise LostLead(why)


class _PgLease(SqlLease):
    def __init__(self, engine: Engine, epoch: int, conn: Connection) -> None:
        super().__init__(engine, epoch)
        self._conn = conn

    def _check_lock(self) -> None:
        held = text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid() AND objsubid = 1"
            " AND classid = CAST(:hi AS oid) AND objid = CAST(:lo AS oid)"
        )
        key = {"hi": ADVISORY_KEY >> 32, "lo": ADVISORY_KEY & 0xFFFFFFFF}
        try:
            count = self._conn.execute(held, key).scalar()
        except SQLAlchemyError as exc:
            self._lose(f"the advisory lock's connection is gone ({type(exc).__name__})")
        if not count:
            self._lose("the advisory lock is no longer held by this controller's session")

    def release(self) -> None:
        if not self.released:
            super().release()
            _drop(self._conn)


class _FileLease(SqlLease):
    def __init__(self, engine: Engine, epoch: int, fd: int, path: str) -> None:
        super().__init__(engine, epoch)
        self._fd, self._path = fd, path

    def _check_lock(self) -> None:
        if not _same_file(self._fd, self._path):
            self._lose(f"the lock file {self._path} was removed or replaced")

    def release(self) -> None:
        if not self.released:
            super().release()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)


def try_lead(engine: Engine) -> SqlLease | None:
    """Take the lock and a new epoch; None while another controller holds the lock."""
    path = lock_path(engine.url)
    if path is None:
        return _lead_postgres(engine)
    return _lead_sqlite(engine, path)


def lock_path(url: URL) -> str | None:
    """Where the lead is locked: None on Postgres (an advisory lock), else the file beside
    the SQLite database's real path; InputError for a URL no lock can guard."""
    where = dburl.shown(url)
    backend = url.get_backend_name()
    if backend == "postgresql":
        return None
    if backend != "sqlite":
        raise InputError(f"database {where}: the controller leads only on SQLite or Postgres")
    if url.database in (None, "", ":memory:") or url.query.get("uri"):
        raise InputError(
            f"database {where}: the controller needs a database file or Postgres "
            "(an in-memory or URI database cannot be locked against a second controller)"
        )
    return os.path.realpath(url.database) + ".leader"


def _lead_postgres(engine: Engine) -> SqlLease | None:
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY}).scalar()
        if not got:
            conn.close()
            return None
        conn.execute(_SERVER_KEEPALIVES)
        epoch = _bump(engine)
    except BaseException:
        _drop(conn)
        raise
    if epoch is None:
        _drop(conn)
        return None
    return _PgLease(engine, epoch, conn)


def _lead_sqlite(engine: Engine, path: str) -> SqlLease | None:
    fd = lock_file(path)
    if fd is None:
        return None
    try:
        epoch = _bump(engine)
    except BaseException:
        os.close(fd)
        raise
    assert epoch is not None  # under the flock nothing else holds the row
    return _FileLease(engine, epoch, fd, path)


def lock_file(path: str) -> int | None:
    """The lock file at ``path`` (made 0600 when missing, never through a link), locked:
    its descriptor, or None while another process holds it (or it was replaced between
    the open and the lock: try again later). IcefrogError for a file this user does not
    own (:func:`_require_own_file`)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        _require_own_file(fd, path)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(fd, path):
            return fd
    except BlockingIOError:
        pass
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _bump(engine: Engine) -> int | None:
    """The new epoch, written under the caller's lock; None when the previous leader's tick
    still holds the row after TAKEOVER_WAIT_S (Postgres)."""
    holder = f"{socket.gethostname()} pid {os.getpid()}"
    bump = (
        update(LeaderLeaseRow)
        .where(LeaderLeaseRow.id == 1)
        .values(epoch=LeaderLeaseRow.epoch + 1, holder=holder)
        .returning(LeaderLeaseRow.epoch)
    )
    with engine.connect() as conn, conn.begin():
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"SET LOCAL lock_timeout = '{TAKEOVER_WAIT_S}s'"))
        try:
            epoch = conn.execute(bump).scalar()
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                raise
            log.warning("the previous controller is still in a tick; taking the lead later")
            return None
        if epoch is None:
            raise IcefrogError("the leader_lease row is missing: run `icefrog db upgrade`")
    log.info("leading as epoch %d (%s)", epoch, holder)
    return int(epoch)


def _require_own_file(fd: int, path: str) -> None:
    """A lock file someone else made (a user who could write the folder) is not ours to
    trust: its owner could hold the lock for ever."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise IcefrogError(
            f"lock file {path} is not a plain file of uid {os.geteuid()} (a "
            f"{stat.filemode(st.st_mode)} file of uid {st.st_uid}): remove it, and make its "
            "folder writable by this controller's user alone"
        )


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _drop(conn: Connection) -> None:
    """Unlock, and close the lock's connection for good (its session ends, and with it the
    lock, should the unlock fail)."""
    with suppress(SQLAlchemyError):
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
    with suppress(SQLAlchemyError):
        conn.invalidate()
