"""Fixtures of the report tests: the store's SQLite and Postgres databases come from
tests/support/databases.py; ``db``: one of them filled by populate.py, as the report
commands' ``--db`` arguments; the local time zone pinned to UTC and the report clock fixed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from icefrog_slurm.commands import storeargs
from icefrog_slurm.store.sql import SqlStore
from tests.integration.report.populate import NOW, populate


@pytest.fixture(autouse=True)
def _utc_and_fixed_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setattr(storeargs, "now", lambda: NOW)
    for name in ("SACCT_FORMAT", "SQUEUE_FORMAT", "SQUEUE_FORMAT2", "SLURM_TIME_FORMAT"):
        monkeypatch.delenv(name, raising=False)  # the caller's own would change the output
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def db(db_url: str) -> list[str]:
    """The store at ``db_url`` filled by populate.py; the reports' ``--db`` arguments."""
    store = SqlStore(db_url)
    try:
        populate(store)
    finally:
        store.close()
    return ["--db", db_url]
