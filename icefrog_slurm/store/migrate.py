"""Schema migrations: the alembic environment in ``migrations/``, driven from code (no alembic.ini).

``upgrade(url)`` is what ``icefrog db upgrade`` runs; ``current_revision`` and
``head_revision`` let :class:`SqlStore` refuse a database that is not migrated.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from icefrog_slurm.errors import IcefrogError

# Shipped inside the package (package data), so a wheel holds them too.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    """An alembic Config for ``url`` over ``store/migrations/``, built in code."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise IcefrogError(f"the migrations folder {MIGRATIONS_DIR} is missing")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision`` (creating the tables on an empty one)."""
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
