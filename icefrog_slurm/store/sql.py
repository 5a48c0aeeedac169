"""``SqlStore``: the one place that commits. SQLite (embedded default) and Postgres.

Use::

    store = SqlStore(url)                      # checks the schema is migrated
    snap = store.snapshot()                    # one consistent read (a tick's input)
    with store.transaction() as tx:            # one transaction: commit at the end,
        tx.record_round(...)                   # roll back on any exception
        tx.add_intent(...)

A controller tick is one transaction: it reads the snapshot, records the round's decision
and writes the reconcile intents. Reconcile then runs outside it, one short transaction a
step: ``start_intent`` before a Slurm command, ``log_action`` + ``finish_intent`` after, so
an intent is durable before anything happens on Slurm and a restarted controller finds what
was in flight with ``open_intents()``.

SQLite connections run in WAL mode with foreign keys on and a real ``BEGIN`` (pysqlite's
default would not open a transaction for reads); write transactions take ``BEGIN
IMMEDIATE`` so two writers queue instead of failing on a lock upgrade. On Postgres a
snapshot (and a ``consistent`` transaction) runs at REPEATABLE READ so all its queries see
the same state.

A store that leads (``try_lead`` returned its lease) is *fenced*: every write transaction
first proves the lease is still this controller's (``SqlLease.check``: the epoch read inside
the transaction) and rolls back with ``LostLead`` otherwise, so a controller that lost the
lead writes nothing more, and no reconcile step gets as far as its Slurm command. A store
that never led (the simulator, the CLI's reports, tests) or whose lease was released writes
unchecked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from icefrog_slurm.domain.records import StoreSnapshot
from icefrog_slurm.errors import InputError, LostLead, StoreUnavailable
from icefrog_slurm.extras import require
from icefrog_slurm.settings import Settings
from icefrog_slurm.store import dburl
from icefrog_slurm.store.leader import SqlLease, lock_path, try_lead
from icefrog_slurm.store.readonly import make_readonly_engine
from icefrog_slurm.store.snapcache import SnapshotCache
from icefrog_slurm.store.tx import SqlStoreTx

_BEGIN_OPTION = "icefrog_sqlite_begin"
_PG_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,  # ms
}
"""libpq's TCP keepalives and send timeout (unless the URL sets them): a connection the
network cut fails in about a minute instead of hanging for many, so a controller finds out
it lost the lead, and a store call a fault stopped is retried, in time."""


def make_engine(url: str) -> Engine:
    """An engine for ``url`` with the project's SQLite settings; bad URLs are InputError."""
    parsed = dburl.parse(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            engine = create_engine(parsed, connect_args={"timeout": 30.0})
            _configure_sqlite(engine, in_memory=parsed.database in (None, "", ":memory:"))
            return engine
        if parsed.get_driver_name() == "psycopg":
            require("psycopg", "postgres", f"a {parsed.drivername}:// database URL")
        keepalives = {k: v for k, v in _PG_KEEPALIVES.items() if k not in parsed.query}
        return create_engine(parsed, pool_pre_ping=True, connect_args=keepalives)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise InputError(f"database URL {dburl.shown(parsed)}: {exc}") from None
    except ModuleNotFoundError as exc:  # a driver no extra installs (postgresql:// = psycopg2)
        raise InputError(
            f"a {parsed.drivername}:// database URL needs the module {exc.name}, which "
            "icefrog-slurm does not install: use postgresql+psycopg:// (the postgres extra)"
        ) from None


def _configure_sqlite(engine: Engine, *, in_memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, below
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        if not in_memory:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(conn.get_execution_options().get(_BEGIN_OPTION, "BEGIN"))


class SqlStore:
    """The state store over one database URL."""

    def __init__(self, url: str, *, check_schema: bool = True, readonly: bool = False) -> None:
        """``readonly``: a report's store, opened with ``store/readonly.py`` (it never
        writes nor creates a file: SQLite ``mode=ro``, Postgres read-only sessions)."""
        self.url = url
        self.engine = make_readonly_engine(url) if readonly else make_engine(url)
        self._is_sqlite = self.engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._lease: SqlLease | None = None
        self._cache = SnapshotCache()  # what this store's snapshots read, by job
        if check_schema:
            try:
                self.check_schema()
            except BaseException:
                self.engine.dispose()
                raise

    def close(self) -> None:
        self.engine.dispose()

    def without_fsync(self) -> None:
        """For a throw-away SQLite database (the simulator's): ``PRAGMA synchronous=OFF`` on
        every connection from now on, so commits cost no fsync; a crash may lose it."""
        if not self._is_sqlite:
            raise InputError("without_fsync: only for a SQLite database")

        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA synchronous=OFF")
            cur.close()

        self.engine.dispose()

    def check_schema(self) -> None:
        """Fail with a clear message unless the database is migrated to the code's head."""
        from icefrog_slurm.store.migrate import current_revision, head_revision

        current, head = current_revision(self.engine), head_revision()
        if current != head:
            raise InputError(
                f"database {dburl.shown(self.engine.url)} is at "
                f"revision {current or 'none'}, the code needs {head}: run `icefrog db upgrade`"
            )

    def try_lead(self) -> SqlLease | None:
        """Become the one active controller: a held lease, or None while another controller
        holds the lock (store/leader.py). From then on every write transaction checks the
        lease (fenced), until it is released; a lost lease refuses them all.
        InputError for a database no lock can guard (``sqlite://`` in memory), and for one
        not at the code's revision once the lock is held (an upgrade or downgrade made
        while this controller waited): the lock is let go."""
        lease = try_lead(self.engine)
        if lease is None:
            return None
        try:  # a standby that waited may meet a schema changed since it started
            self.check_schema()
        except BaseException:
            lease.release()
            raise
        self._lease = lease
        return lease

    @classmethod
    def from_settings(cls, settings: Settings) -> SqlStore:
        """The controller's store: a database a lock can guard (InputError for ``sqlite://``
        in memory, before anything else), migrated to the code's head."""
        store = cls(settings.store.url, check_schema=False)
        try:
            lock_path(store.engine.url)
            store.check_schema()
        except BaseException:
            store.close()
            raise
        return store

    @contextmanager
    def transaction(self, *, consistent: bool = False) -> Iterator[SqlStoreTx]:
        """One read-write transaction: committed when the block ends, rolled back on error.

        ``consistent`` (a tick that reads its snapshot and writes in one transaction): every
        read sees the state of the first one. SQLite's write transactions always do; on
        Postgres it runs at REPEATABLE READ, and a concurrent update of a row it also
        updates makes it fail (serialization error) rather than overwrite.
        """
        try:
            with self._sessions() as session, session.begin():
                conn = self._first_connection(session, write=True, consistent=consistent)
                if self._lease is not None:
                    self._lease.check(conn)
                yield SqlStoreTx(session, self._cache)
        except sa_exc.SQLAlchemyError as exc:
            if transient_db_fault(exc):
                raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
            raise

    def snapshot(self, *, include_finished: bool = False) -> StoreSnapshot:
        """One consistent read of everything a tick needs."""
        with self.reading() as session:
            return SqlStoreTx(session).snapshot(include_finished=include_finished)

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """One consistent read-only transaction (reports, snapshots): a plain ``BEGIN`` on
        SQLite, so it never waits for or blocks the controller's write lock; REPEATABLE
        READ on Postgres. Callers only read in it."""
        with self._sessions() as session, session.begin():
            self._first_connection(session, write=False, consistent=True)
            yield session

    def _first_connection(self, session: Session, *, write: bool, consistent: bool) -> Connection:
        """Open the transaction's connection with the right BEGIN / isolation level."""
        if self._is_sqlite:
            begin = "BEGIN IMMEDIATE" if write else "BEGIN"
            return session.connection(execution_options={_BEGIN_OPTION: begin})
        if consistent:
            return session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        return session.connection()


_TRANSIENT = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError,
              sa_exc.TimeoutError, LostLead, StoreUnavailable)  # fmt: skip


def transient_db_fault(exc: BaseException) -> bool:
    """A database fault that says nothing of what was asked (connection, lock, timeout, a
    lost lead): what was being done is tried again later."""
    if isinstance(exc, _TRANSIENT):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and bool(exc.connection_invalidated)
