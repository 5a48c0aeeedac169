"""Fixtures of the controller's tests on the real cluster: a Slurm CLI backend that
cancels, at the end of each test, the unfinished jobs whose icefrog tag starts with the
module's ``TAG_PREFIX`` (its own jobs only: other tests and sessions share the cluster),
and a migrated SQLite store in the test's folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.store.sql import SqlStore
from tests.integration.controller.support import backend, make_settings, make_store


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCliBackend]:
    prefix: str = request.module.TAG_PREFIX
    be = backend()
    yield be
    for j in be._jobs().values():
        if not j.finished and j.tag is not None and j.tag.key.startswith(prefix):
            be.cancel(job_id=j.job_id)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = make_store(make_settings(tmp_path))
    yield s
    s.close()
