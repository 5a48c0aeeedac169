"""Schema migrations: the alembic environment of ``db/``, driven from code (no alembic.ini).

The repository's top-level ``db/`` installs as the package ``icefrog_slurm.db`` (setup.py);
:func:`migrations_dir` finds it with importlib.resources in a wheel or an editable install,
and beside the package in a source checkout run without installing (``PYTHONPATH=.``).

What ``icefrog db`` runs: :func:`upgrade` and :func:`downgrade` (the writing ones: both
refuse a database that is not ours, tables but no revision of ours: another application's
data, never to be altered, and one at a revision this icefrog does not know),
:func:`inspect_database` (``current``: reads only, and never creates a SQLite file that is
not there) and :func:`history`. :func:`require_head` is the daemon's gate: a database that
is absent or not at the newest revision is refused, naming what to run, before anything
touches it; ``icefrog db upgrade`` and ``downgrade`` run under :func:`leader_locked`.
``current_revision`` and ``head_revision`` let :class:`SqlStore` refuse a
database that is not migrated. A database that cannot be read is an InputError naming it (a
file that is not a database, a folder); one that cannot be reached is an IcefrogError (the
server may be down: try again later).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import NoReturn

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy import URL, Connection, Engine, create_engine, inspect
from sqlalchemy.exc import DBAPIError, OperationalError

from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.store import dburl

VERSION_TABLE = "alembic_version"
MIGRATIONS_PACKAGE = "icefrog_slurm.db"
_CHECKOUT_DB = Path(__file__).resolve().parents[2] / "db"


def migrations_dir() -> Path:
    """The folder holding alembic's ``env.py`` and ``versions/``: the installed package
    ``icefrog_slurm.db`` (a wheel, an editable install), else the checkout's ``db/``."""
    try:
        found = files(MIGRATIONS_PACKAGE)
    except ModuleNotFoundError:  # a source checkout on PYTHONPATH, not installed
        found = _CHECKOUT_DB
    if not isinstance(found, Path) or not (found / "env.py").is_file():
        raise IcefrogError(f"the migrations folder {found} is missing (db/ of icefrog-slurm)")
    return found


def alembic_config(url: str) -> Config:
    """An alembic Config for ``url`` over the migrations of ``db/``, built in code."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@dataclass(frozen=True)
class DbState:
    """What a database holds, as :func:`inspect_database` read it."""

    shown: str  # the URL without its password
    exists: bool  # False: a SQLite file that is not there (nothing was created)
    revision: str | None  # the icefrog schema revision, None when there is none
    tables: tuple[str, ...]  # its tables but alembic's version table

    @property
    def foreign(self) -> bool:
        """Tables but no icefrog revision: another application's database."""
        return self.revision is None and bool(self.tables)


def inspect_database(url: str) -> DbState:
    """The database at ``url``, read only: a SQLite file is opened read-only (absent: not
    created, ``exists`` False); another database is only connected to."""
    engine = _reading_engine(url)
    if engine is None:
        return DbState(dburl.shown(url), False, None, ())
    shown = dburl.shown(url)
    try:
        with (
            _database_errors(shown, sqlite=engine.dialect.name == "sqlite"),
            engine.connect() as conn,
        ):
            names = inspect(conn).get_table_names()
            revision = MigrationContext.configure(conn).get_current_revision() if names else None
    finally:
        engine.dispose()
    tables = tuple(sorted(t for t in names if t != VERSION_TABLE))
    return DbState(shown, True, revision, tables)


def require_head(url: str, *, upgrade_hint: str = "icefrog db upgrade") -> None:
    """InputError, naming ``upgrade_hint`` when it helps, unless the database is ours and at
    the newest revision; reads only (an absent SQLite file is never created)."""
    state, head = inspect_database(url), head_revision()
    if not state.exists:
        raise InputError(f"database {state.shown} does not exist: run `{upgrade_hint}`")
    _refuse_foreign(state, _scripts())
    if state.revision != head:
        raise InputError(
            f"database {state.shown} is at revision {state.revision or 'none'}, the code "
            f"needs {head}: run `{upgrade_hint}`"
        )


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision`` (creating the tables on an empty one);
    a database that is not ours, or a revision we do not know, is an InputError."""
    config = alembic_config(url)
    scripts = ScriptDirectory.from_config(config)
    _known_revision(scripts, revision, "revision")
    state = inspect_database(url)
    _refuse_foreign(state, scripts)
    _run(command.upgrade, config, revision, state)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``base``: no tables left);
    refused (InputError) for a database that is absent, empty, not ours or at a revision we
    do not know, and for a revision that is not below the current one."""
    config = alembic_config(url)
    scripts = ScriptDirectory.from_config(config)
    _known_revision(scripts, revision, "revision")
    state = inspect_database(url)
    if not state.exists:
        raise InputError(f"database {state.shown} does not exist: nothing to downgrade")
    _refuse_foreign(state, scripts)
    if state.revision is None:
        raise InputError(f"database {state.shown} has no icefrog schema: nothing to downgrade")
    _run(command.downgrade, config, revision, state)


@contextmanager
def leader_locked(url: str) -> Iterator[None]:
    """Hold the leader lock for a migration, so that no controller leads on the database
    while its schema changes (a standby waiting for the lock could take it between a look
    and the migration, and run its code on a schema changing under it); InputError while a
    controller holds it. SQLite: ``flock`` on the lock file, made (0600) as the controller
    makes it, unless the database file is not there yet (a controller refuses to start on
    a database that does not exist); Postgres: the advisory lock, on a connection of its
    own."""
    from sqlalchemy import text

    from icefrog_slurm.store.leader import ADVISORY_KEY, lock_file, lock_path
    from icefrog_slurm.store.sql import make_engine

    engine = make_engine(url)  # InputError for a malformed URL
    parsed = engine.url
    try:
        if parsed.get_backend_name() == "postgresql":
            key = {"k": ADVISORY_KEY}
            with connected(engine) as conn:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                if not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), key).scalar():
                    _refuse_led(parsed)
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), key)
            return
        memory = parsed.database in (None, "", ":memory:") or parsed.query.get("uri")
        lock = None if parsed.get_backend_name() != "sqlite" or memory else lock_path(parsed)
        if lock is None or not os.path.exists(lock.removesuffix(".leader")):
            yield
            return
        fd = lock_file(lock)  # as the controller takes it
        if fd is None:
            _refuse_led(parsed)
        try:
            yield
        finally:
            os.close(fd)  # lets go of the lock
    finally:
        engine.dispose()


def _refuse_led(url: URL) -> NoReturn:
    raise InputError(
        f"database {dburl.shown(url)}: a controller is running on it (it holds the leader "
        "lock): stop it first (systemctl stop icefrog-controller)"
    )


@dataclass(frozen=True)
class Revision:
    """One migration of ``db/versions``."""

    revision: str
    down_revision: str | None
    doc: str


def history() -> list[Revision]:
    """Every migration this icefrog knows, newest first."""
    out = []
    for script in _scripts().walk_revisions():
        down = script.down_revision
        out.append(Revision(script.revision, down if isinstance(down, str) else None, script.doc))
    return out


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def _run(
    step: Callable[[Config, str], None], config: Config, revision: str, state: DbState
) -> None:
    try:
        with _database_errors(state.shown, sqlite=state.shown.startswith("sqlite")):
            step(config, revision)
    except CommandError as exc:  # "-1" at the base, a downgrade "up", ...
        raise InputError(f"revision {printable(revision, 80)}: {exc}") from None


def _reading_engine(url: str) -> Engine | None:
    """An engine that cannot write to a SQLite file (opened ``mode=ro``), None when the file
    is not there; for other databases the project's engine."""
    from icefrog_slurm.store.sql import make_engine

    engine = make_engine(url)  # InputError for a malformed URL
    parsed = engine.url
    memory = parsed.database in (None, "", ":memory:")
    if parsed.get_backend_name() != "sqlite" or memory or parsed.query.get("uri"):
        return engine
    engine.dispose()
    path = os.path.abspath(str(parsed.database))
    if not os.path.lexists(path):
        return None
    from icefrog_slurm.store.readonly import connect_readonly  # mode=ro, no -shm made

    return create_engine("sqlite://", creator=lambda: connect_readonly(path))


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with connected(engine) as conn:
        return MigrationContext.configure(conn).get_current_revision()


@contextmanager
def connected(engine: Engine) -> Iterator[Connection]:
    """A connection to ``engine`` whose database errors name the database: InputError when
    it cannot be read, IcefrogError when its server cannot be reached."""
    sqlite = engine.dialect.name == "sqlite"
    with _database_errors(dburl.shown(engine.url), sqlite=sqlite), engine.connect() as conn:
        yield conn


@contextmanager
def _database_errors(shown: str, *, sqlite: bool) -> Iterator[None]:
    try:
        yield
    except DBAPIError as exc:
        reason = printable(str(exc.orig), 300)
        if isinstance(exc, OperationalError) and not sqlite:
            raise IcefrogError(f"database {shown}: cannot connect: {reason}") from None
        raise InputError(f"database {shown}: {reason}") from None


def _known_revision(scripts: ScriptDirectory, revision: str, what: str) -> None:
    try:
        found = scripts.get_revisions(revision) if revision else ()
    except (CommandError, RevisionError):
        found = ()
    if not found and revision not in ("head", "heads", "base"):
        raise InputError(
            f"{what} {printable(revision, 80)}: not a revision of this icefrog's schema "
            "(another application's, or a newer icefrog's)"
        )


def _refuse_foreign(state: DbState, scripts: ScriptDirectory) -> None:
    """InputError unless the database is empty or carries a revision of ours."""
    if state.foreign:
        names = printable(", ".join(state.tables), 200)
        raise InputError(
            f"database {state.shown} holds tables ({names}) but no icefrog schema revision: "
            "not an icefrog database, left untouched"
        )
    if state.revision is not None:
        _known_revision(scripts, state.revision, f"database {state.shown} is at revision")
