"""Security-test fixtures shared by every attack test: real munge and the two test users.

The tests here play a hostile local user against the real parts (munge, Slurm, the
databases of tests/conftest.py). ``munge_users`` gives the uids of the two unprivileged
test users (icefrog-alice, icefrog-bob) with a working system munged; it skips only when
not run as root (making users and acting as them needs root) and fails when munge cannot be
made to work: the real part is never silently left out. A test marked ``slurm`` gets the
real local cluster (``slurm_cluster`` of tests/integration/conftest.py: SLURM_CONF set).
"""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import slurm_cluster  # noqa: F401 (the session fixture)
from tests.support.munge import ensure_munged, ensure_users


@pytest.fixture(autouse=True)
def _cluster_for_slurm_tests(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")


@pytest.fixture(scope="session")
def munge_users() -> dict[str, int]:
    """uid of each test user, once munge decodes a credential."""
    if os.geteuid() != 0:
        pytest.skip("the attack tests need root (to make the test users and act as them)")
    why = ensure_munged()
    if why is not None:
        pytest.fail(f"real munge is needed: {why}")
    return ensure_users()
