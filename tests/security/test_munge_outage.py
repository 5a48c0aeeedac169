"""A munge outage loses no report: munged stopped for a while, then back.

The test runs its own munged (its own key, socket, pid, log and seed files in a temporary
folder: the system munged that Slurm needs is never touched) and points the inbox at it
(``munge_socket``). Reports are signed as the real test users while it runs; it is stopped;
drains run (every report waits in the inbox, none is rejected, munged is asked again only
after the back-off); it is started again with the same key and the next drain accepts them
all, including the ``register`` of Bob's held job on the real cluster, which the next round
then releases. A credential of another munge realm (the system munged's key) is rejected
once munged can tell.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm import security
from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.protocol import Envelope
from icefrog_slurm.store.inbox import DrainResult, slurm_jobs_of
from icefrog_slurm.store.sql import SqlStore
from tests.integration.controller.support import (
    OffsetClock,
    backend,
    converge,
    make_settings,
    running,
)
from tests.security.inbox_support import METRIC, Site, make_site, spec_payload
from tests.security.slurm_support import held_job_as
from tests.support.munge import USERS

ALICE, BOB = USERS
ALICE_JOB = "101"

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


class Munged:
    """A munged of the test's own, started and stopped at will."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = str(folder / "munge.socket")
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)

    def start(self) -> None:
        f = self.folder
        subprocess.run(
            ["munged", "--force", f"--socket={self.socket}", f"--key-file={f / 'munge.key'}",
             f"--pid-file={f / 'munged.pid'}", f"--log-file={f / 'munged.log'}",
             f"--seed-file={f / 'munged.seed'}"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        assert security.munged_answers(socket=self.socket)

    def stop(self) -> None:
        subprocess.run(
            ["munged", f"--socket={self.socket}", "--stop"], check=True, capture_output=True
        )
        assert not security.munged_answers(socket=self.socket)


@pytest.fixture
def munged(munge_users: dict[str, int]) -> Iterator[Munged]:
    if shutil.which("munged") is None:
        pytest.fail("munged is needed (apt-get install munge)")
    folder = Path(f"/tmp/icefrog-munge-{uuid.uuid4().hex[:8]}")
    folder.mkdir(mode=0o755)
    daemon = Munged(folder)
    daemon.start()
    try:
        yield daemon
    finally:
        subprocess.run(["munged", f"--socket={daemon.socket}", "--stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_of_munged_loses_no_report(
    store: SqlStore, tmp_path: Path, munge_users: dict[str, int], munged: Munged
) -> None:
    clock = Clock()
    site = make_site(
        store, tmp_path, munge_users, munge_socket=munged.socket, clock=clock, munge_retry_s=30.0
    )
    cluster = backend()
    held = held_job_as(BOB, f"--comment=icefrog:outage-{uuid.uuid4().hex[:8]}")
    try:
        site.inbox.slurm_jobs = slurm_jobs_of(cluster)
        _outage_then_recovery(site, clock, munged, held)
        # the held job whose register waited out the outage is released by the next round
        ctl = Controller(
            settings=make_settings(tmp_path / "ctl"),
            policy=StandInPolicy(),
            cluster=cluster,
            store=store,
            clock=OffsetClock(),
            files=FsJobFiles(),
        )
        converge(ctl)
        assert running(cluster, held).user_id == munge_users[BOB]
    finally:
        cluster.cancel(job_id=held)


def _outage_then_recovery(site: Site, clock: Clock, munged: Munged, held: str) -> None:
    alice_job = held_job_as(ALICE, f"--comment=icefrog:outage-{uuid.uuid4().hex[:8]}")
    try:
        site.register(ALICE, alice_job)
        assert site.drain() == DrainResult(accepted=1)
        # signed while munged runs, dropped while it is down
        metrics = [site.envelope(ALICE, "metric", {**METRIC, "epoch": s}, seq=s, job=alice_job,
                                 name="cnn") for s in (1, 2)]  # fmt: skip
        register = site.envelope(BOB, "register", spec_payload(), seq=0, job=held, name="bobs")
        foreign = security.sign(  # made by the system munged: another key, another realm
            Envelope(1, "metric", alice_job, "cnn", 3, 1003.0, METRIC), run_as=ALICE
        )
        munged.stop()
        with pytest.raises(security.MungeUnavailable):  # the job side is told "retry later"
            security.sign(foreign, socket=munged.socket, attempts=1)
        for env in (*metrics, register, foreign):
            user = BOB if env.slurm_job_id == held else ALICE
            site.put(user, env.slurm_job_id, f"{env.seq}-{env.kind}.json", env.to_json().encode())

        calls = _count_decodes(site)
        assert site.drain() == DrainResult(deferred=4)
        assert calls == [1]  # munged found down at the first report: the others wait unasked
        clock.now += 10  # within the back-off: munged is not asked
        assert site.drain() == DrainResult(deferred=4) and calls == [1]
        clock.now += 25  # past it: asked once more, still down; the back-off doubles
        assert site.drain() == DrainResult(deferred=4) and calls == [2]
        clock.now += 40
        assert site.drain() == DrainResult(deferred=4) and calls == [2]
        assert site.reasons() == [] and len(site.left_in_inbox()) == 4
        assert site.job(held) is None

        munged.start()  # same key: every credential made before the outage decodes
        clock.now += 30
        assert site.drain() == DrainResult(accepted=3, rejected=1)
        bobs = site.job(held)
        assert bobs is not None and bobs.owner_uid == site.uids[BOB] and bobs.state == "pending"
        assert site.metrics(alice_job) == [0.5, 0.5]
        (reason,) = site.reasons()
        assert "credential rejected by unmunge" in reason
        assert site.left_in_inbox() == []
    finally:
        backend().cancel(job_id=alice_job)


def _count_decodes(site: Site) -> list[int]:
    """A counter of the inbox's calls to munge (the real decode is still what runs)."""
    calls = [0]
    decode = site.inbox.decode

    def counted(credential: str) -> security.DecodedCredential:
        calls[0] += 1
        return decode(credential)

    site.inbox.decode = counted
    return calls


def test_munged_restarted_under_one_report_does_not_reject_it(
    store: SqlStore, tmp_path: Path, munge_users: dict[str, int], munged: Munged
) -> None:
    """munged stops just as the inbox asks it about Alice's report and is back before the
    inbox checks whether munged answers (a restart, or a timeout under a flood of other
    users' requests): the report was not at fault and is asked about again, and accepted.
    A credential that fails twice while munged answers is rejected, as before."""
    clock = Clock()
    site = make_site(store, tmp_path, munge_users, munge_socket=munged.socket, clock=clock)
    site.register(ALICE, ALICE_JOB)
    assert site.drain() == DrainResult(accepted=1)
    decode, restarts = site.inbox.decode, []

    def restarted_under_it(credential: str) -> security.DecodedCredential:
        if restarts:
            return decode(credential)
        munged.stop()
        try:
            return decode(credential)  # no munged: MungeUnavailable, a real socket error
        finally:
            munged.start()
            restarts.append(1)

    site.inbox.decode = restarted_under_it
    site.drop(ALICE, "metric", METRIC, job=ALICE_JOB, seq=1)
    assert site.drain() == DrainResult(accepted=1)
    assert restarts == [1] and site.reasons() == [] and site.metrics(ALICE_JOB) == [0.5]

    def always_unavailable(credential: str) -> security.DecodedCredential:
        raise security.MungeUnavailable("unmunge: munged unavailable: Socket communication error")

    site.inbox.decode = always_unavailable
    site.drop(ALICE, "metric", {**METRIC, "epoch": 2}, job=ALICE_JOB, seq=2)
    assert site.drain() == DrainResult(rejected=1)
    (reason,) = site.reasons()
    assert "munged unavailable" in reason
