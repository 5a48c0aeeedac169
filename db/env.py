"""Alembic environment of the state store: runs migrations online against the configured URL
(on SQLite with foreign keys off while they run, and checked before they commit).

The URL comes from the Config that ``icefrog_slurm.store.migrate`` builds in code; the
target metadata is the ORM's, so ``alembic revision --autogenerate`` compares against it.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from icefrog_slurm.store.models import Base
from icefrog_slurm.store.sql import make_engine

target_metadata = Base.metadata


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no sqlalchemy.url in the alembic config")
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            if sqlite:  # outside any transaction, where SQLite ignores it (see below)
                connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=sqlite,
                compare_type=True,
            )
            with context.begin_transaction():
                context.run_migrations()
                if sqlite:
                    _check_foreign_keys(connection)
    finally:
        engine.dispose()


def _check_foreign_keys(connection: Connection) -> None:
    """SQLite's batch mode copies a table to a new one, drops the old and renames the new:
    with foreign keys enforced, dropping a table other rows name fails. They are off while
    the migrations run; every row must still name a row that exists before they commit."""
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise RuntimeError(f"the migration left rows naming rows that do not exist: {broken[:5]}")


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported; pass a URL")
run_migrations_online()
