"""The leader lease on both databases: one lead a database, whatever path or connection
reaches it; a stolen lead is noticed by the old leader's next tick and refused by its next
write; databases no lock can guard are refused for the controller."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from icefrog_slurm.errors import IcefrogError, InputError, LostLead
from icefrog_slurm.settings import settings_from_mapping
from icefrog_slurm.store import leader
from icefrog_slurm.store.leader import SqlLease
from icefrog_slurm.store.models import JobRow, LeaderLeaseRow
from icefrog_slurm.store.sql import SqlStore, make_engine
from tests.integration.conftest import wait_for
from tests.integration.store.helpers import spec
from tests.support.lease import POSTGRES_ONLY, lock_waiters, read, steal_the_lead


@pytest.fixture
def stores(db_url: str) -> Iterator[tuple[SqlStore, SqlStore]]:
    """Two controllers' stores on one database."""
    first, second = SqlStore(db_url), SqlStore(db_url)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def add_job(store: SqlStore, sid: str) -> None:
    with store.transaction() as tx:
        tx.create_job(
            name=f"j{sid}", owner_uid=1, owner_user="u", slurm_job_id=sid, spec=spec(), now=1.0
        )


def job_count(url: str) -> int:
    return len(read(url, select(JobRow.id)))


def test_each_lead_takes_a_new_epoch(stores: tuple[SqlStore, SqlStore]) -> None:
    first, second = stores
    a = first.try_lead()
    assert a is not None and second.try_lead() is None
    a.release()
    b = second.try_lead()
    assert b is not None and b.epoch == a.epoch + 1 and first.try_lead() is None
    with b.hold():
        add_job(second, "1")  # the leader writes
    add_job(first, "2")  # a store that released its lease writes as a plain client
    b.release()
    assert job_count(first.url) == 2


def test_a_stolen_lead_refuses_the_old_leaders_writes(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    first, second = stores
    old = first.try_lead()
    assert old is not None
    add_job(first, "1")
    steal_the_lead(first.url)
    new = second.try_lead()
    assert new is not None and new.epoch == old.epoch + 1
    with pytest.raises(LostLead, match=f"led as epoch {old.epoch}"):
        add_job(first, "2")  # the stale token: rolled back, nothing written
    with pytest.raises(LostLead), old.hold():
        pytest.fail("a tick ran under a lost lease")
    with pytest.raises(LostLead), first.transaction() as tx:  # every write refused now
        tx.round()
    with new.hold():
        add_job(second, "3")
    assert job_count(first.url) == 2
    old.release()
    new.release()


def test_the_next_tick_finds_its_lock_gone(stores: tuple[SqlStore, SqlStore]) -> None:
    """Lost before anyone else led: the lock check alone stops the tick."""
    first, _ = stores
    lease = first.try_lead()
    assert lease is not None
    steal_the_lead(first.url)
    with pytest.raises(LostLead, match="lock"), lease.hold():
        pytest.fail("a tick ran without its lock")
    lease.release()


@POSTGRES_ONLY
def test_a_new_leader_waits_for_the_old_leaders_tick(
    stores: tuple[SqlStore, SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Postgres: the lock's session dies in the middle of a tick; a standby gets the lock
    but cannot take the lease until that tick ends."""
    first, second = stores
    monkeypatch.setattr(leader, "TAKEOVER_WAIT_S", 1)
    old = first.try_lead()
    assert old is not None
    with old.hold():
        steal_the_lead(first.url)
        assert second.try_lead() is None  # its bump timed out behind the tick's row lock
        add_job(first, "1")  # the old leader's tick goes on: nobody else leads yet
    new = second.try_lead()
    assert new is not None and new.epoch == old.epoch + 1
    with pytest.raises(LostLead):
        add_job(first, "2")
    assert job_count(first.url) == 1
    old.release()
    new.release()


@POSTGRES_ONLY
def test_a_bump_that_waits_does_not_block_the_tick(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    """The old leader's own write transactions share the row lock with its guard: a tick
    never waits for the standby that waits for it."""
    first, second = stores
    old = first.try_lead()
    assert old is not None
    got: list[SqlLease | None] = []
    with old.hold():
        steal_the_lead(first.url)
        standby = threading.Thread(target=lambda: got.append(second.try_lead()))
        standby.start()
        wait_for("the standby's bump to wait for the lease row", lambda: lock_waiters(first.url))
        add_job(first, "1")
    standby.join()
    assert got and got[0] is not None and got[0].epoch == old.epoch + 1
    got[0].release()
    old.release()


def test_a_second_path_to_a_sqlite_file_gives_no_second_lead(
    tmp_path: Path, sqlite_template: Path
) -> None:
    real = tmp_path / "state" / "icefrog.db"
    real.parent.mkdir()
    shutil.copyfile(sqlite_template, real)
    (tmp_path / "link.db").symlink_to(real)
    (tmp_path / "linked-dir").symlink_to(real.parent)
    paths = [real, tmp_path / "link.db", tmp_path / "linked-dir" / "icefrog.db"]
    paths.append(tmp_path / "state" / ".." / "state" / "icefrog.db")
    stores = [SqlStore(f"sqlite:///{p}") for p in paths]
    try:
        lease = stores[0].try_lead()
        assert lease is not None
        assert [s.try_lead() for s in stores[1:]] == [None, None, None]
        lease.release()
        again = stores[1].try_lead()  # through the symlink: the same lock, a new epoch
        assert again is not None and again.epoch == lease.epoch + 1
        assert stores[0].try_lead() is None
        again.release()
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?uri=true"])
def test_the_controller_refuses_a_database_no_lock_guards(url: str) -> None:
    store = SqlStore(url, check_schema=False)
    try:
        with pytest.raises(InputError, match="needs a database file or Postgres"):
            store.try_lead()
    finally:
        store.close()
    settings = settings_from_mapping({"store": {"url": url}})
    with pytest.raises(InputError, match="cannot be locked against a second controller"):
        SqlStore.from_settings(settings)


def test_the_daemon_will_not_run_on_an_in_memory_database() -> None:
    from icefrog_slurm.controller.daemon import Controller
    from icefrog_slurm.settings import Settings

    store = SqlStore("sqlite://", check_schema=False)
    controller = Controller(
        settings=Settings(),
        policy=None,  # type: ignore[arg-type]
        cluster=None,  # type: ignore[arg-type]
        store=store,
        clock=None,  # type: ignore[arg-type]
        files=None,  # type: ignore[arg-type]
    )
    try:
        with pytest.raises(InputError, match="sqlite://: the controller needs a database file"):
            controller.run(max_ticks=1)  # before any tick, and not retried as a fault
    finally:
        store.close()


def test_the_lease_row_is_one_row(db_url: str) -> None:
    assert read(db_url, select(LeaderLeaseRow.id, LeaderLeaseRow.epoch)) == [(1, 0)]


def test_a_lock_file_made_by_someone_else_is_refused(tmp_path: Path, sqlite_template: Path) -> None:
    """A user who can write the state folder plants the lock file (to hold its flock for
    ever, or to point it elsewhere): the controller, and a migration taking the same
    lock, name it and take no lead."""
    from icefrog_slurm.store import migrate

    db = tmp_path / "icefrog.db"
    shutil.copyfile(sqlite_template, db)
    store = SqlStore(f"sqlite:///{db}")
    lock = Path(f"{db}.leader")
    planted = r"icefrog.db.leader is not a plain file of uid \d+ \(a -rw-.* file of uid 4242\)"
    try:
        lock.write_text("")
        os.chown(lock, 4242, 4242)
        with pytest.raises(IcefrogError, match=planted):
            store.try_lead()
        with pytest.raises(IcefrogError, match=planted), migrate.leader_locked(store.url):
            pass
        lock.unlink()
        lock.symlink_to(tmp_path / "elsewhere")
        with pytest.raises(OSError):  # never followed
            store.try_lead()
        with pytest.raises(OSError), migrate.leader_locked(store.url):
            pass
        assert not (tmp_path / "elsewhere").exists()
        lock.unlink()
        lease = store.try_lead()  # the folder is the controller's again
        assert lease is not None
        lease.release()
    finally:
        store.close()


@POSTGRES_ONLY
def test_a_cut_network_drops_the_lock_in_about_a_minute(
    db_url: str, stores: tuple[SqlStore, SqlStore]
) -> None:
    """Keepalives on both ends: the server ends a vanished leader's session (freeing the
    lock for a standby), and the leader's own queries fail rather than hang."""
    first, _ = stores
    lease = first.try_lead()
    assert isinstance(lease, leader._PgLease)
    server = lease._conn.execute(text("SHOW tcp_keepalives_idle")).scalar()
    assert server in ("30", "30s")
    client = libpq_parameters(first.engine)
    assert (client["keepalives_idle"], client["tcp_user_timeout"]) == ("30", "60000")
    lease.release()
    engine = make_engine(f"{db_url}?keepalives_idle=5")  # the URL's own setting wins
    try:
        assert libpq_parameters(engine)["keepalives_idle"] == "5"
    finally:
        engine.dispose()


def libpq_parameters(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        dbapi: Any = conn.connection.dbapi_connection
        return dict(dbapi.info.get_parameters())


def test_a_standby_taking_the_lead_refuses_a_schema_changed_while_it_waited(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    """B waits while A leads; A stops and the database is downgraded (allowed: nobody
    leads); B takes the lock, finds the revision is not its code's, lets the lock go and
    refuses to run, where it led on a schema its code does not know."""
    from icefrog_slurm.store import migrate

    a, b = stores
    lease = a.try_lead()
    assert lease is not None and b.try_lead() is None
    lease.release()
    migrate.downgrade(b.url, "0006")
    with pytest.raises(InputError, match="run `icefrog db upgrade`"):
        b.try_lead()
    migrate.upgrade(b.url)
    again = a.try_lead()  # the lock was let go
    assert again is not None
    again.release()
