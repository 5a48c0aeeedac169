"""Integration fixtures: the real local Slurm cluster (slurm_conf/dev/cluster.sh).

A test marked ``slurm`` gets the cluster of its Slurm version (``slurm_version`` of
tests/conftest.py: ``ICEFROG_TEST_SLURM``, default the host's): the first one runs
``cluster.sh up --slurm V`` when ``cluster.sh status --slurm V`` says it is down;
SLURM_CONF, ICEFROG_SLURM (cluster.sh's version) and, for a version from a Debian root, PATH
with that version's client commands first are exported while its tests run; at the end the
cluster is brought down again only if this session started it.

A test that takes the ``sharing`` fixture runs once a GPU-sharing kind (``shard``,
``mps``). Its ``mps`` variant runs on a cluster of its own, in CUDA MPS mode (``cluster.sh
up --sharing mps`` in ``var/cluster-mps``, slurmctld port 16857, slurmd 17041-17044; for
24.11 and 26.05 ``var/cluster-mps-V``, 16877/17061 and 16887/17071), instead of the
shard cluster: SLURM_CONF names it while the test runs (the test takes ``sharing`` before
``cluster``, so that its jobs are cancelled there), and it is brought down at the end only
if this session started it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from icefrog_slurm.domain.cluster import SlurmJobState
from icefrog_slurm.slurm.port import ClusterPort

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


@contextmanager
def _exported(env: dict[str, str]) -> Iterator[None]:
    """``env`` in os.environ while the block runs, the old values back after it."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _running_cluster(
    version: str, env: dict[str, str] | None = None, what: str = ""
) -> Iterator[dict[str, str]]:
    """A running cluster of Slurm ``version`` (cluster.sh with ``env``), brought up when
    down; yields its client environment (SLURM_CONF, ICEFROG_SLURM and, for a version from
    a Debian root, PATH with its client commands first); at the end it is brought down
    again only if this session started it."""
    args = ("--slurm", version)
    started = False
    status = cluster_sh("status", *args, env=env)
    if status.returncode != 0:
        up = cluster_sh("up", *args, env=env)
        if up.returncode != 0:
            pytest.fail(f"cluster.sh up {version}{what} failed:\n{up.stdout}\n{up.stderr}")
        # ours to bring down only if its slurmctld was not running: a node that was down
        # (a test stopped its slurmd) does not make another session's cluster this one's
        started = "slurmctld:  up" not in status.stdout
    conf = cluster_sh("conf", *args, env=env).stdout.strip()
    out = {"SLURM_CONF": conf, "ICEFROG_SLURM": version}
    if version != "host":
        out["PATH"] = f"{Path(conf).parent.parent / 'bin'}{os.pathsep}{os.environ['PATH']}"
    try:
        yield out
    finally:
        if started:
            cluster_sh("down", *args, env=env)


@pytest.fixture(scope="session")
def slurm_cluster(slurm_version: str) -> Iterator[str]:
    """Path of the running cluster's slurm.conf (its environment exported while tests run)."""
    with _running_cluster(slurm_version) as env, _exported(env):
        yield env["SLURM_CONF"]


MPS_CLUSTERS = {
    "host": ("cluster-mps", 16857, 17041),
    "24.11": ("cluster-mps-24.11", 16877, 17061),
    "26.05": ("cluster-mps-26.05", 16887, 17071),
}
"""The MPS-mode cluster of each Slurm version: folder under var/, slurmctld port, first
slurmd port (clear of the shard clusters', the accounting one's and the golden one's)."""


@pytest.fixture(scope="session")
def mps_cluster(slurm_version: str) -> Iterator[dict[str, str]]:
    """The environment of a running MPS-mode cluster (SLURM_CONF, ICEFROG_SLURM, PATH)."""
    folder, ctld, node = MPS_CLUSTERS[slurm_version]
    env = {
        **os.environ,
        "ICEFROG_CLUSTER_DIR": str(REPO / "var" / folder),
        "ICEFROG_CLUSTER_CTLD_PORT": str(ctld),
        "ICEFROG_CLUSTER_NODE_PORT": str(node),
        "ICEFROG_CLUSTER_SHARING": "mps",
    }
    with _running_cluster(slurm_version, env, " --sharing mps") as out:
        yield out


@pytest.fixture(params=["shard", "mps"])
def sharing(request: pytest.FixtureRequest) -> Iterator[str]:
    """The GPU-sharing kind a test runs with (module docstring); for ``mps`` the MPS-mode
    cluster's environment is exported while the test runs."""
    kind: str = request.param
    if kind == "shard":
        yield kind
        return
    with _exported(request.getfixturevalue("mps_cluster")):
        yield kind


@pytest.fixture(autouse=True)
def _cluster_for_slurm_tests(request: pytest.FixtureRequest, slurm_version: str) -> None:
    if request.node.get_closest_marker("slurm") is None:
        return
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("sharing") == "mps":
        return  # its own cluster: the sharing fixture
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


def wait_ended(
    backend: ClusterPort, job_id: str, timeout: float, every: float = 1.0
) -> SlurmJobState:
    """The Slurm job's state once Slurm says it ended; fail after ``timeout``."""

    def ended() -> SlurmJobState | None:
        state = backend.poll(job_ids=[job_id]).get(job_id)
        return state if state is not None and state.finished else None

    return wait_for(f"Slurm job {job_id} to end", ended, timeout=timeout, every=every)


@pytest.fixture
def job_dir() -> Path:
    """A folder every uid can write (job output, checkpoint markers), outside /root."""
    base = Path("/tmp") / "icefrog-it"
    base.mkdir(exist_ok=True)
    base.chmod(0o1777)
    d = Path(tempfile.mkdtemp(dir=base, prefix="job."))
    d.chmod(0o1777)
    return d
