"""Alembic environment of the state store: runs migrations online against the configured URL.

The URL comes from the Config that ``icefrog_slurm.store.migrate`` builds in code; the
target metadata is the ORM's, so ``alembic revision --autogenerate`` compares against it.
"""

from __future__ import annotations

from alembic import context

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
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=connection.dialect.name == "sqlite",
                compare_type=True,
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported; pass a URL")
run_migrations_online()
