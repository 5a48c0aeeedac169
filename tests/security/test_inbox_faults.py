"""A database outage loses no report: Postgres refuses connections in the middle of a drain.

The store's database stops accepting connections (``ALLOW_CONNECTIONS false``) and its
sessions are terminated right after the first report's credential is checked. Every report
that reaches the store then waits in the inbox (a transient fault, not a rejection), the
drain stops after three faults in a row, a drain that starts during the outage leaves
everything in place, and once the database is back one drain accepts every report and
rejects the bad one. Real Postgres, real munge, the real test user.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from icefrog_slurm import security
from icefrog_slurm.store.inbox import DrainResult
from icefrog_slurm.store.sql import SqlStore
from tests.security.inbox_support import METRIC, make_site
from tests.support.munge import USERS
from tests.support.postgres import PgServer

ALICE = USERS[0]
ALICE_JOB = "101"
_names = itertools.count()

pytestmark = pytest.mark.postgres


@dataclass
class Outage:
    """Cuts and mends the connections to one database of the test server."""

    admin: Engine
    name: str

    def cut(self) -> None:
        with self.admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false'))
            c.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                {"d": self.name},
            )

    def mend(self) -> None:
        with self.admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true'))


@pytest.fixture
def pg(pg_server: PgServer, pg_template: str) -> Iterator[tuple[SqlStore, Outage]]:
    name = f"icefrog_outage_{next(_names)}"
    janitor = pg_server.janitor(name, template=pg_template)
    janitor.init()
    admin = create_engine(pg_server.url("postgres"), isolation_level="AUTOCOMMIT")
    store = SqlStore(pg_server.url(name))
    outage = Outage(admin, name)
    try:
        yield store, outage
    finally:
        outage.mend()
        store.close()
        admin.dispose()
        janitor.drop()


def test_a_database_outage_in_a_drain_loses_no_report(
    pg: tuple[SqlStore, Outage], tmp_path: Path, munge_users: dict[str, int]
) -> None:
    store, outage = pg
    site = make_site(store, tmp_path, munge_users)
    site.register(ALICE, ALICE_JOB)
    assert site.drain() == DrainResult(accepted=1)
    for seq in (1, 2, 3, 4):
        site.drop(ALICE, "metric", {**METRIC, "epoch": seq}, seq=seq, job=ALICE_JOB)
    site.put(ALICE, ALICE_JOB, "9-metric.json", b"{not json")
    decode = site.inbox.decode

    def cut_after_first(credential: str) -> security.DecodedCredential:
        site.inbox.decode = decode
        cred = decode(credential)
        outage.cut()  # the report is checked; the store goes away before it is written
        return cred

    site.inbox.decode = cut_after_first
    assert site.drain() == DrainResult(deferred=3)  # three faults in a row: the drain stops
    assert len(site.left_in_inbox()) == 5
    assert site.drain() == DrainResult(deferred=5)  # down from the start: all wait
    assert len(site.left_in_inbox()) == 5

    outage.mend()
    assert site.drain() == DrainResult(accepted=4, rejected=1)
    assert site.metrics(ALICE_JOB) == [0.5] * 4 and site.left_in_inbox() == []
    (reason,) = site.reasons()
    assert "not valid JSON" in reason
