"""Split brain on a real Postgres: two controllers, the leader's lock connection killed in
the middle of its tick; at no moment do both enact, and the cluster converges.

The Slurm side is a fake on purpose: the property under test is the database lease, and a
fake cluster can record every command with the controller that issued it and the lease
epoch the database held at that very moment (``SimCluster``, the simulator's in-memory
Slurm, shared by both controllers behind a recorder).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.sim.cluster import SimCluster
from icefrog_slurm.slurm.port import SubmitRequest
from icefrog_slurm.store.leader import SqlLease
from icefrog_slurm.store.models import LeaderLeaseRow
from icefrog_slurm.store.sql import SqlStore, make_engine
from tests.integration.conftest import wait_for
from tests.integration.controller.support import FixedPolicy
from tests.integration.store.helpers import spec
from tests.support.lease import POSTGRES_ONLY, lock_waiters, read, steal_the_lead

MUTATING = frozenset(
    {"submit_held", "release", "release_now", "update_pending", "signal_batch"}
    | {"requeue_hold", "hold", "cancel", "resubmit"}
)
ROUND_S = 300.0


class Stopped(Exception):
    """Raised from the test clock's sleep to end a controller's run()."""


@dataclass(frozen=True)
class Command:
    seq: int
    who: str
    name: str
    job_id: str
    issuer_epoch: int  # the lease the issuing controller holds
    db_epoch: int  # the lease in the database when the command ran


class Shared:
    """The one fake cluster both controllers see, and the record of what they did."""

    def __init__(self, url: str, epochs: dict[str, list[int]]) -> None:
        self.sim = SimCluster(nodes=2, gpus_per_node=4, shards_per_gpu=2)
        self.lock = threading.Lock()
        self.commands: list[Command] = []
        self.epochs = epochs
        self._engine = make_engine(url)
        self.gate_hit, self.gate = threading.Event(), threading.Event()
        self.gated = "first"  # whose first release_now waits at the gate

    def close(self) -> None:
        self._engine.dispose()

    def run(self, who: str, name: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        if who == self.gated and name == "release_now" and not self.gate_hit.is_set():
            self.gate_hit.set()  # the first leader, in the middle of enacting, stops here
            assert self.gate.wait(60), "the test never opened the gate"
        with self.lock:
            if name in MUTATING:
                with self._engine.connect() as conn:
                    db_epoch = conn.execute(select(LeaderLeaseRow.epoch)).scalar_one()
                mine = self.epochs[who][-1] if self.epochs[who] else 0
                job = str(kwargs.get("job_id", ""))
                self.commands.append(Command(len(self.commands), who, name, job, mine, db_epoch))
            out = fn(**kwargs)
            if name in MUTATING:
                self.sim.schedule()
            return out


class RecordingCluster:
    """One controller's ClusterPort: the shared fake, every command recorded as its own."""

    def __init__(self, who: str, shared: Shared) -> None:
        self.who, self.shared = who, shared

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.shared.sim, name)
        return lambda **kwargs: self.shared.run(self.who, name, fn, kwargs)


class TrackedStore(SqlStore):
    """A controller's store that notes each epoch it led as (and leads no more once the
    test is over: the other one's lock, released as it stops, is not a new lead)."""

    def __init__(self, url: str, epochs: list[int], stop: threading.Event) -> None:
        super().__init__(url)
        self.epochs, self.attempts, self.stop = epochs, 0, stop

    def try_lead(self) -> SqlLease | None:
        if self.stop.is_set():
            raise Stopped
        self.attempts += 1
        lease = super().try_lead()
        if lease is not None:
            self.epochs.append(lease.epoch)
        return lease


class SharedClock:
    """Real time plus an offset the test moves (to make a round due); sleeps are short, and
    raise Stopped once the test is over."""

    def __init__(self) -> None:
        self.offset, self.stop = 0.0, threading.Event()

    def now(self) -> float:
        return time.time() + self.offset

    def sleep(self, seconds: float) -> None:
        if self.stop.is_set():
            raise Stopped
        time.sleep(min(seconds, 0.05))


class NoFiles:
    """No decision files: nothing of this test reads them."""

    def write_decision(self, **_: object) -> None:
        pass

    def checkpoint_marked(self, **_: object) -> bool:
        return False


@dataclass
class Pair:
    shared: Shared
    stores: dict[str, TrackedStore]
    clock: SharedClock
    policy: FixedPolicy
    jobs: dict[str, tuple[int, str]]  # key -> (store job id, Slurm job id)


def settings(tmp: Path) -> Settings:
    return settings_from_mapping(
        {
            "state": {"dir": str(tmp)},
            "controller": {"round_period_s": ROUND_S, "reconcile_poll_s": 0.05},
        }
    )


@pytest.fixture
def pair(db_url: str) -> Iterator[Pair]:
    epochs: dict[str, list[int]] = {"first": [], "second": []}
    shared = Shared(db_url, epochs)
    clock = SharedClock()
    stores = {who: TrackedStore(db_url, epochs[who], clock.stop) for who in epochs}
    jobs = {}
    for key in ("a", "b"):
        sid = shared.sim.submit_held(
            request=SubmitRequest(
                script="/sim/job.sh", tag=IcefrogTag(key=key), name=key, gres=Gres("gpu", 1)
            )
        )
        with stores["first"].transaction() as tx:
            job = tx.create_job(
                name=key,
                owner_uid=shared.sim.user_id,
                owner_user="alice",
                slurm_job_id=sid,
                spec=spec(),
                now=clock.now(),
            )
        jobs[key] = (job, sid)
    try:
        yield Pair(shared, stores, clock, FixedPolicy(), jobs)
    finally:
        clock.stop.set()
        shared.gate.set()
        for store in stores.values():
            store.close()
        shared.close()


def start(pair: Pair, who: str, tmp: Path, errors: list[BaseException]) -> threading.Thread:
    controller = Controller(
        settings=settings(tmp),
        policy=pair.policy,
        cluster=RecordingCluster(who, pair.shared),  # type: ignore[arg-type]
        store=pair.stores[who],
        clock=pair.clock,
        files=NoFiles(),  # type: ignore[arg-type]
    )

    def run() -> None:
        try:
            controller.run()
        except Stopped:
            pass
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"controller-{who}")
    thread.start()
    return thread


def running(pair: Pair, key: str) -> bool:
    with pair.shared.lock:
        state = pair.shared.sim.poll(job_ids=[pair.jobs[key][1]])[pair.jobs[key][1]]
    return state.state == "RUNNING" and state.gres == Gres("gpu", 1)


@POSTGRES_ONLY
def test_a_killed_lock_connection_never_gives_two_enacting_leaders(
    pair: Pair, db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (a, sid_a), (b, sid_b) = pair.jobs["a"], pair.jobs["b"]
    node = pair.shared.sim.node_names[0]
    pair.policy.decisions[a] = (1, False, (node,))
    errors: list[BaseException] = []
    with caplog.at_level(logging.INFO):
        first = start(pair, "first", tmp_path / "first", errors)
        wait_for("the first controller to start enacting", pair.shared.gate_hit.is_set)
        second = start(pair, "second", tmp_path / "second", errors)
        wait_for("the standby to find the lock taken", lambda: pair.stores["second"].attempts)
        steal_the_lead(db_url)  # the first leader's lock session dies mid-tick
        wait_for(
            "the standby to wait for the first leader's tick (or to lead)",
            lambda: lock_waiters(db_url) or pair.stores["second"].epochs,
        )
        pair.policy.decisions[b] = (1, False, (node,))  # the next round has more to enact
        pair.clock.offset += ROUND_S + 1
        pair.shared.gate.set()  # the first leader goes on with its tick
        wait_for("both jobs to run", lambda: running(pair, "a") and running(pair, "b"))
        pair.clock.stop.set()
        first.join(30)
        second.join(30)
    assert not errors, errors
    assert not first.is_alive() and not second.is_alive()

    commands = pair.shared.commands
    stale = [c for c in commands if c.issuer_epoch != c.db_epoch]
    assert stale == [], "a controller enacted under a lease it no longer held"
    assert pair.stores["first"].epochs == [1] and pair.stores["second"].epochs == [2]
    by_first = [c for c in commands if c.who == "first"]
    by_second = [c for c in commands if c.who == "second"]
    assert {c.job_id for c in by_first} == {sid_a}  # it finished its tick under its lease
    assert ("release_now", sid_b) in {(c.name, c.job_id) for c in by_second}
    assert max(c.seq for c in by_first) < min(c.seq for c in by_second)
    assert "NOT THE ACTIVE CONTROLLER ANY MORE (led as epoch 1)" in caplog.text


def test_a_leader_that_lost_its_lock_leads_again_under_a_new_epoch(
    pair: Pair, db_url: str, tmp_path: Path
) -> None:
    """No standby: the controller notices its lock is gone, waits for it again, takes a
    new epoch and goes on enacting (a Postgres restart or a network cut loses no job)."""
    (a, _), (b, sid_b) = pair.jobs["a"], pair.jobs["b"]
    node = pair.shared.sim.node_names[0]
    pair.shared.gated = ""
    pair.policy.decisions[a] = (1, False, (node,))
    errors: list[BaseException] = []
    solo = start(pair, "first", tmp_path, errors)
    wait_for("job a to run", lambda: running(pair, "a"))
    steal_the_lead(db_url)
    wait_for("a new lead", lambda: len(pair.stores["first"].epochs) == 2)
    pair.policy.decisions[b] = (1, False, (node,))
    pair.clock.offset += ROUND_S + 1
    wait_for("job b to run", lambda: running(pair, "b"))
    pair.clock.stop.set()
    solo.join(30)
    assert not errors, errors
    assert pair.stores["first"].epochs == [1, 2]
    assert [c.issuer_epoch for c in pair.shared.commands if c.job_id == sid_b] == [2, 2]
    assert all(c.issuer_epoch == c.db_epoch for c in pair.shared.commands)


def test_a_stale_leaders_drain_leaves_every_report_for_the_leader(
    db_url: str, tmp_path: Path
) -> None:
    """The inbox writes through the fenced store: a controller that lost the lead neither
    accepts nor rejects a report (both would be final); the real leader's drain does."""
    from icefrog_slurm.store.inbox import ReportInbox, SlurmJobFacts
    from icefrog_slurm.store.models import RejectedReportRow

    def inbox(store: SqlStore) -> ReportInbox:
        return ReportInbox(
            store=store,
            inbox_dir=tmp_path / "inbox",
            archive_dir=tmp_path / "archive",
            slurm_jobs=lambda ids: {i: SlurmJobFacts(uid=os.getuid(), icefrog=True) for i in ids},
        )

    def files() -> list[Path]:
        return sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())

    old_store, new_store = SqlStore(db_url), SqlStore(db_url)
    try:
        old = old_store.try_lead()
        assert old is not None
        stale = inbox(old_store)
        stale.prepare()
        steal_the_lead(db_url)
        new = new_store.try_lead()
        assert new is not None
        (tmp_path / "inbox" / "junk").mkdir()
        (tmp_path / "inbox" / "junk" / "x").write_text("x")
        before = files()
        stale.drain()  # junk alone: judged file by file, the rejection refused
        assert files() == before
        (tmp_path / "inbox" / "4242").mkdir()
        (tmp_path / "inbox" / "4242" / "1-progress.json").write_text("{not json")
        before = files()
        stale.drain()  # a job's folder: the owners' lookup refused first
        assert files() == before  # nothing archived, nothing lost
        assert read(db_url, select(RejectedReportRow.id)) == []
        with new.hold():
            inbox(new_store).drain()  # the leader's drain judges them
        assert len(read(db_url, select(RejectedReportRow.id))) == 2
        assert not any((tmp_path / "inbox").rglob("*.json"))
        old.release()
        new.release()
    finally:
        old_store.close()
        new_store.close()
