"""The controller survives slurmctld being slow or down: a tick that cannot reach Slurm is
abandoned whole (no round recorded without its intents), the loop goes on, and an intent
cut short by the outage is finished once slurmctld answers again."""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
from tests.integration.controller.support import (
    FixedPolicy,
    OffsetClock,
    backend,
    converge,
    make_settings,
    make_store,
    running,
    submit_job,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


@pytest.fixture
def frozen_ctld(slurm_cluster: str) -> Iterator[tuple[Callable[[], None], Callable[[], None]]]:
    pid = int((Path(slurm_cluster).parent.parent / "run" / "slurmctld.pid").read_text())
    stopped = [False]

    def stop() -> None:
        os.kill(pid, signal.SIGSTOP)  # it stops answering; its socket still accepts
        stopped[0] = True

    def resume() -> None:
        os.kill(pid, signal.SIGCONT)
        stopped[0] = False

    yield stop, resume
    if stopped[0]:
        resume()


def test_outage_before_and_during_reconcile(
    tmp_path: Path, job_dir: Path, frozen_ctld: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    stop, resume = frozen_ctld
    settings = make_settings(tmp_path)
    store = make_store(settings)
    cluster = backend()
    key = f"ctl-{uuid.uuid4().hex[:8]}"
    job, sid, _ = submit_job(store, cluster, job_dir, key)
    quick = SlurmCliBackend(CliSettings(timeout_s=1, attempts=1))
    policy = FixedPolicy({job: (2, False, ("node1",))})

    def cut_after_update(what: str) -> None:
        if what == "update:logged":
            stop()

    ctl = Controller(
        settings=settings,
        policy=policy,
        cluster=quick,
        store=store,
        clock=OffsetClock(),
        files=FsJobFiles(),
        after_step=cut_after_update,
    )
    try:
        stop()
        with caplog.at_level(logging.ERROR):
            assert ctl.run(max_ticks=2) == 2  # no exception escapes the loop
        assert "tick abandoned (SlurmUnavailable)" in caplog.text
        with store.transaction() as tx:
            assert tx.round() is None and tx.open_intents() == []  # nothing half-recorded
        resume()
        report = ctl.tick_once()  # round 1 recorded; slurmctld stops after the update
        assert report.plan.round_no == 1 and report.reconcile.errors
        with store.transaction() as tx:
            [intent] = tx.open_intents()
            assert [a.outcome for a in tx.actions(intent_id=intent.id)] == ["ok", "timeout"]
    finally:
        resume()
    ctl.reconciler.after_step = lambda _what: None
    converge(ctl)
    assert running(cluster, sid).gres == Gres("gpu", 2)
    with store.transaction() as tx:
        assert tx.open_intents() == [] and tx.round() is not None
    cluster.cancel(job_id=sid)
    store.close()
