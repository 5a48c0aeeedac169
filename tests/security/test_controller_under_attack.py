"""The controller's tick against a hostile inbox: the round is still decided for the honest job.

Bob (icefrog-bob) fills the inbox with poison: a folder named ``²``, a folder name that is
not UTF-8, JSON nested 100 deep, a 5000-digit integer and an integer past Postgres' int4 in
reports signed by him for his own job, a FIFO; he squats Alice's job folder before her
first report, and registers his own job, which carries no icefrog tag. Alice's real held
icefrog job registers through the real job-side writer, as Alice. The real controller
(drain, round, reconcile; real Slurm, real munge, SQLite) then gives her job its GPU, and
Slurm runs it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm import security
from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.protocol import Envelope
from icefrog_slurm.store.inbox import slurm_jobs_of
from icefrog_slurm.store.sql import SqlStore
from tests.integration.controller.support import (
    OffsetClock,
    backend,
    converge,
    make_settings,
    make_store,
    running,
)
from tests.security.inbox_support import METRIC, Site, as_user, make_site, spec_payload
from tests.security.slurm_support import sbatch_as
from tests.support.munge import USERS

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

ALICE, BOB = USERS


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(f"/tmp/icefrog-tick-{uuid.uuid4().hex[:8]}")  # every user can reach it
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _folder(root: Path, user: str) -> Path:
    path = root / user
    path.mkdir(mode=0o755)
    os.chown(path, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    return path


def _poison(site: Site, bob_job: str) -> None:
    """What Bob can drop with no job at all, and with his own (untagged) job."""
    site.put(BOB, "²", "1-metric.json", b"{}")
    site.put(BOB, b"\xff\xfe", b"1-metric.json", b"{}")
    deep = b"[" * 100 + b"]" * 100
    site.drop(BOB, "metric", METRIC, job=bob_job, seq=1, raw=deep)
    huge = _signed(site, bob_job, 2, METRIC).replace(b'"epoch": 1', b'"epoch": ' + b"9" * 5000)
    site.drop(BOB, "metric", {}, job=bob_job, seq=2, raw=huge)
    wide = dict(METRIC, epoch=2**31)  # fits SQLite's integer, not Postgres' int4
    site.drop(BOB, "metric", {}, job=bob_job, seq=3, raw=_signed(site, bob_job, 3, wide))
    os.mkfifo(site.inbox_dir / bob_job / "4-metric.json")
    site.drop(BOB, "register", spec_payload(), job=bob_job, seq=5)  # no icefrog tag


def _signed(site: Site, job: str, seq: int, payload: dict[str, object]) -> bytes:
    """A report Bob signs for his own job (the credential is real; the content is poison)."""
    env = Envelope(1, "metric", job, "bobs", seq, 1000.0 + seq, payload)
    return security.sign(env, run_as=BOB).to_json().encode()


def test_a_hostile_inbox_does_not_stop_the_round_for_the_honest_job(
    tmp_path: Path, root: Path, munge_users: dict[str, int]
) -> None:
    settings = make_settings(tmp_path)
    store: SqlStore = make_store(settings)
    cluster = backend()
    (root / "state").mkdir()
    site = make_site(store, root / "state", munge_users)
    site.inbox.slurm_jobs = slurm_jobs_of(cluster)
    key = uuid.uuid4().hex[:8]
    a_dir, b_dir = _folder(root, ALICE), _folder(root, BOB)
    alice_job = sbatch_as(munge_users[ALICE], a_dir, "-H", "--requeue", "-J", f"tick-{key}",
                          f"--comment=icefrog:tick-{key}", "--gres=gpu:1")  # fmt: skip
    bob_job = sbatch_as(munge_users[BOB], b_dir, "-H", "-J", f"plain-{key}", "--gres=gpu:1")
    try:
        as_user(BOB, lambda: (site.inbox_dir / alice_job).mkdir(mode=0o700))  # squatted
        _poison(site, bob_job)
        inbox = site.inbox_dir
        env = Envelope(1, "register", alice_job, f"tick-{key}", 0, time.time(), spec_payload())
        as_user(ALICE, lambda: security.drop_report(inbox, security.sign(env)))

        ctl = Controller(
            settings=settings,
            policy=StandInPolicy(),
            cluster=cluster,
            store=store,
            clock=OffsetClock(),
            files=FsJobFiles(),
            drain=site.inbox.drain,
        )
        converge(ctl)

        alice = site.job(alice_job)
        assert alice is not None and alice.owner_uid == munge_users[ALICE]
        assert ctl.last is not None and ctl.last.plan.decided_round is not None
        with store.transaction() as tx:
            given = [a.gpus for _, a in tx.job_allocations(alice.id)]
        assert given and given[-1] >= 1
        assert running(cluster, alice_job).user_id == munge_users[ALICE]
        assert site.job(bob_job) is None  # not adopted: no icefrog tag
        reasons = " | ".join(site.reasons())
        for why in ("not a job folder", "nested deeper", "64-bit", "icefrog tag"):
            assert why in reasons
        assert not (site.inbox_dir / alice_job).exists()  # Bob's squat is gone
        assert all(r.isprintable() for r in site.reasons())
        assert site.left_in_inbox() == []
    finally:
        for job in (alice_job, bob_job):
            cluster.cancel(job_id=job)
