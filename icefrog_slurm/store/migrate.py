"""Schema migrations: the alembic environment of ``db/``, driven from code (no alembic.ini).

The repository's top-level ``db/`` installs as the package ``icefrog_slurm.db`` (setup.py);
:func:`migrations_dir` finds it with importlib.resources in a wheel or an editable install,
and beside the package in a source checkout run without installing (``PYTHONPATH=.``).

``upgrade(url)`` is what ``icefrog db upgrade`` runs: it migrates an empty database or one of
ours, and refuses any other (tables but no revision of ours: another application's data,
never to be altered). ``current_revision`` and ``head_revision`` let :class:`SqlStore`
refuse a database that is not migrated. A database that cannot be read is an InputError
naming it (a file that is not a database, a folder); one that cannot be reached is an
IcefrogError (the server may be down: try again later).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import DBAPIError, OperationalError

from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.jsonio import printable

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


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision`` (creating the tables on an empty one);
    a database that is not ours, or a revision we do not know, is an InputError."""
    from icefrog_slurm.store.sql import make_engine

    config = alembic_config(url)
    scripts = ScriptDirectory.from_config(config)
    _known_revision(scripts, revision, "--revision")
    engine = make_engine(url)
    shown, sqlite = _shown(engine), engine.dialect.name == "sqlite"
    try:
        with connected(engine) as conn:
            _refuse_foreign(conn, scripts, shown)
    finally:
        engine.dispose()
    try:
        with _database_errors(shown, sqlite=sqlite):
            command.upgrade(config, revision)
    except CommandError as exc:  # a relative revision that goes nowhere ("-1" at the base)
        raise InputError(f"--revision {printable(revision, 80)}: {exc}") from None


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
    with _database_errors(_shown(engine), sqlite=sqlite), engine.connect() as conn:
        yield conn


def _shown(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


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


def _refuse_foreign(conn: Connection, scripts: ScriptDirectory, shown: str) -> None:
    """InputError unless the database is empty or carries a revision of ours."""
    tables = sorted(inspect(conn).get_table_names())
    revision = MigrationContext.configure(conn).get_current_revision() if tables else None
    others = [t for t in tables if t != VERSION_TABLE]
    if revision is None and others:
        names = printable(", ".join(others), 200)
        raise InputError(
            f"database {shown} holds tables ({names}) but no icefrog schema revision: "
            "not an icefrog database, left untouched"
        )
    if revision is not None:
        _known_revision(scripts, revision, f"database {shown} is at revision")
