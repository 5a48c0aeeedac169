"""The controller against the real local cluster (4 nodes x 4 fake A800) and SQLite.

Each test drives the real tick + reconcile with the real Slurm CLI backend; a
``FixedPolicy`` says what to decide, and an ``OffsetClock`` makes the next round due.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from icefrog_launcher.decision import read_decision
from icefrog_launcher.launch import mps_env, shared_load
from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.controller.tick import EVICTED
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.settings import Settings
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.parse import expand_hostlist
from icefrog_slurm.slurm.port import SlurmUnavailable
from icefrog_slurm.store.sql import SqlStore
from tests.integration.conftest import wait_for
from tests.integration.controller.support import (
    PEAK_MEM,
    FixedPolicy,
    OffsetClock,
    backend,
    chain,
    converge,
    live_tagged,
    make_controller,
    make_settings,
    running,
    state_of,
    submit_job,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


TAG_PREFIX = "ctl-"
"""The tags of this module's jobs (the ``cluster`` fixture cancels them: conftest.py)."""


@pytest.fixture
def base(job_dir: Path) -> Path:
    return job_dir


def _key() -> str:
    return f"ctl-{uuid.uuid4().hex[:8]}"


def test_held_job_is_released_with_the_decided_gpus_and_nodes(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path
) -> None:
    settings = make_settings(tmp_path)
    job, sid, run_dir = submit_job(store, cluster, base, _key())
    assert state_of(cluster, sid).held
    ctl = make_controller(
        settings, store, FixedPolicy({job: (2, False, ("node3",))}), OffsetClock()
    )
    converge(ctl)
    state = running(cluster, sid)
    assert state.gres == Gres("gpu", 2) and state.nodelist == "node3"
    decision = json.loads((run_dir / "decision.json").read_text())
    assert decision["gpus"] == 2 and decision["batch"] == 32 and decision["round"] == 1
    ctl.tick_once()  # the next tick sees it running
    with store.transaction() as tx:
        actions = [a.action for a in tx.actions(job_id=job)]
        assert actions == ["update", "release"]
        assert tx.open_intents() == [] and tx.job(job).state == "running"


def test_running_job_is_resized_through_checkpoint_and_requeue(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path
) -> None:
    settings = make_settings(tmp_path)
    clock = OffsetClock()
    job, sid, run_dir = submit_job(store, cluster, base, _key())
    policy = FixedPolicy({job: (1, False, ("node2",))})
    ctl = make_controller(settings, store, policy, clock)
    converge(ctl)
    running(cluster, sid)
    policy.decisions[job] = (2, False, ("node2",))
    clock.next_round(settings)
    converge(ctl)
    state = running(cluster, sid)
    assert state.gres == Gres("gpu", 2) and state.nodelist == "node2"
    assert (run_dir / "checkpoints").exists()  # it was asked to checkpoint, and did
    assert cluster.job_detail(job_id=sid).restarts == 1
    wait_for("second start", lambda: len((run_dir / "starts").read_text().splitlines()) == 2)
    with store.transaction() as tx:
        assert [a.gpus for _, a in tx.job_allocations(job)] == [1, 2]  # history kept
        assert tx.job(job).slurm_job_ids == (sid,)
        actions = tx.actions(job_id=job)
    steps = [a.action for a in actions]
    assert steps[-3:] == ["requeue_hold", "update", "release"] and "signal" in steps
    # released on the same node only after the requeue's second is over: slurmd refuses a
    # credential made in the second its requeue revoked the last one ("credential revoked")
    requeued, released = actions[-3].time, actions[-1].time
    assert released - requeued >= settings.controller.release_gap_s > 0


def test_two_jobs_share_a_gpu_and_one_moves_back(
    sharing: str, tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path
) -> None:
    settings = make_settings(tmp_path, sharing)
    clock = OffsetClock()
    a, sid_a, dir_a = submit_job(store, cluster, base, _key())
    b, sid_b, dir_b = submit_job(store, cluster, base, _key())
    policy = FixedPolicy({a: (1, True, ("node4",)), b: (1, True, ("node4",))})
    policy.utils = {a: 0.3, b: 0.6}  # eq 8's prediction: an mps job's share of the GPU
    shares = {"shard": (Gres("shard", 1),) * 2, "mps": (Gres("mps", 30), Gres("mps", 60))}
    ctl = make_controller(settings, store, policy, clock)
    converge(ctl)
    new_a, new_b = chain(store, a)[-1], chain(store, b)[-1]
    assert new_a != sid_a and new_b != sid_b  # gpu -> shard/mps: resubmitted as the owner
    for sid, share in zip((new_a, new_b), shares[sharing], strict=True):
        assert running(cluster, sid).gres == share
    gpus = {
        (al.nodes, al.indices)
        for sid in (new_a, new_b)
        for al in cluster.gres_allocation(job_id=sid)
        if al.kind == sharing
    }
    assert len(gpus) == 1  # one GPU, same node and index, for both
    if sharing == "mps":  # what the jobs' processes see: the GPU and their share of it
        for run_dir, percent in ((dir_a, "30"), (dir_b, "60")):
            env = _job_env(run_dir)
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent
            assert env["CUDA_VISIBLE_DEVICES"] == str(next(iter(gpus))[1][0])
            # and what the launcher makes of it with the decision: the same share, and
            # 1.1 x the predicted peak memory (MiB, rounded up) as the MPS memory limit
            load = shared_load(read_decision(run_dir / "decision.json"))
            assert load is not None and (load.kind, load.peak_mem_bytes) == ("mps", PEAK_MEM)
            limit = math.ceil(settings.sharing.memory_safety * PEAK_MEM / 2**20)
            assert mps_env(env, load) == {
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": percent,
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit}M",
            }
    policy.decisions[b] = (1, False, ("node4",))
    clock.next_round(settings)
    converge(ctl)
    back = chain(store, b)
    assert len(back) == 3 and back[:2] == (sid_b, new_b)
    state = running(cluster, back[-1])
    owner = cluster.job_detail(job_id=new_a).user_id
    assert state.gres == Gres("gpu", 1) and state.user_id == owner
    assert running(cluster, new_a).gres == shares[sharing][0]  # the other stays shared
    if sharing == "mps":  # exclusive again: no MPS limit
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in _job_env(dir_b, back[-1])


def test_a_resubmission_made_but_never_linked_is_planned_not_taken_for_a_cancel(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path
) -> None:
    """A held job was resubmitted for a shared GPU (the new Slurm job made and signed) and
    its old one cancelled, and the controller never linked them (stopped in between, for
    longer than a round). The next round must not take the job as cancelled by its owner:
    it plans the job by its signed successor, which reconcile links and starts."""
    settings = make_settings(tmp_path)
    a, sid_a, _ = submit_job(store, cluster, base, _key())
    ctl = make_controller(settings, store, FixedPolicy({a: (1, True, ("node4",))}), OffsetClock())
    with store.transaction() as tx:
        owner = tx.job(a).owner_uid
    new = ctl.cluster.resubmit(job_id=sid_a, owner_uid=owner, gres=Gres("shard", 1))
    ctl.cluster.cancel(job_id=sid_a)
    wait_for("the old job cancelled", lambda: state_of(cluster, sid_a).finished)
    converge(ctl)
    assert chain(store, a) == (sid_a, new)
    assert running(cluster, new).gres == Gres("shard", 1)
    with store.transaction() as tx:
        assert tx.job(a).state in ("pending", "running")  # not ended as cancelled


def test_a_resubmission_whose_old_job_could_not_be_cancelled_leaves_no_held_duplicate(
    tmp_path: Path,
    store: SqlStore,
    cluster: SlurmCliBackend,
    base: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old job's scancel fails (slurmctld away) right after a gpu->shard resubmission,
    and the next round moves the job back to a whole GPU. The new job was linked before the
    cancel: the store plans it, the old one is cancelled at the job's next step, and no
    held job is left behind."""
    settings = make_settings(tmp_path)
    clock = OffsetClock()
    key = _key()
    a, sid_a, _ = submit_job(store, cluster, base, key)
    policy = FixedPolicy({a: (1, True, ("node4",))})
    ctl = make_controller(settings, store, policy, clock)
    failed: list[str] = []
    real_cancel = ctl.cluster.cancel

    def cancel(*, job_id: str) -> None:
        if not failed:
            failed.append(job_id)
            raise SlurmUnavailable("scancel: Unable to contact slurm controller (test)")
        real_cancel(job_id=job_id)

    monkeypatch.setattr(ctl.cluster, "cancel", cancel)
    ctl.tick_once()  # resubmitted, linked; the old job's cancel fails and the pass stops
    new = chain(store, a)[-1]
    assert failed == [sid_a] and new != sid_a
    assert state_of(cluster, sid_a).held  # still there
    policy.decisions[a] = (1, False, ("node4",))  # the next round: a whole GPU again
    clock.next_round(settings)
    converge(ctl)
    assert state_of(cluster, sid_a).state == "CANCELLED"
    live = live_tagged(cluster, key)
    assert len(live) == 1 and not live[0].held, live
    assert chain(store, a)[:2] == (sid_a, new)
    assert running(cluster, live[0].job_id).gres == Gres("gpu", 1)


def _job_env(run_dir: Path, sid: str | None = None) -> dict[str, str]:
    """The GPU variables the job script saw (``SCRIPT`` writes them at each start), of its
    last start or of Slurm job ``sid``'s."""

    def starts() -> list[str]:
        if not (run_dir / "env").is_file():
            return []
        lines = (run_dir / "env").read_text().splitlines()
        return [line for line in lines if sid is None or line.startswith(f"{sid} ")]

    last = wait_for("the job's environment", starts)[-1]
    return dict(item.split("=", 1) for item in last.split()[1:])


def _foreign_job(node: str | None = None) -> str:
    """A job outside icefrog holding all four GPUs of a node (``node``, or Slurm's choice)
    for 120 s, running."""
    pin = ["-w", node] if node else []
    sid = subprocess.run(
        ["sbatch", "--parsable", "-p", "gpu", "--gres=gpu:4", "-N1", *pin,
         "-o", "/dev/null", "--wrap", "sleep 120"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    try:
        running(backend(), sid)
    except BaseException:
        backend().cancel(job_id=sid)  # not left behind to block the next test
        raise
    return sid


@pytest.fixture
def blockers(cluster: SlurmCliBackend) -> Iterator[dict[str, str]]:
    """Foreign jobs a test puts on nodes (node -> Slurm id), cancelled after it."""
    taken: dict[str, str] = {}
    yield taken
    for sid in taken.values():
        cluster.cancel(job_id=sid)


@dataclass
class _Released:
    """A job the controller released to node3 that Slurm cannot start (a foreign job holds
    node3's four GPUs), with the controller, policy and clock to play the next rounds."""

    job: int
    sid: str
    policy: FixedPolicy
    clock: OffsetClock
    ctl: Controller
    settings: Settings

    def next_round(self) -> None:
        self.clock.next_round(self.settings)
        converge(self.ctl)


@pytest.fixture
def released(
    tmp_path: Path,
    store: SqlStore,
    cluster: SlurmCliBackend,
    base: Path,
    blockers: dict[str, str],
) -> _Released:
    # release_now sets StartTime=now, so only a full node keeps a released job pending
    blockers["node3"] = _foreign_job("node3")
    settings = make_settings(tmp_path)
    clock = OffsetClock()
    job, sid, _ = submit_job(store, cluster, base, _key())
    policy = FixedPolicy({job: (1, False, ("node3",))})
    ctl = make_controller(settings, store, policy, clock)
    converge(ctl)
    waiting = state_of(cluster, sid)
    assert waiting.state == "PENDING" and not waiting.held
    assert cluster.job_detail(job_id=sid).req_nodes == "node3"
    return _Released(job, sid, policy, clock, ctl, settings)


def test_a_released_job_not_started_yet_is_held_before_it_moves_to_a_shared_gpu(
    released: _Released, store: SqlStore, cluster: SlurmCliBackend, blockers: dict[str, str]
) -> None:
    # Slurm has not started the released job when the next round shares it: GRES kind
    # cannot change on a pending job, so it is held, then resubmitted.
    r = released
    job = r.job
    r.policy.decisions[job] = (1, True, ("node3",))
    r.next_round()
    cluster.cancel(job_id=blockers.pop("node3"))  # node3 free: the shard job can start
    new = chain(store, job)[-1]
    assert new != r.sid and running(cluster, new).gres == Gres("shard", 1)
    with store.transaction() as tx:
        steps = [a.action for a in tx.actions(job_id=job)]
        assert tx.open_intents() == []
    assert steps[:2] == ["update", "release"] and steps[2:4] == ["hold", "resubmit"]


def test_a_released_job_not_started_yet_follows_its_round_and_is_held_when_told_to_wait(
    released: _Released, store: SqlStore, cluster: SlurmCliBackend, blockers: dict[str, str]
) -> None:
    r = released
    job, sid = r.job, r.sid
    blockers["node2"] = _foreign_job("node2")  # so it cannot start on node2 either
    r.policy.decisions[job] = (1, False, ("node2",))  # the next round moves it
    r.next_round()
    detail = cluster.job_detail(job_id=sid)
    assert detail.req_nodes == "node2" and detail.state == "PENDING"
    assert not state_of(cluster, sid).held
    del r.policy.decisions[job]  # the next round tells it to wait: held, not started later
    r.next_round()
    assert state_of(cluster, sid).held
    with store.transaction() as tx:
        steps = [a.action for a in tx.actions(job_id=job)]
    assert steps == ["update", "release", "update", "hold"]


def test_a_foreign_jobs_gpus_are_left_alone(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path
) -> None:
    settings = make_settings(tmp_path)
    out = _foreign_job()
    try:
        foreign = running(cluster, out)
        taken = set(expand_hostlist(foreign.nodelist))
        jobs = [submit_job(store, cluster, base, _key(), min_gpus=4) for _ in range(3)]
        ctl = make_controller(settings, store, StandInPolicy(), OffsetClock())
        report = ctl.tick_once()
        assert report.plan.capacity_gpus == 12
        converge(ctl)
        placed = [running(cluster, sid) for _, sid, _ in jobs]
        used = {n for s in placed for n in expand_hostlist(s.nodelist)}
        assert not used & taken and len(used) == 3
        assert state_of(cluster, out).state == "RUNNING"  # untouched
        with store.transaction() as tx:
            assert all(a.slurm_job_id != out for a in tx.actions())
    finally:
        cluster.cancel(job_id=out)
    assert all(len(live_tagged(cluster, j.tag.key)) == 1 for j in placed if j.tag)


def test_an_unstable_packed_job_is_evicted_and_returns_a_round_later(
    sharing: str, tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path
) -> None:
    settings = make_settings(tmp_path, sharing)
    clock = OffsetClock()
    shard = Gres("shard", 1) if sharing == "shard" else Gres("mps", 50)
    a, sid_a, dir_a = submit_job(store, cluster, base, _key(), gres=shard)
    b, sid_b, dir_b = submit_job(store, cluster, base, _key(), gres=shard)  # submitted later
    policy = FixedPolicy({a: (1, True, ("node3",)), b: (1, True, ("node3",))})
    policy.utils = {a: 0.5, b: 0.5}  # mps:50 each, as submitted
    ctl = make_controller(settings, store, policy, clock)
    converge(ctl)
    for sid, run_dir in ((sid_a, dir_a), (sid_b, dir_b)):  # started: its USR1 trap is set
        running(cluster, sid)
        wait_for(f"job {sid} started", lambda d=run_dir: (d / "starts").exists())
    with store.transaction() as tx:  # b measures a utilization that swings while packed
        tx.add_profile_samples(
            job_id=b,
            slurm_job_id=sid_b,
            samples=[
                ProfileSample(1, 32, 0, True, 0.1, 0.1, 0.0, 0.2, 160.0, 1e9, u)
                for u in (0.1, 0.9, 0.2, 0.95, 0.1)
            ],
            now=time.time(),
        )
    clock.next_round(settings)
    assert ctl.tick_once().plan.jobs[1].reason == EVICTED
    converge(ctl)
    assert state_of(cluster, sid_b).held and running(cluster, sid_a).gres == shard
    # the offset clock makes the round due at once, but slurmd counts real seconds: a
    # release in the second of the requeue is refused ("Job credential revoked")
    time.sleep(settings.controller.release_gap_s)
    clock.next_round(settings)
    converge(ctl)
    assert running(cluster, sid_b).gres == shard  # back in a later round
    with store.transaction() as tx:
        assert [al.gpus for _, al in tx.job_allocations(b)] == [1, 0, 1]


EXIT_75 = """#!/bin/bash
# USR1 = checkpoint, then exit 75 (checkpointed, requeue me) as the launcher does.
trap 'touch "$PWD/checkpointed"; exit 75' USR1
echo "start $SLURM_JOB_ID restarts=${SLURM_RESTART_COUNT:-0}" >> "$PWD/starts"
sleep 600 &
wait
"""


def _signal_for_a_resize(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path, script: str
) -> tuple[Controller, OffsetClock, FixedPolicy, int, str, Path]:
    """A job running 1 GPU on node2, then a round resizing it to 2: one tick signals it.
    The next round (made due) wants 1 GPU on node2 again, what the job has."""
    settings = make_settings(tmp_path)
    clock = OffsetClock()
    job, sid, run_dir = submit_job(store, cluster, base, _key())
    (run_dir / "job.sh").write_text(script)
    policy = FixedPolicy({job: (1, False, ("node2",))})
    ctl = make_controller(settings, store, policy, clock)
    converge(ctl)
    running(cluster, sid)
    wait_for("first start", lambda: (run_dir / "starts").exists())
    policy.decisions[job] = (2, False, ("node2",))
    clock.next_round(settings)
    assert ctl.tick_once().reconcile.waiting == 1  # signalled, waiting for the checkpoint
    policy.decisions[job] = (1, False, ("node2",))
    clock.next_round(settings)
    return ctl, clock, policy, job, sid, run_dir


def test_a_round_due_while_a_checkpointed_job_exits_requeues_it_not_fails_it(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path
) -> None:
    """The race seen with 2 s rounds, driven step by step: a resize signals the job, the
    job checkpoints and exits 75, and only then a new round (back to what it had) comes
    due. The move goes on (requeue, release), the job runs again, and is never failed."""
    ctl, _, _, job, sid, run_dir = _signal_for_a_resize(tmp_path, store, cluster, base, EXIT_75)
    wait_for("the job to exit 75", lambda: state_of(cluster, sid).finished, timeout=30)
    converge(ctl)  # the round, due since the job was signalled, comes only now
    state = running(cluster, sid)
    assert state.gres == Gres("gpu", 1) and state.nodelist == "node2"
    wait_for("second start", lambda: len((run_dir / "starts").read_text().splitlines()) == 2)
    ctl.tick_once()
    with store.transaction() as tx:
        assert tx.job(job).state == "running"
        steps = [a.action for a in tx.actions(job_id=job)]
    assert steps.count("signal") == 1 and steps[-3:] == ["requeue_hold", "update", "release"]


def test_a_round_due_while_a_signalled_job_still_checkpoints_sees_the_restart_through(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, base: Path
) -> None:
    """The other side of the race: the new round (back to what the job has) comes while
    the signalled job is still running (checkpoint written, exit 75 a few seconds later).
    The move is not "converged": the job is requeued and restarted once, never failed."""
    script = EXIT_75.replace("exit 75", "sleep 4; exit 75")
    ctl, _, _, job, sid, run_dir = _signal_for_a_resize(tmp_path, store, cluster, base, script)
    wait_for("the checkpoint marker", lambda: (run_dir / "checkpointed").exists(), timeout=30)
    converge(ctl)  # the round comes while the job still runs
    wait_for("the restart", lambda: cluster.job_detail(job_id=sid).restarts == 1, timeout=30)
    state = running(cluster, sid)
    assert state.gres == Gres("gpu", 1) and state.nodelist == "node2"
    ctl.tick_once()
    with store.transaction() as tx:
        assert tx.job(job).state == "running"
        assert [a.action for a in tx.actions(job_id=job)].count("signal") == 1
