"""Hostile Slurm jobs against the controller, on the real local cluster, as real users.

bob (icefrog-bob, unprivileged) does what a hostile user can do with sbatch alone: a work
folder named like Slurm's own fields (``run UserId=root(0) GroupId=root(0)``), a comment
and a name with line breaks and a fake squeue record, a decoy job that copies the name and
the predictable comment of alice's resubmission. An administrator holds one of alice's
jobs. The controller (root, SQLite store, the real CLI backend) must keep deciding rounds
for alice's honest job, resubmit bob's job as bob and nobody else, never take a decoy for
alice's job, and never lift the administrator's hold.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.store.sql import SqlStore
from tests.integration.conftest import wait_for
from tests.integration.controller.support import (
    FixedPolicy,
    OffsetClock,
    backend,
    chain,
    converge,
    make_controller,
    make_settings,
    make_store,
    running,
    state_of,
)
from tests.integration.store.helpers import spec
from tests.security.slurm_support import sbatch_as

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

SPOOF_DIR = "run UserId=root(0) GroupId=root(0)"


def _icefrog_job(store: SqlStore, uid: int, workdir: Path, name: str) -> tuple[int, str]:
    """A held icefrog job of ``uid`` (its own sbatch), registered in the store as its."""
    sid = sbatch_as(
        uid, workdir, "-H", "--requeue", "-J", name, f"--comment=icefrog:{name}", "--gres=gpu:1"
    )
    return _register(store, name=name, uid=uid, sid=sid), sid


def _folder(base: Path, name: str, uid: int) -> Path:
    path = base / name
    path.mkdir(parents=True)
    os.chown(path, uid, pwd.getpwuid(uid).pw_gid)
    return path


def _register(store: SqlStore, *, name: str, uid: int, sid: str) -> int:
    with store.transaction() as tx:
        return tx.create_job(
            name=name,
            owner_uid=uid,
            owner_user=pwd.getpwuid(uid).pw_name,
            slurm_job_id=sid,
            spec=spec(),
            now=time.time(),
        )


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(f"/tmp/icefrog-sec-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster(munge_users: dict[str, int]) -> Iterator[SlurmCliBackend]:
    be = backend()
    yield be
    users = set(munge_users.values())
    for job in be._jobs().values():
        if job.user_id in users and not job.finished:
            be.cancel(job_id=job.job_id)


def test_hostile_jobs_change_nothing_but_their_own(
    tmp_path: Path, base: Path, cluster: SlurmCliBackend, munge_users: dict[str, int]
) -> None:
    alice, bob = munge_users["icefrog-alice"], munge_users["icefrog-bob"]
    settings = make_settings(tmp_path)
    store = make_store(settings)
    key = f"sec-{uuid.uuid4().hex[:8]}"
    # alice: an honest job, to be moved from gpu:1 to a shared GPU (a resubmission as alice)
    a_dir = _folder(base, "alice", alice)
    a_job, a_sid = _icefrog_job(store, alice, a_dir, f"{key}-a")
    # alice: a second job an administrator holds (scontrol hold as root)
    h_job, h_sid = _icefrog_job(store, alice, a_dir, f"{key}-h")
    subprocess.run(["scontrol", "hold", h_sid], check=True)
    # bob: his own icefrog job in a folder named like Slurm's identity fields
    b_dir = _folder(base, f"bob/{SPOOF_DIR}", bob)
    b_job, b_sid = _icefrog_job(store, bob, b_dir, f"{key}-b")
    # bob: a decoy with the name and the old, predictable comment of alice's resubmission
    decoy = f"--comment=icefrog:{key}-a;prev={a_sid}"
    d_sid = sbatch_as(bob, b_dir, "-H", "-J", f"{key}-a", decoy, "--gres=gpu:4")
    # bob: a job whose comment and name carry a line break and a fake squeue record
    fake = f"{a_sid}|RUNNING|gres:gpu:4|1|node1|None|1|0|gpu|icefrog:{key}-a"
    x_sid = sbatch_as(bob, b_dir, "-H", "-J", f"x\n{fake}", f"--comment=junk\n{fake}")

    detail = cluster.job_detail(job_id=b_sid)
    assert detail.user_id == bob and SPOOF_DIR in detail.work_dir  # the spoof is only text

    policy = FixedPolicy(
        {a_job: (1, True, ("node1",)), b_job: (1, True, ("node2",)), h_job: (1, False, ())}
    )
    ctl = make_controller(settings, store, policy, OffsetClock())
    converge(ctl)

    # the round was decided for alice's job, which runs on a shared GPU as alice
    assert ctl.last is not None and ctl.last.plan.decided_round == 1
    with store.transaction() as tx:
        assert [(a.gpus, a.shared) for _, a in tx.job_allocations(a_job)] == [(1, True)]
    new_a = chain(store, a_job)[-1]
    assert new_a not in (a_sid, d_sid)  # not the decoy
    run = running(cluster, new_a)
    assert (run.user_id, run.gres) == (alice, Gres("shard", 1))
    # bob's job was resubmitted as bob: the work folder's text gave no one root
    new_b = chain(store, b_job)[-1]
    assert new_b != b_sid and cluster.job_detail(job_id=new_b).user_id == bob
    assert cluster.job_detail(job_id=new_b).group_id == pwd.getpwuid(bob).pw_gid
    # the decoy and the junk job are untouched: still held, still bob's
    for sid in (d_sid, x_sid):
        state = state_of(cluster, sid)
        assert state.held and state.user_id == bob
    # the administrator's hold stands, and the reason is on record
    assert state_of(cluster, h_sid).admin_held
    with store.transaction() as tx:
        actions = tx.actions(job_id=h_job)
    assert not any(a.action == "release" for a in actions)
    # the successor found after a restart is alice's own, signed job (never the decoy)
    assert ctl.cluster.find_successor(job_id=a_sid, owner_uid=alice) == new_a
    assert ctl.cluster.find_successor(job_id=a_sid, owner_uid=bob) is None
    wait_for("old jobs cancelled", lambda: state_of(cluster, a_sid).finished)


def test_a_forged_gres_line_in_a_shard_job_s_comment_does_not_stop_the_capacity_pass(
    base: Path, cluster: SlurmCliBackend, munge_users: dict[str, int]
) -> None:
    """bob runs a shard job outside icefrog whose comment breaks the line with U+2028 (a
    line break to ``str.splitlines``, not to the old check for \\n and \\r) and goes on like
    a GRES line of ``scontrol show job -d`` with an index list that is no number. The
    capacity pass reads a foreign job's GPUs from ``squeue --json``, and a reading of that
    text reads Slurm's line alone: neither fails (which would stop every round) nor reads
    the forged line."""
    bob = munge_users["icefrog-bob"]
    b_dir = _folder(base, "bob", bob)
    forged = "x\u2028     Nodes=node1 CPU_IDs=0 Mem=400 GRES=shard:1(IDX:z)"
    sid = sbatch_as(bob, b_dir, "-J", "forger", "--gres=shard:1", f"--comment={forged}")
    wait_for("bob's shard job runs", lambda: state_of(cluster, sid).holds_resources)
    detail = cluster.job_detail(job_id=sid)
    assert "\u2028" in detail.comment and detail.user_id == bob  # Slurm kept the attack
    real = cluster.gres_allocation(job_id=sid)  # the forged line is not read
    assert [(a.kind, a.count) for a in real] == [("shard", 1)]
    assert all(len(a.indices) <= 1 for a in real)
    cap = cluster.partition_capacity(partition="gpu")
    assert sid in cap.foreign_job_ids and cap.foreign_gpus >= 1
    assert cap.foreign_gpus < cap.total_gpus


def test_an_owner_undoing_every_hold_does_not_stop_the_pass_for_others(
    tmp_path: Path, base: Path, cluster: SlurmCliBackend, munge_users: dict[str, int]
) -> None:
    """bob releases his own held icefrog job (told to wait; ``--begin`` a year away keeps
    Slurm from starting it) and releases it again after every hold the controller puts on
    it (``scontrol release`` as bob, run from the reconcile's step hook: the race won every
    time). His intent can make no progress: it fails for this round after a bounded number
    of steps, and alice's job, whose intent comes after his in the pass, is started."""
    alice, bob = munge_users["icefrog-alice"], munge_users["icefrog-bob"]
    settings = make_settings(tmp_path)
    store = make_store(settings)
    key = f"sec-{uuid.uuid4().hex[:8]}"
    a_job, a_sid = _icefrog_job(store, alice, _folder(base, "alice", alice), f"{key}-a")
    b_dir = _folder(base, "bob", bob)
    b_sid = sbatch_as(
        bob, b_dir, "-H", "--requeue", "-J", f"{key}-b", f"--comment=icefrog:{key}-b",
        "--gres=gpu:1", "--begin=now+365days",
    )  # fmt: skip
    _register(store, name=f"{key}-b", uid=bob, sid=b_sid)
    pw = pwd.getpwuid(bob)
    as_bob = ["setpriv", f"--reuid={bob}", f"--regid={pw.pw_gid}", "--init-groups", "--"]
    subprocess.run([*as_bob, "scontrol", "release", b_sid], check=True)
    undone = []

    def undo(what: str) -> None:
        if what == "hold:done":
            subprocess.run([*as_bob, "scontrol", "release", b_sid], check=True)
            undone.append(b_sid)

    ctl = make_controller(settings, store, FixedPolicy({a_job: (1, False, ())}), OffsetClock())
    ctl.reconciler.after_step = undo
    report = ctl.tick_once()
    assert report.plan.decided_round == 1
    assert report.reconcile.failed == 1 and report.reconcile.done == 1  # bob's, alice's
    assert len(undone) == 8  # the race won after each of the pass's steps, and no more
    assert running(cluster, a_sid).user_id == alice
    b = state_of(cluster, b_sid)
    assert b.state == "PENDING" and b.user_id == bob
    with store.transaction() as tx:
        assert [(a.gpus, a.shared) for _, a in tx.job_allocations(a_job)] == [(1, False)]


def test_an_owner_taking_more_gpus_than_the_plan_gave_is_requeued_at_once(
    tmp_path: Path, base: Path, cluster: SlurmCliBackend, munge_users: dict[str, int]
) -> None:
    """bob's managed job is planned on 1 GPU of node2. Before the controller releases it he
    makes it wait for a job of his own (``Dependency=afterok``), so it stays pending once
    released; then he asks for 3 GPUs on any node and lifts the dependency in one update of
    his own pending job (Slurm starts it with 3), and makes it non-requeueable
    (``Requeue=0``, allowed on a running job). The next tick requeues it held at once, with
    no checkpoint wait (a requeue of a job given up is made requeueable again), and it runs
    again as planned: 1 GPU on node2."""
    bob = munge_users["icefrog-bob"]
    settings = make_settings(tmp_path)
    store = make_store(settings)
    key = f"sec-{uuid.uuid4().hex[:8]}"
    b_dir = _folder(base, "bob", bob)
    b_job, b_sid = _icefrog_job(store, bob, b_dir, f"{key}-b")
    blocker = sbatch_as(bob, b_dir, "-J", f"{key}-dep")
    pw = pwd.getpwuid(bob)
    as_bob = ["setpriv", f"--reuid={bob}", f"--regid={pw.pw_gid}", "--init-groups", "--"]

    def bob_updates(*fields: str) -> None:
        subprocess.run([*as_bob, "scontrol", "update", f"JobId={b_sid}", *fields], check=True)

    bob_updates(f"Dependency=afterok:{blocker}")
    ctl = make_controller(
        settings, store, FixedPolicy({b_job: (1, False, ("node2",))}), OffsetClock()
    )
    assert ctl.tick_once().reconcile.done == 1  # released as gpu:1 on node2
    waiting = state_of(cluster, b_sid)
    assert waiting.state == "PENDING" and not waiting.held  # for bob's own job
    bob_updates("Gres=gpu:3", "NumNodes=1", "ReqNodeList=", "Dependency=")
    assert running(cluster, b_sid).gres == Gres("gpu", 3)  # Slurm took bob's word
    bob_updates("Requeue=0")
    converge(ctl)
    again = running(cluster, b_sid)
    assert again.gres == Gres("gpu", 1) and again.nodelist == "node2"
    with store.transaction() as tx:
        done = [(a.action, a.outcome) for a in tx.actions(job_id=b_job)]
    assert ("requeue_hold", "ok") in done and ("signal", "ok") not in done


@pytest.mark.parametrize("bug", [False, True], ids=["as-is", "lookup-raises"])
def test_a_decoy_with_a_signature_of_any_text_does_not_stop_the_pass(
    tmp_path: Path,
    base: Path,
    cluster: SlurmCliBackend,
    munge_users: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
    bug: bool,
) -> None:
    """The round starts bob's held icefrog job and alice's. Between the round's snapshot and
    its reconcile, bob cancels his job and leaves a held decoy whose comment names it as
    the predecessor with a signature of non-ASCII text (``sig=é``): the controller, looking
    for a successor of the cancelled job, must take the decoy for none (comparing such a
    signature once raised a TypeError out of the pass), fail bob's intent alone, and start
    alice's job. ``lookup-raises``: the successor lookup itself fails with an error nothing
    foresaw (as that TypeError was): the pass still fails bob's intent alone."""
    alice, bob = munge_users["icefrog-alice"], munge_users["icefrog-bob"]
    settings = make_settings(tmp_path)
    store = make_store(settings)
    key = f"sec-{uuid.uuid4().hex[:8]}"
    b_dir = _folder(base, "bob", bob)
    b_job, b_sid = _icefrog_job(store, bob, b_dir, f"{key}-b")  # first: its intent is first
    a_job, a_sid = _icefrog_job(store, alice, _folder(base, "alice", alice), f"{key}-a")
    policy = FixedPolicy({b_job: (1, False, ()), a_job: (1, False, ())})
    ctl = make_controller(settings, store, policy, OffsetClock())
    decoys: list[str] = []
    enact = ctl.reconciler.enact

    def bob_moves_first(plan: Any) -> Any:
        pw = pwd.getpwuid(bob)
        as_bob = ["setpriv", f"--reuid={bob}", f"--regid={pw.pw_gid}", "--init-groups", "--"]
        subprocess.run([*as_bob, "scancel", b_sid], check=True)
        wait_for("bob's job cancelled", lambda: state_of(cluster, b_sid).finished)
        comment = f"--comment=icefrog:{key}-b;prev={b_sid};sig=\u00e9"
        decoys.append(sbatch_as(bob, b_dir, "-H", "-J", f"{key}-b", comment, "--gres=gpu:1"))
        return enact(plan)

    ctl.reconciler.enact = bob_moves_first  # type: ignore[method-assign]
    if bug:

        def broken(*, job_id: str, owner_uid: int) -> str | None:
            raise RuntimeError(f"a bug in the successor lookup of {job_id}")

        monkeypatch.setattr(ctl.cluster, "find_successor", broken)
    report = ctl.tick_once()
    assert report.plan.decided_round == 1
    assert report.reconcile.failed == 1 and report.reconcile.done == 1  # bob's, alice's
    assert running(cluster, a_sid).user_id == alice
    assert chain(store, b_job)[-1] == b_sid  # the decoy was not linked to bob's job
    assert state_of(cluster, decoys[0]).held  # and nothing was done to it


def test_a_slurm_id_given_again_to_another_user_s_job_is_never_acted_on(
    tmp_path: Path, base: Path, cluster: SlurmCliBackend, munge_users: dict[str, int]
) -> None:
    """Slurm's job ids were reset (an administrator wiped its state) while the store still
    has alice's job under an id that now belongs to bob's held job. The round plans alice's
    job on a GPU: the controller must take her job as gone, and neither update, release nor
    signal bob's."""
    alice, bob = munge_users["icefrog-alice"], munge_users["icefrog-bob"]
    settings = make_settings(tmp_path)
    store = make_store(settings)
    key = f"sec-{uuid.uuid4().hex[:8]}"
    b_sid = sbatch_as(bob, _folder(base, "bob", bob), "-H", "-J", key, "--gres=gpu:1")
    a_job = _register(store, name=f"{key}-a", uid=alice, sid=b_sid)  # the id, given again
    ctl = make_controller(settings, store, FixedPolicy({a_job: (1, False, ())}), OffsetClock())
    converge(ctl)
    b = state_of(cluster, b_sid)
    assert b.held and b.user_id == bob and b.gres == Gres("gpu", 1)
    with store.transaction() as tx:
        assert tx.job(a_job).state not in ("pending", "running")
        assert [a for a in tx.actions(job_id=a_job) if a.slurm_job_id == b_sid] == []
