"""A job gives up sharing a GPU for itself only. After running out of memory while
sharing, a job re-registers with ``accepts_shared: false`` (icefrog_launcher.sharing) and
the controller never shares it again. Bob (icefrog-bob) forges that report for Alice's
job, signed by real munge as himself, once in a folder of his own and once in hers: both
are rejected and her job keeps its spec. Alice's own report takes effect (she can only
lose by it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from icefrog_slurm.store.sql import SqlStore
from tests.security.inbox_support import Site, site_in_tmp, spec_payload
from tests.support.munge import USERS

ALICE, BOB = USERS
REFUSING = {**spec_payload(), "accepts_shared": False}


@pytest.fixture
def site(store: SqlStore, munge_users: dict[str, int]) -> Iterator[Site]:
    with site_in_tmp(store, munge_users, "icefrog-unshare") as site:
        yield site


def _accepts_shared(site: Site, job: str) -> bool:
    record = site.job(job)
    assert record is not None
    return record.spec.accepts_shared


def test_a_forged_sharing_failure_for_another_users_job_changes_nothing(site: Site) -> None:
    site.register(ALICE, "4101")
    site.drain()
    assert _accepts_shared(site, "4101")
    # Bob's forgery: in a folder he makes for her job, and written into hers
    site.drop(BOB, "register", REFUSING, job="4101", seq=7, folder="4101.bob")
    site.drop(BOB, "register", REFUSING, job="4101", seq=8)
    result = site.drain()
    assert result.accepted == 0 and result.rejected == 2
    assert _accepts_shared(site, "4101")
    # Alice's own job says it: taken
    site.drop(ALICE, "register", REFUSING, job="4101", seq=9)
    assert site.drain().accepted == 1
    assert not _accepts_shared(site, "4101")
