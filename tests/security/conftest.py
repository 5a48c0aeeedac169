"""Security-test fixtures shared by every attack test: real munge and the two test users.

The tests here play a hostile local user against the real parts (munge, Slurm, the
databases of tests/conftest.py). ``munge_users`` gives the uids of the two unprivileged
test users (icefrog-alice, icefrog-bob) with a working system munged, or skips naming why.
"""

from __future__ import annotations

import pytest

from tests.support.munge import ensure_munged, ensure_users


@pytest.fixture(scope="session")
def munge_users() -> dict[str, int]:
    """uid of each test user, once munge decodes a credential (skips when it cannot)."""
    why = ensure_munged()
    if why is not None:
        pytest.skip(why)
    return ensure_users()
