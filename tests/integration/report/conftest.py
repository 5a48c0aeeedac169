"""Fixtures of the report tests: the store's SQLite and Postgres databases come from
tests/support/databases.py; the local time zone pinned to UTC and the report clock fixed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from icefrog_slurm.commands import storeargs
from tests.integration.report.populate import NOW


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
