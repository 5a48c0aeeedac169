"""A time limit closes with a requeue, not a failure, on the local cluster.

The fast tests use a bash stand-in for the training job that, on its first run, writes the
checkpoint marker and exits 75 on its own, as a job the time limit's signal reached does.
The slow one is the real thing: ``icefrog submit`` with ``SBATCH_TIMELIMIT=2`` and
``SBATCH_SIGNAL=B:USR1@30`` (sbatch's own input variables) runs a real digits job slowed
by ``--step-delay``, longer than Slurm lets it run before the signal. Slurm signals the
batch shell 60-90 s into the run (its time checks run every 30 s); the trainers
checkpoint, the launcher exits 75 and the job ends FAILED with no intent of the
controller moving it. The controller (the real one, with its inbox, ticked here) requeues
it held on its own and releases it by its plan; the next run gets the whole time limit
again, resumes from the checkpoint and finishes (or, when Slurm's signal came early, is
requeued once more). The job is never recorded failed, and the controller never
signalled it. About 2-3 minutes (a third run makes it up to 4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from icefrog_slurm.slurm import parse
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.port import SlurmRejected
from icefrog_slurm.store.sql import SqlStore
from tests.e2e.harness import DIGITS, TwoStepPolicy, logs_of, rig
from tests.integration.conftest import REPO, wait_for
from tests.integration.controller import support
from tests.integration.controller.support import (
    FixedPolicy,
    OffsetClock,
    make_controller,
    make_settings,
    running,
    state_of,
    submit_job,
)

pytestmark = [pytest.mark.slurm]

# First run: checkpoint (the marker) and exit 75, as after a time limit's USR1; then finish.
TIMED_OUT_ONCE = """#!/bin/bash
echo "start ${SLURM_RESTART_COUNT:-0}" >> "$PWD/starts"
sleep 2
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then touch "$PWD/checkpointed"; exit 75; fi
exit 0
"""


TAG_PREFIX = "tl-"
"""The tags of this module's jobs (the ``cluster`` fixture cancels them: conftest.py)."""


def _run_on_its_own(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, job_dir: Path, script: str
) -> tuple[int, str, Path, list[str]]:
    """A job the controller released; it ends on its own (``script``). Ticks until the
    store says it ended; returns (job, Slurm id, run dir, store states seen)."""
    settings = make_settings(tmp_path, release_gap_s=2.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(support, "SCRIPT", script)  # submit_job's batch script
        job, sid, run_dir = submit_job(store, cluster, job_dir, f"tl-{uuid.uuid4().hex[:8]}")
    ctl = make_controller(settings, store, FixedPolicy({job: (1, False, ())}), OffsetClock())
    seen: list[str] = []

    def ended() -> bool:
        ctl.tick_once()
        with store.transaction() as tx:
            state = tx.job(job).state
        if not seen or seen[-1] != state:
            seen.append(state)
        return state not in ("pending", "running")

    wait_for(f"the job to end in the store (seen: {seen})", ended, timeout=120, every=0.3)
    return job, sid, run_dir, seen


def test_a_job_that_checkpointed_and_exited_75_on_its_own_is_requeued_not_failed(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, job_dir: Path
) -> None:
    job, _, run_dir, seen = _run_on_its_own(tmp_path, store, cluster, job_dir, TIMED_OUT_ONCE)
    assert seen[-1] == "finished" and "failed" not in seen, seen
    assert (run_dir / "starts").read_text().split() == ["start", "0", "start", "1"]
    with store.transaction() as tx:
        actions = [(a.action, a.outcome) for a in tx.actions(job_id=job)]
    assert ("requeue_hold", "ok") in actions and ("signal", "ok") not in actions, actions
    assert actions[-1] == ("release", "ok"), actions


@pytest.mark.parametrize(
    "script",
    [
        pytest.param("#!/bin/bash\nsleep 2\nexit 1\n", id="no-marker"),
        # a marker the job did not write in this run (older than its release) proves nothing
        pytest.param(
            "#!/bin/bash\ntouch -d '-1 hour' \"$PWD/checkpointed\"\nsleep 2\nexit 75\n",
            id="stale-marker",
        ),
    ],
)
def test_a_job_that_ended_without_a_fresh_checkpoint_is_recorded_failed(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, job_dir: Path, script: str
) -> None:
    job, sid, _, seen = _run_on_its_own(tmp_path, store, cluster, job_dir, script)
    assert seen[-1] == "failed", seen
    assert state_of(cluster, sid).state == "FAILED"  # never requeued
    with store.transaction() as tx:
        assert "requeue_hold" not in {a.action for a in tx.actions(job_id=job)}


def test_a_job_slurm_already_requeued_counts_as_requeued_and_is_held(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, job_dir: Path
) -> None:
    """A site's RequeueExit=75: Slurm requeued the job (pending, not held) before the
    controller's requeuehold, which Slurm then refuses ("Job is pending execution"). The
    requeue is done: the job is held as requeuehold would have left it. (Played here with
    ``scontrol requeue`` of the running job: the dev cluster has no RequeueExit.)"""
    settings = make_settings(tmp_path)
    job, sid, _ = submit_job(store, cluster, job_dir, f"tl-{uuid.uuid4().hex[:8]}")
    ctl = make_controller(settings, store, FixedPolicy({job: (1, False, ())}), OffsetClock())
    ctl.tick_once()
    running(cluster, sid)
    subprocess.run(["scontrol", "requeue", sid], check=True, timeout=30)
    wait_for("Slurm's requeue", lambda: state_of(cluster, sid).state == "PENDING", timeout=30)
    assert not state_of(cluster, sid).held
    said = ctl.reconciler._requeue_hold(sid)
    assert said == "already requeued by Slurm (RequeueExit): held"
    assert state_of(cluster, sid).held
    assert ctl.reconciler._requeue_hold(sid) == "already requeued held by Slurm"
    # an administrator's hold is not a requeue of Slurm's: refused, left alone
    subprocess.run(["scontrol", "hold", sid], check=True, timeout=30)
    assert state_of(cluster, sid).admin_held
    with pytest.raises(SlurmRejected):
        ctl.reconciler._requeue_hold(sid)
    cluster.cancel(job_id=sid)


TIME_LIMIT_MIN = 2


def _run_window_s(sid: str) -> int | None:
    """end_time - start_time of the Slurm job's current run (squeue --json, in any version's
    layout: the parser's own readers), when running."""
    out = subprocess.run(
        ["squeue", "--json"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    for job in json.loads(out)["jobs"]:
        if str(job["job_id"]) == sid and parse._state(job["job_state"]) == "RUNNING":
            end, start = parse._number(job["end_time"]), parse._number(job["start_time"])
            return None if end is None or start is None else end - start
    return None


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_signalled_before_its_time_limit_is_requeued_resumes_and_finishes(
    job_dir: Path,
) -> None:
    with rig(job_dir, TwoStepPolicy(first=(1, ()), then=(1, ()))) as r:
        workdir = job_dir / "timed"
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            SBATCH_TIMELIMIT=str(TIME_LIMIT_MIN),
            SBATCH_SIGNAL="B:USR1@30",
        )
        done = subprocess.run(
            [sys.executable, "-m", "icefrog_slurm", "submit", "--config", str(r.config),
             "--partition", "gpu", "--workdir", str(workdir), "--job-name", "timed",
             "--gpus", "1", "--batch", "32", "--max-epochs", "3", "--",
             str(DIGITS), "--step-delay", "0.6"],
            capture_output=True, text=True, timeout=60, env=env, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        sid = done.stdout.split()[-1]
        try:
            states: set[str] = set()
            windows: list[int] = []
            deadline = time.monotonic() + 280
            while time.monotonic() < deadline:
                r.controller.tick_once()
                job = r.job()
                states.add(job.state)
                if job.state not in ("pending", "running"):
                    break
                if r.cluster.job_detail(job_id=sid).restarts >= 1:
                    window = _run_window_s(sid)
                    if window is not None:
                        windows.append(window)
                time.sleep(0.5)
            logs = logs_of(workdir)
            assert job.state == "finished", (states, logs[-3000:])
            assert "failed" not in states
            assert job.finish_reason == "max_epochs", logs[-3000:]
            # the time limit's signal made it checkpoint; the next run resumed from there
            assert "requeue requested" in logs, logs[-3000:]
            assert "resumed from checkpoint" in logs, logs[-3000:]
            detail = r.cluster.job_detail(job_id=sid)
            assert detail.restarts >= 1 and detail.time_limit_min == TIME_LIMIT_MIN
            assert job.slurm_job_ids == (sid,)
            # Slurm gives each run the whole limit again
            assert windows and set(windows) == {TIME_LIMIT_MIN * 60}, windows
            with r.store.transaction() as tx:
                actions = tx.actions(job_id=job.id)
            done_ok = [(a.action, a.detail) for a in actions if a.outcome == "ok"]
            assert ("requeue_hold", "") in done_ok, done_ok
            assert "signal" not in {a.action for a in actions}  # the controller never asked
            assert "release" in {a.action for a in actions}
        finally:
            r.cluster.cancel(job_id=sid)


def test_a_job_slurm_requeued_held_on_its_own_is_released_by_the_plan(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, job_dir: Path
) -> None:
    """A site's RequeueExitHold=75: Slurm requeues a job that exits 75 held, in state
    SPECIAL_EXIT (played with ``scontrol requeuehold State=SpecialExit``, as the dev cluster
    has no RequeueExitHold). The controller reads it as pending and held, takes Slurm's
    requeue as done and releases the job by its plan, ``release_gap_s`` after it first saw
    it held: it runs again, never failed."""
    settings = make_settings(tmp_path, release_gap_s=2.0)
    job, sid, run_dir = submit_job(store, cluster, job_dir, f"tl-{uuid.uuid4().hex[:8]}")
    ctl = make_controller(settings, store, FixedPolicy({job: (1, False, ())}), OffsetClock())
    ctl.tick_once()
    running(cluster, sid)
    wait_for("first start", lambda: (run_dir / "starts").exists())
    subprocess.run(["scontrol", "requeuehold", "State=SpecialExit", sid], check=True, timeout=30)
    wait_for("Slurm's hold", lambda: state_of(cluster, sid).held, timeout=30)
    assert ctl.reconciler._requeue_hold(sid) == "already requeued held by Slurm"
    states: list[str] = []

    def restarted() -> bool:
        ctl.tick_once()
        with store.transaction() as tx:
            states.append(tx.job(job).state)
        return len((run_dir / "starts").read_text().splitlines()) == 2

    wait_for("the second start", restarted, timeout=60, every=0.5)
    assert "pending" in states and "failed" not in states, states
    with store.transaction() as tx:
        actions = tx.actions(job_id=job)
    assert [a.action for a in actions][-3:] == ["requeued", "update", "release"]
    # the requeue it did not make is taken as seen then, and the release waits its gap
    # (released at once, in the second of the requeue, slurmd killed the job as
    # "non-startable: Job credential revoked" and it ended FAILED, seen on a loaded machine)
    assert actions[-1].time - actions[-3].time >= settings.controller.release_gap_s
