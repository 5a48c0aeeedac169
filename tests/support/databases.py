"""Database fixtures for every test that needs a store: SQLite AND a real Postgres.

Registered once for the whole suite (tests/conftest.py), so one Postgres server serves
every test directory.

Each backend's schema is made once a session by the real migration (``icefrog db
upgrade``'s code); each test gets a fresh copy (a file copy for SQLite, ``CREATE DATABASE
... TEMPLATE`` for Postgres).
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import SqlStore
from tests.support.postgres import PgServer, pg_bin_dir, running_server

TEMPLATE_DB = "icefrog_template"
_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    if pg_bin_dir() is None:
        message = "Postgres is not installed (apt-get install postgresql; `make setup` does)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must test the real server, never skip it
        pytest.skip(message)
    with running_server() as server:
        yield server


@pytest.fixture(scope="session")
def pg_template(pg_server: PgServer) -> str:
    pg_server.janitor(TEMPLATE_DB).init()
    migrate.upgrade(pg_server.url(TEMPLATE_DB))
    return TEMPLATE_DB


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "icefrog.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database of each backend."""
    if request.param == "sqlite":
        path = tmp_path / "icefrog.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    template = request.getfixturevalue("pg_template")
    name = f"icefrog_test_{next(_names)}"
    janitor = server.janitor(name, template=template)
    janitor.init()
    try:
        yield server.url(name)
    finally:
        janitor.drop()


@pytest.fixture(params=BACKENDS)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no tables) of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = f"icefrog_empty_{next(_names)}"
    janitor = server.janitor(name)
    janitor.init()
    try:
        yield server.url(name)
    finally:
        janitor.drop()


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    s = SqlStore(db_url)
    try:
        yield s
    finally:
        s.close()
