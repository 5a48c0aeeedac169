"""Claimed folders and adoption: Alice (icefrog-alice) tries to block or steal Bob's reports.

The inbox is writable by everyone, so Alice can create ``inbox/<Bob's job id>`` before Bob's
job writes there, as a folder, a file or a symlink, and can guess at token folders. Bob's
job side (``security.drop_report``, run as Bob) must still get every report through, and
the drain must name Alice as the squatter, reject what she put there and remove her folder.
A ``register`` adopts only a Slurm job that carries the icefrog tag. The last test does it
all on the real local Slurm cluster: real jobs of both users, the real batched squeue poll.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm import security
from icefrog_slurm.protocol import Envelope
from icefrog_slurm.store.inbox import DrainResult, slurm_jobs_of
from icefrog_slurm.store.sql import SqlStore
from tests.integration.controller.support import backend
from tests.security.inbox_support import METRIC, Site, as_user, site_in_tmp, spec_payload
from tests.security.slurm_support import held_job_as
from tests.support.munge import USERS

ALICE, BOB = USERS


@pytest.fixture
def site(store: SqlStore, munge_users: dict[str, int]) -> Iterator[Site]:
    with site_in_tmp(store, munge_users, "icefrog-claim") as site:
        yield site


def _bob_reports(site: Site, job: str, *kinds: tuple[str, dict[str, object]]) -> list[Path]:
    """Bob's job side, as Bob: each report signed by him and dropped by drop_report."""
    inbox = site.inbox_dir

    def send() -> list[Path]:
        return [
            security.drop_report(
                inbox, security.sign(Envelope(1, kind, job, "bobs", seq, 1000.0 + seq, payload))
            )
            for seq, (kind, payload) in enumerate(kinds)
        ]

    result: list[Path] = as_user(BOB, send)
    return result


def _squat(site: Site, name: str, what: str = "folder") -> Path:
    """Alice takes ``inbox/<name>`` first, as her own folder (with a report in it), a file,
    or a symlink to Bob's... anything."""

    def take() -> Path:
        path = site.inbox_dir / name
        if what == "folder":
            path.mkdir(mode=0o700)
            (path / "0-register.json").write_text("{}")
        elif what == "file":
            path.write_text("mine")
        else:
            path.symlink_to("/tmp")
        return path

    result: Path = as_user(ALICE, take)
    return result


@pytest.mark.parametrize("what", ["folder", "file", "symlink"])
def test_a_claimed_job_folder_blocks_nothing(
    site: Site, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    job = "202"
    site.slurm.jobs[job] = (site.uids[BOB], True)
    _squat(site, job, what)
    paths = _bob_reports(site, job, ("register", spec_payload()), ("metric", METRIC))
    # Bob's job side took a folder of its own, the same one for both reports
    assert paths[0].parent == paths[1].parent and paths[0].parent.name.startswith(f"{job}.")
    assert paths[0].parent.stat().st_uid == site.uids[BOB]
    with caplog.at_level(logging.WARNING):
        result = site.drain()
    assert result == DrainResult(accepted=2, rejected=1)
    bobs = site.job(job)
    assert bobs is not None and bobs.owner_uid == site.uids[BOB]
    assert site.metrics(job) == [0.5]
    (reason,) = site.reasons()
    if what == "folder":  # named, rejected, and the folder is gone
        assert f"held by uid {site.uids[ALICE]} ({ALICE})" in reason
        assert f"folder {job} is held by uid {site.uids[ALICE]} ({ALICE})" in caplog.text
        assert not (site.inbox_dir / job).exists()
    else:
        assert "not a job folder" in reason
        assert not os.path.lexists(site.inbox_dir / job)
    assert site.left_in_inbox() == []


def test_a_guessed_token_folder_is_the_squatters_own_problem(site: Site) -> None:
    """Alice makes ``202.<token>`` folders with reports claiming Bob's job: all rejected as
    hers, removed; Bob's reports in his folder are accepted."""
    job = "202"
    site.slurm.jobs[job] = (site.uids[BOB], True)
    _bob_reports(site, job, ("register", spec_payload()))
    token = f"{job}.{'0' * 32}"
    site.drop(ALICE, "metric", METRIC, seq=1, job=job, name="bobs", folder=token)
    assert site.drain() == DrainResult(accepted=1, rejected=1)
    assert "not by the job's owner" in site.reasons()[0]
    assert not (site.inbox_dir / token).exists() and site.left_in_inbox() == []


def test_register_adopts_only_icefrog_tagged_jobs(site: Site) -> None:
    site.slurm.jobs["303"] = (site.uids[ALICE], False)  # Alice's plain Slurm job
    site.drop(ALICE, "register", spec_payload(), job="303")
    assert site.drain() == DrainResult(rejected=1)
    assert "does not carry the icefrog tag" in site.reasons()[0]
    assert site.job("303") is None


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_on_real_slurm_a_squatter_and_an_untagged_job_get_nowhere(
    site: Site, munge_users: dict[str, int]
) -> None:
    """Bob's held icefrog job and Alice's plain one, both real; the owners and the tag come
    from one real squeue poll for every folder of the drain."""
    cluster = backend()
    bob_job = held_job_as(BOB, f"--comment=icefrog:claim-{uuid.uuid4().hex[:8]}")
    alice_job = held_job_as(ALICE)
    try:
        site.inbox.slurm_jobs = slurm_jobs_of(cluster)
        _squat(site, bob_job)  # Alice holds Bob's folder before his first report
        _bob_reports(site, bob_job, ("register", spec_payload()), ("metric", METRIC))
        site.drop(ALICE, "register", spec_payload(), job=alice_job)  # adopt her plain job
        assert site.drain() == DrainResult(accepted=2, rejected=2)
        bobs = site.job(bob_job)
        assert bobs is not None and bobs.owner_uid == munge_users[BOB]
        assert site.job(alice_job) is None and site.metrics(bob_job) == [0.5]
        reasons = " | ".join(site.reasons())
        assert f"held by uid {munge_users[ALICE]} ({ALICE})" in reasons
        assert "does not carry the icefrog tag" in reasons
        assert not (site.inbox_dir / bob_job).exists() and site.left_in_inbox() == []
    finally:
        for job in (bob_job, alice_job):
            cluster.cancel(job_id=job)


@pytest.mark.parametrize("what", ["folder", "file"])
def test_the_trainers_reporter_survives_a_claimed_folder(site: Site, what: str) -> None:
    """The trainer's own Reporter, run as Bob, used to die at start when Alice held the
    name (as a file) or to write into her folder's shadow; it reports through a token folder."""
    from icefrog_launcher.reports import Reporter

    job = "202"
    site.slurm.jobs[job] = (site.uids[BOB], True)
    _squat(site, job, what)
    _bob_reports(site, job, ("register", spec_payload()))  # icefrog submit, as Bob

    def train() -> Path | None:
        reporter = Reporter(inbox=str(site.inbox_dir), slurm_job_id=job, job_name="bobs")
        reporter.send("metric", METRIC)
        return reporter.send("metric", {**METRIC, "epoch": 2, "value": 0.7})

    path = as_user(BOB, train)
    assert path is not None and path.parent.name.startswith(f"{job}.")
    assert site.drain() == DrainResult(accepted=3, rejected=1)
    assert site.metrics(job) == [0.5, 0.7] and site.left_in_inbox() == []
