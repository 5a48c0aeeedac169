"""Kill test: SIGKILL the controller process at every step point of a reconcile, restart
it, and check the cluster converges to the plan with no job lost, duplicated or left held.

The plan (stand-in policy): job A runs on 1 GPU and needs 2 (checkpoint, requeue, update,
release), job B is held and starts on 1 GPU (update, release). Step points are the moments
right after a Slurm command and right after its outcome is logged (``ICEFROG_KILL_AFTER_STEP``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.port import Gres
from icefrog_slurm.store.sql import SqlStore
from tests.integration.controller.support import (
    OffsetClock,
    backend,
    converge,
    live_tagged,
    make_controller,
    make_settings,
    make_store,
    running,
    submit_job,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(90)]
REPO = Path(__file__).resolve().parents[3]
STEP_POINTS = 12  # A: signal; B: update, release; A: requeue_hold, update, release (x2)


@pytest.fixture
def cluster() -> Iterator[SlurmCliBackend]:
    be = backend()
    yield be

    for j in be._jobs().values():
        if not j.finished and j.tag is not None and j.tag.key.startswith("kill-"):
            be.cancel(job_id=j.job_id)


@pytest.mark.parametrize("step", range(1, STEP_POINTS + 1))
def test_killed_at_any_step_converges_after_restart(
    step: int, tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend
) -> None:
    settings = make_settings(tmp_path, checkpoint_timeout_s=15.0)
    config = tmp_path / "icefrog.toml"
    config.write_text(
        f'[state]\ndir = "{settings.state.dir}"\n[inbox]\npoll_s = 0.5\n'
        "[controller]\nreconcile_poll_s = 0.3\ncheckpoint_timeout_s = 15.0\n"
    )
    store: SqlStore = make_store(settings)
    tag = f"kill-{uuid.uuid4().hex[:6]}"
    a, sid_a, _ = submit_job(store, cluster, job_dir, f"{tag}-a", held=False, min_gpus=2)
    running(cluster, sid_a)
    b, sid_b, _ = submit_job(store, cluster, job_dir, f"{tag}-b", min_gpus=1)
    env = {**os.environ, "ICEFROG_KILL_AFTER_STEP": str(step), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", "controller", "--config", str(config),
         "--max-ticks", "200", "--policy", "standin"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stdout + proc.stderr  # it died at that step

    restarted = make_controller(
        settings, SqlStore(settings.store.url), StandInPolicy(), OffsetClock()
    )
    converge(restarted)
    assert running(cluster, sid_a).gres == Gres("gpu", 2)
    assert running(cluster, sid_b).gres == Gres("gpu", 1)
    for key in (f"{tag}-a", f"{tag}-b"):
        live = live_tagged(cluster, key)
        assert len(live) == 1 and not live[0].held, live  # none lost, doubled or held
    with store.transaction() as tx:
        assert tx.open_intents() == []
        assert tx.job(a).slurm_job_ids == (sid_a,) and tx.job(b).slurm_job_ids == (sid_b,)
    store.close()


MOVE_POINTS = 9  # signal, requeue_hold, resubmit (x2: done, logged), link, release (x2)


def _move_child(url: str, state_dir: str, job: int, step: int) -> None:
    """In a forked child: a controller deciding a shared GPU for ``job``, killing itself
    after step point ``step``."""
    from tests.integration.controller.support import FixedPolicy

    settings = make_settings(Path(state_dir).parent, checkpoint_timeout_s=15.0)
    left = [step]

    def hook(_what: str) -> None:
        left[0] -= 1
        if left[0] <= 0:
            os.kill(os.getpid(), 9)

    policy = FixedPolicy({job: (1, True, ("node4",))})
    ctl = make_controller(settings, SqlStore(url), policy, OffsetClock())
    ctl.reconciler.after_step = hook
    ctl.run(max_ticks=200)


@pytest.mark.parametrize("step", range(1, MOVE_POINTS + 1))
def test_killed_while_moving_to_a_shared_gpu_converges_after_restart(
    step: int, tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend
) -> None:
    import multiprocessing

    from tests.integration.controller.support import FixedPolicy

    settings = make_settings(tmp_path, checkpoint_timeout_s=15.0)
    store = make_store(settings)
    key = f"kill-{uuid.uuid4().hex[:6]}"
    job, sid, _ = submit_job(store, cluster, job_dir, key, held=False)
    running(cluster, sid)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(
        target=_move_child, args=(settings.store.url, settings.state.dir, job, step)
    )
    child.start()
    child.join(60)
    assert child.exitcode == -9

    policy = FixedPolicy({job: (1, True, ("node4",))})
    converge(make_controller(settings, SqlStore(settings.store.url), policy, OffsetClock()))
    live = live_tagged(cluster, key)
    assert len(live) == 1 and not live[0].held, live  # none lost, doubled or held
    with store.transaction() as tx:
        assert tx.open_intents() == []
        assert tx.job(job).slurm_job_ids == (sid, live[0].job_id)  # the chain, kept
    assert running(cluster, live[0].job_id).gres == Gres("shard", 1)
    store.close()
