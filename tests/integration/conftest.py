"""Integration fixtures: the real local Slurm cluster (slurm_conf/dev/cluster.sh).

A test marked ``slurm`` gets the cluster: the first one runs ``cluster.sh up`` when
``cluster.sh status`` says it is down, SLURM_CONF is exported to the tests, and at the end
of the session the cluster is brought down again only if this session started it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "slurm_conf" / "dev" / "cluster.sh"
T = TypeVar("T")


def cluster_sh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[str]:
    """Path of the running cluster's slurm.conf (SLURM_CONF is exported while tests run)."""
    started = False
    if cluster_sh("status").returncode != 0:
        up = cluster_sh("up")
        if up.returncode != 0:
            pytest.fail(f"cluster.sh up failed:\n{up.stdout}\n{up.stderr}")
        started = True
    conf = cluster_sh("conf").stdout.strip()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield conf
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        if started:
            cluster_sh("down")


@pytest.fixture(autouse=True)
def _cluster_for_slurm_tests(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")


def wait_for(
    what: str, fn: Callable[[], T | None], timeout: float = 30.0, every: float = 0.25
) -> T:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


@pytest.fixture
def job_dir() -> Path:
    """A folder every uid can write (job output, checkpoint markers), outside /root."""
    base = Path("/tmp") / "icefrog-it"
    base.mkdir(exist_ok=True)
    base.chmod(0o1777)
    d = Path(tempfile.mkdtemp(dir=base, prefix="job."))
    d.chmod(0o1777)
    return d
