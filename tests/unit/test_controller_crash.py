"""A controller killed or faulted between steps, then meeting what comes next (a new round
with another plan, the job's end, its time limit): the real controller over the simulated
Slurm, a SQLite store and a simulated clock, so each sequence is played exactly.

A kill is an exception no handler catches (``Killed``, a BaseException) raised from the
reconcile's step hook: the open transaction rolls back, as on SIGKILL; a restart is a new
``Controller`` on the same store file and the same (simulated) Slurm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.domain.plan import PolicyResult, Snapshot
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.sim.cluster import SimCluster
from icefrog_slurm.sim.engine import SimClock
from icefrog_slurm.slurm.port import SubmitRequest
from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import spec

UID = 1000


class Killed(BaseException):
    """The controller dies at a step point."""


@dataclass
class Fixed:
    """Decides what the test says: job id -> (GPUs, node); other jobs wait."""

    decisions: dict[int, tuple[int, str]] = field(default_factory=dict)
    shared: set[int] = field(default_factory=set)  # jobs given a share of their GPU
    name: str = "fixed"

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        out = {}
        for j in snapshot.jobs:
            gpus, node = self.decisions.get(j.id, (0, ""))
            nodes = (node,) if gpus else ()
            out[j.id] = Allocation(
                job_id=j.id, gpus=gpus, batch=32 if gpus else 0, frozen=0, nodes=nodes,
                shared=j.id in self.shared,
            )  # fmt: skip
        return PolicyResult(allocations=out)


class Files:
    """The job folders: decisions written, checkpoint markers by folder."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}

    def write_decision(self, *, run_dir: str, decision: Any, owner_uid: int) -> None:
        pass

    def checkpoint_marked(self, *, run_dir: str, since: float, owner_uid: int) -> bool:
        return self.marks.get(run_dir, -1.0) >= since


class World:
    """One simulated site: Slurm, the store, the clock, and a controller to kill."""

    def __init__(self, tmp: Path) -> None:
        self.settings = settings_from_mapping(
            {
                "state": {"dir": str(tmp)},
                "controller": {
                    "round_period_s": 300.0,
                    "reconcile_poll_s": 2.0,
                    "checkpoint_timeout_s": 120.0,
                    "release_gap_s": 2.0,
                },
            }
        )
        migrate.upgrade(self.settings.store.url)
        self.signals: list[str] = []
        self.clock = SimClock(1_000_000.0)
        self.cluster = SimCluster(
            nodes=3, gpus_per_node=4, shards_per_gpu=2, user_id=UID,
            on_signal=self.signals.append, clock=self.clock.now,
        )  # fmt: skip
        self.files, self.policy = Files(), Fixed()
        self.kill_at: Callable[[str], bool] | None = None
        self.stores: list[SqlStore] = []
        self.restart()

    def restart(self) -> None:
        self.store = SqlStore(self.settings.store.url)
        self.stores.append(self.store)
        self.ctl = Controller(
            settings=self.settings, policy=self.policy, cluster=self.cluster, store=self.store,
            clock=self.clock, files=self.files, after_step=self._step,
        )  # fmt: skip

    def _step(self, point: str) -> None:
        if self.kill_at is not None and self.kill_at(point):
            self.kill_at = None
            raise Killed(point)

    def submit(self, key: str) -> tuple[int, str]:
        request = SubmitRequest(
            script="", tag=IcefrogTag(key), name=key, gres=Gres("gpu", 1), workdir=f"/sim/{key}"
        )
        sid = self.cluster.submit_held(request=request)
        with self.store.transaction() as tx:
            job = tx.create_job(name=key, owner_uid=UID, owner_user="u", slurm_job_id=sid,
                                spec=spec(), now=self.clock.now())  # fmt: skip
        return job, sid

    def tick(self, advance: float = 2.0) -> bool:
        """One tick, then Slurm's scheduler and the clock move on; False when killed."""
        try:
            self.ctl.tick_once()
            alive = True
        except Killed:
            alive = False
        self.cluster.schedule()
        self.clock.sleep(advance)
        return alive

    def ticks(self, n: int, advance: float = 2.0) -> None:
        for _ in range(n):
            assert self.tick(advance), "killed"

    def next_round(self, decisions: dict[int, tuple[int, str]]) -> None:
        self.clock.sleep(self.settings.controller.round_period_s + 1)
        self.policy.decisions = decisions

    def slurm(self, sid: str) -> tuple[str, str, str, bool]:
        s = self.cluster.poll(job_ids=[sid])[sid]
        return s.state, str(s.gres), s.nodelist, s.held

    def job(self, job_id: int) -> Any:
        with self.store.transaction() as tx:
            return tx.job(job_id)

    def intents(self, job_id: int) -> list[tuple[str, str, str]]:
        """(action, status, detail) of the job's intents, oldest first."""
        from sqlalchemy import text

        with self.store.engine.connect() as c:
            rows = c.execute(
                text("select action, status, detail from intents where job_id=:j order by id"),
                {"j": job_id},
            )
            return [tuple(r) for r in rows]  # type: ignore[misc]

    def close(self) -> None:
        for s in self.stores:
            s.close()


@pytest.fixture
def world(tmp_path: Path) -> Any:
    w = World(tmp_path)
    yield w
    w.close()


def test_a_job_that_ended_on_its_own_seen_first_by_a_round_does_not_stop_every_round(
    world: World,
) -> None:
    """The first tick to see a job end at its time limit is a round (the controller was down
    longer than a round period): its requeue intent names the round, which must be recorded
    first, or every tick's transaction fails for every job from then on."""
    a, sid_a = world.submit("a")
    b, sid_b = world.submit("b")
    world.policy.decisions = {a: (1, "sim0000")}
    world.ticks(3)
    assert world.slurm(sid_a)[0] == "RUNNING"
    world.files.marks["/sim/a"] = world.clock.now() + 10  # checkpointed before its limit
    world.cluster.complete(job_id=sid_a, state="TIMEOUT", reason="TimeLimit")
    world.next_round({a: (1, "sim0000"), b: (1, "sim0001")})
    world.restart()
    world.ticks(4)
    assert world.slurm(sid_b)[:2] == ("RUNNING", "gpu:1")  # the round went on for others
    assert world.slurm(sid_a)[::3] == ("PENDING", True)  # requeued held: it checkpointed
    world.next_round({a: (1, "sim0000"), b: (1, "sim0001")})
    world.ticks(3)
    assert world.slurm(sid_a)[0] == "RUNNING"  # and the next round started it again


def _moved_and_killed_after(world: World, *points: str) -> tuple[int, str]:
    """A job on 1 GPU moved to 2: asked to checkpoint, checkpointed, requeued, updated and
    released by controllers killed at each of ``points`` in turn (each one restarted after
    the one before); the last one killed before the move's intent was recorded done."""
    job, sid = world.submit("j")
    world.policy.decisions = {job: (1, "sim0000")}
    world.ticks(3)
    world.next_round({job: (2, "sim0000")})
    world.ticks(1)
    assert world.signals == [sid]
    world.files.marks["/sim/j"] = world.clock.now()  # it checkpointed and exits
    for n, point in enumerate(points):
        if n:
            world.restart()
        world.kill_at = lambda at, point=point: at == point
        assert not all(world.tick() for _ in range(4))  # killed within four ticks
    assert world.slurm(sid)[:2] == ("RUNNING", "gpu:2")
    del world.files.marks["/sim/j"]  # the restarted launcher removes its marker
    return job, sid


@pytest.mark.parametrize(
    "points", [("release:logged",), ("requeue_hold:done", "release:done")], ids=["one", "two"]
)
def test_a_move_killed_after_its_release_is_not_requeued_again(
    world: World, points: tuple[str, ...]
) -> None:
    """After the restart, the still-open move finds the job running as it was to be: its
    checkpoint signal was answered by the requeue, so the job is not taken for one still
    checkpointing and requeued again without a signal (its progress since the restart
    lost). ``two``: killed after the requeue took effect, before its log; the next
    controller updates and releases the job and is killed before that log; the job
    starts: the signal was answered by a restart Slurm dates after it."""
    job, sid = _moved_and_killed_after(world, *points)
    world.restart()
    world.ticks(80)  # 160 s: past checkpoint_timeout_s since the signal
    assert world.slurm(sid)[:2] == ("RUNNING", "gpu:2")
    assert world.cluster._jobs[sid].restarts == 1  # the move's own requeue only
    assert world.signals == [sid]
    assert world.intents(job)[-1][:2] == ("change", "done")


def test_a_new_round_after_a_move_killed_after_its_release_signals_again(world: World) -> None:
    """A new round moves the restarted job again (3 GPUs): it is asked to checkpoint anew,
    never requeued on the old signal's time."""
    job, sid = _moved_and_killed_after(world, "release:logged")
    world.next_round({job: (3, "sim0000")})
    world.restart()
    world.ticks(3)
    assert world.signals == [sid, sid]  # a second signal, for this move
    assert world.cluster._jobs[sid].restarts == 1  # and no requeue before its checkpoint


def test_a_round_finding_a_killed_move_converged_records_what_the_job_holds(
    world: World,
) -> None:
    """A new round wants the restarted job on other nodes only (not worth a restart): the
    move's intent ends done, as what the job was released with, so the job is not taken
    for one holding more than it was given and requeued at once."""
    job, sid = _moved_and_killed_after(world, "release:logged")
    world.next_round({job: (2, "sim0001")})
    world.restart()
    world.ticks(3)
    assert world.slurm(sid)[:3] == ("RUNNING", "gpu:2", "sim0000")
    assert world.cluster._jobs[sid].restarts == 1
    assert world.intents(job)[-1] == ("change", "done", "converged")


def test_a_database_fault_as_a_release_is_logged_leaves_the_move_open(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database drops its connection as a move's release (which took effect) is being
    logged: the pass pauses with the move open, never failing it, so that the next tick
    finds the job as the move asked and records it done (a failed move left the job taken
    for one holding more than it was given, and requeued at once)."""
    from sqlalchemy.exc import OperationalError

    from icefrog_slurm.store.tx import SqlStoreTx

    job, sid = world.submit("j")
    world.policy.decisions = {job: (1, "sim0000")}
    world.ticks(3)
    world.next_round({job: (2, "sim0000")})
    world.ticks(1)
    world.files.marks["/sim/j"] = world.clock.now()
    log_action, faults = SqlStoreTx.log_action, []

    def dropped(self: SqlStoreTx, **kw: Any) -> int:
        if kw["action"] == "release" and not faults:
            faults.append(kw)
            raise OperationalError("INSERT INTO slurm_actions", {}, Exception("server closed"))
        return log_action(self, **kw)

    monkeypatch.setattr(SqlStoreTx, "log_action", dropped)
    world.ticks(6)
    assert faults  # the fault happened
    del world.files.marks["/sim/j"]  # the restarted job's launcher removes its marker
    world.ticks(80)
    assert world.slurm(sid)[:2] == ("RUNNING", "gpu:2")
    assert world.cluster._jobs[sid].restarts == 1
    assert [i[:2] for i in world.intents(job)][-1] == ("change", "done")


def test_a_job_that_finished_while_a_move_requeued_it_is_not_left_held(world: World) -> None:
    """A round moves a job just as its training ends (exit 0): the move requeues the ended
    job held, as it would one that checkpointed; then the job's ``finished`` report ends it
    in the store. Nothing would ever release that Slurm job: it is cancelled."""
    from icefrog_slurm.protocol import FinishedReport

    job, sid = world.submit("j")
    world.policy.decisions = {job: (1, "sim0000")}
    world.ticks(3)
    world.next_round({job: (2, "sim0000")})
    world.ticks(1)
    world.cluster.complete(job_id=sid)  # its training reached the end: exit 0
    world.ticks(1)
    assert world.slurm(sid)[::3] == ("PENDING", True)  # requeued held by the move
    with world.store.transaction() as tx:  # its last report, drained now
        report = FinishedReport(reason="target", epoch=7, final_metric=0.95)
        tx.mark_finished(job_id=job, report=report, now=world.clock.now())
    world.ticks(3)
    assert world.slurm(sid)[0] == "CANCELLED"
    assert world.intents(job)[-1][:2] == ("change", "done")


def test_a_release_killed_before_its_log_still_counts_when_the_time_limit_comes(
    world: World,
) -> None:
    """Killed between a start's release and its audit entry: the restarted controller finds
    the job running as released. Hours later the job checkpoints before its time limit and
    ends TIMEOUT: it is requeued, not recorded failed as a job the controller never
    released."""
    job, sid = world.submit("j")
    world.policy.decisions = {job: (1, "sim0000")}
    world.kill_at = lambda point: point == "release:done"
    assert not world.tick()
    world.restart()
    world.ticks(3)
    assert world.slurm(sid)[0] == "RUNNING"
    world.ticks(10, advance=60)
    world.files.marks["/sim/j"] = world.clock.now()  # USR1 before its limit: checkpointed
    world.cluster.complete(job_id=sid, state="TIMEOUT", reason="TimeLimit")
    world.ticks(3)
    assert world.job(job).state != "failed"
    assert world.slurm(sid)[::3] == ("PENDING", True)  # requeued held


def _asked_to_share(world: World) -> tuple[int, str]:
    """A job running on a whole GPU that a round moves to a share of it (signalled)."""
    job, sid = world.submit("j")
    world.policy.decisions = {job: (1, "sim0000")}
    world.ticks(3)
    world.next_round({job: (1, "sim0000")})
    world.policy.shared = {job}
    world.ticks(1)
    assert world.signals == [sid]
    return job, sid


def test_a_resubmission_killed_before_the_old_job_s_cancel_then_a_wait_leaves_no_stray(
    world: World,
) -> None:
    """Killed after a move to a shared GPU made and linked the new Slurm job, before it
    cancelled the old one; the restarted controller's round tells the job to wait: the old
    job is cancelled all the same, not left held beside the new one."""
    job, sid = _asked_to_share(world)
    world.files.marks["/sim/j"] = world.clock.now()
    world.kill_at = lambda point: point == "link:logged"
    assert not all(world.tick() for _ in range(4))
    new = world.job(job).slurm_job_id
    assert new != sid and world.slurm(sid)[::3] == ("PENDING", True)
    world.next_round({})  # it waits
    world.restart()
    world.ticks(3)
    assert world.slurm(sid)[0] == "CANCELLED"
    assert world.slurm(new)[::3] == ("PENDING", True)


def test_an_inbox_that_cannot_be_read_does_not_stop_the_rounds(world: World) -> None:
    """The filesystem holding the inbox is gone (unmounted, stale): each drain fails, and
    the ticks go on planning and enacting without new reports."""
    calls: list[int] = []

    def gone() -> None:
        calls.append(1)
        raise FileNotFoundError(2, "No such file or directory", "/var/lib/icefrog/inbox")

    world.ctl.drain = gone
    job, sid = world.submit("j")
    world.policy.decisions = {job: (1, "sim0000")}
    world.ticks(3, advance=40)
    assert calls and world.slurm(sid)[:2] == ("RUNNING", "gpu:1")
    world.next_round({job: (2, "sim0000")})
    world.ticks(2, advance=40)
    assert world.signals == [sid]  # the round's move went on


def test_an_owner_releasing_a_job_the_move_requeued_is_requeued_again_at_once(
    world: World,
) -> None:
    """A move shrinks a job from 2 GPUs to 1: it ignores the signal and is requeued held;
    its owner releases it before the move's update, so it runs on 2 GPUs again. The move
    requeues it at once (it checkpointed, or had its chance to), never asks again and waits
    another checkpoint timeout, and then starts it on 1 GPU."""
    job, sid = world.submit("j")
    world.policy.decisions = {job: (2, "sim0000")}
    world.ticks(3)
    world.next_round({job: (1, "sim0000")})
    for _ in range(30):
        world.ticks(1, advance=10)
        if world.slurm(sid)[0] == "PENDING":
            break
    assert world.slurm(sid) == ("PENDING", "gpu:2", "", True)  # requeued, not updated yet
    world.cluster.release(job_id=sid)  # its owner's scontrol release
    assert world.slurm(sid)[:2] == ("RUNNING", "gpu:2")
    world.ticks(5)
    assert world.slurm(sid)[:2] == ("RUNNING", "gpu:1")
    assert world.signals == [sid]


def test_a_job_that_finished_during_an_unlinked_resubmission_leaves_no_held_job(
    world: World,
) -> None:
    """The training ends (exit 0) just as a move to a shared GPU begins; the move requeues
    the ended job and makes its shard job, and the controller is killed before the link;
    then the job's finished report ends it. Neither Slurm job is left held for ever."""
    from icefrog_slurm.protocol import FinishedReport

    job, sid = _asked_to_share(world)
    world.cluster.complete(job_id=sid)  # exit 0: its training reached the end
    world.kill_at = lambda point: point == "resubmit:done"
    assert not all(world.tick() for _ in range(6))
    made = world.cluster.find_successor(job_id=sid, owner_uid=UID)
    assert made is not None and world.job(job).slurm_job_id == sid  # made, not linked
    with world.store.transaction() as tx:
        report = FinishedReport(reason="target", epoch=7, final_metric=0.95)
        tx.mark_finished(job_id=job, report=report, now=world.clock.now())
    world.restart()
    world.ticks(3)
    assert world.slurm(sid)[0] == "CANCELLED" and world.slurm(made)[0] == "CANCELLED"
