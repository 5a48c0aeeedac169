"""A job's owner rewrites its comment: Alice (icefrog-alice) drops the icefrog tag from her
running managed job (``scontrol update JobId=N Comment=...``, which Slurm lets an owner do)
and writes a tag into a plain job of hers, to make the controller count GPUs wrong.

The capacity the controller plans with counts every Slurm job but the store's own (by Slurm
job id and owner uid) as foreign, whatever its comment says: her managed job is still
planned by its Slurm id and counted once, her tagged plain job (whose register is refused:
it was never held) holds foreign GPUs. She gains nothing: her job keeps its one GPU and its
one start, Bob's held job is unchanged, and every round is decided. Real controller (drain,
rounds, reconcile), real local cluster, real munge, SQLite.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.domain.cluster import Gres, PartitionCapacity
from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
from icefrog_slurm.store.inbox import slurm_jobs_of
from tests.integration.controller.support import (
    FixedPolicy,
    OffsetClock,
    converge,
    make_settings,
    make_store,
    running,
)
from tests.security.inbox_support import make_site, spec_payload
from tests.security.slurm_support import sbatch_as
from tests.support.munge import USERS

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

ALICE, BOB = USERS


class RecordingCluster(SlurmCliBackend):
    """The real CLI backend, keeping each capacity it computed for the controller."""

    def __init__(self) -> None:
        super().__init__(CliSettings(timeout_s=10, attempts=2, backoff_s=0.2))
        self.capacities: list[PartitionCapacity] = []

    def partition_capacity(self, **kwargs: Any) -> PartitionCapacity:
        cap = super().partition_capacity(**kwargs)
        self.capacities.append(cap)
        return cap


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(f"/tmp/icefrog-comment-{uuid.uuid4().hex[:8]}")  # every user can reach it
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _folder(root: Path, user: str) -> Path:
    path = root / user
    path.mkdir(mode=0o755)
    os.chown(path, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    return path


def _as(user: str, *argv: str) -> None:
    pw = pwd.getpwnam(user)
    subprocess.run(
        ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--", *argv],
        check=True, capture_output=True, text=True, env=dict(os.environ), timeout=30,
    )  # fmt: skip


def test_a_rewritten_comment_neither_double_counts_nor_hides_gpus(
    tmp_path: Path, root: Path, munge_users: dict[str, int]
) -> None:
    settings = make_settings(tmp_path)
    store = make_store(settings)
    cluster = RecordingCluster()
    (root / "state").mkdir()
    site = make_site(store, root / "state", munge_users)
    site.inbox.slurm_jobs = slurm_jobs_of(cluster)
    key = uuid.uuid4().hex[:8]
    a_dir, b_dir = _folder(root, ALICE), _folder(root, BOB)
    alice = munge_users[ALICE]
    managed = sbatch_as(alice, a_dir, "-H", "--requeue", "-J", f"cnn-{key}",
                        f"--comment=icefrog:{key}", "--gres=gpu:1")  # fmt: skip
    plain = sbatch_as(alice, a_dir, "-J", f"plain-{key}", f"--comment=icefrog:{key}-plain",
                      "--gres=gpu:1", output="/dev/null")  # fmt: skip
    bobs = sbatch_as(munge_users[BOB], b_dir, "-H", "--requeue", "-J", f"bob-{key}",
                     f"--comment=icefrog:{key}-bob", "--gres=gpu:1")  # fmt: skip
    try:
        running(cluster, plain)
        site.drop(ALICE, "register", spec_payload(), job=managed)
        site.drop(ALICE, "register", spec_payload(), job=plain)  # refused: never held
        site.drop(BOB, "register", spec_payload(), job=bobs, name="bobs")
        site.drain()
        alice_job, bob_job, refused = site.job(managed), site.job(bobs), site.job(plain)
        assert alice_job is not None and bob_job is not None and refused is None
        policy = FixedPolicy({alice_job.id: (1, False, ()), bob_job.id: (0, False, ())})
        clock = OffsetClock()
        ctl = Controller(
            settings=settings, policy=policy, cluster=cluster, store=store, clock=clock,
            files=FsJobFiles(), drain=site.inbox.drain,
        )  # fmt: skip
        converge(ctl)
        before = running(cluster, managed)
        assert before.tag is not None and before.gres == Gres("gpu", 1)
        last = cluster.capacities[-1]
        assert managed not in last.foreign_job_ids and plain in last.foreign_job_ids

        _as(ALICE, "scontrol", "update", f"JobId={managed}", f"Comment=mine-{key}")
        assert cluster.poll(job_ids=[managed])[managed].tag is None  # Slurm took it
        # what a capacity by the comment alone makes of it: her job counted foreign
        by_tag = cluster.partition_capacity(partition="gpu")
        assert managed in by_tag.foreign_job_ids and plain not in by_tag.foreign_job_ids

        with store.transaction() as tx:
            rounds_before = len(tx.job_allocations(alice_job.id))
        seen = len(cluster.capacities)
        clock.next_round(settings)
        converge(ctl)
        after_rewrite = cluster.capacities[seen:]
        assert after_rewrite
        for cap in after_rewrite:  # hers counted once (as planned), the plain one foreign
            assert managed not in cap.foreign_job_ids and plain in cap.foreign_job_ids
        with store.transaction() as tx:
            given = tx.job_allocations(alice_job.id)
            bob_given = tx.job_allocations(bob_job.id)
            states = (tx.job(alice_job.id).state, tx.job(bob_job.id).state)
        assert len(given) > rounds_before  # the round was decided
        assert given[-1][1].gpus == 1 and bob_given[-1][1].gpus == 0
        assert states == ("running", "pending")
        now = cluster.poll(job_ids=[managed, bobs])
        assert (now[managed].state, now[managed].gres) == ("RUNNING", Gres("gpu", 1))
        starts = (a_dir / "starts").read_text().splitlines()  # her plain job's too
        assert [x for x in starts if x.startswith(f"start {managed} ")] == [
            f"start {managed} restarts=0"
        ]  # never requeued
        assert now[bobs].held and now[bobs].gres == Gres("gpu", 1)
    finally:
        for job in (managed, plain, bobs):
            cluster.cancel(job_id=job)
