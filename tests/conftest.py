"""Suite-wide fixtures: the databases (SQLite and a real Postgres, one server a session), and
the Slurm versions the tests marked ``slurm`` run against.

``ICEFROG_TEST_SLURM`` names those versions, a comma list of ``host`` (the host's own Slurm),
``24.11`` and ``26.05`` (each from a Debian root: ``slurm_conf/dev/cluster.sh --slurm``);
default ``host``. With more than one, a test that takes the cluster through the
``slurm_version`` fixture (the integration and end-to-end suites' autouse cluster fixture
does) runs once a version, its id ending in the version (``test_x[24.11]``); pytest orders
the tests so that each version's cluster comes up once. A test marked ``one_slurm_version``
(the controller's own logic, whose Slurm commands other tests cover on every version) runs
against the first version only; its other versions are deselected.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.support.databases"]

SLURM_VERSIONS = ("host", "24.11", "26.05")
"""What cluster.sh --slurm takes."""


def slurm_versions() -> list[str]:
    """The versions of ``ICEFROG_TEST_SLURM`` (checked: a typo must not pass as no test)."""
    raw = os.environ.get("ICEFROG_TEST_SLURM", "host")
    wanted = [v.strip() for v in raw.split(",") if v.strip()]
    bad = [v for v in wanted if v not in SLURM_VERSIONS]
    if bad or not wanted:
        raise pytest.UsageError(
            f"ICEFROG_TEST_SLURM={raw!r}: a comma list of {', '.join(SLURM_VERSIONS)}"
        )
    return list(dict.fromkeys(wanted))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "slurm_version" in metafunc.fixturenames and metafunc.definition.get_closest_marker("slurm"):
        versions = slurm_versions()
        if versions != ["host"]:
            metafunc.parametrize("slurm_version", versions, indirect=True, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = slurm_versions()[0]
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        version = callspec.params.get("slurm_version", first) if callspec else first
        once = item.get_closest_marker("one_slurm_version") is not None
        (drop if once and version != first else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def slurm_version(request: pytest.FixtureRequest) -> str:
    """The Slurm a test marked ``slurm`` runs against (cluster.sh --slurm): its parameter,
    else the first of ``ICEFROG_TEST_SLURM``."""
    return str(getattr(request, "param", slurm_versions()[0]))


@pytest.fixture
def keep_signal_handlers() -> Iterator[None]:
    """A Trainer installs its TERM and USR1 handlers in the test's process: put pytest's
    back after the test."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
