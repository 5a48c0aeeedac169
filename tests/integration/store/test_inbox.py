"""The report inbox with REAL munge credentials made as two unprivileged users.

A report is accepted only when its munge credential, made by the Slurm job's owner, signs
exactly its content; everything else is rejected with a recorded reason and changes
nothing. Runs on SQLite and Postgres.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm import security
from icefrog_slurm.protocol import MAX_REPORT_BYTES, Envelope
from icefrog_slurm.store.inbox import DrainResult, ReportInbox, SlurmJobFacts
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import spec
from tests.security.inbox_support import as_user
from tests.support.munge import USERS, ensure_munged, ensure_users

ALICE, BOB = USERS
ALICE_JOB, BOB_JOB = "101", "202"


@pytest.fixture(scope="session")
def uids() -> dict[str, int]:
    if os.geteuid() != 0:
        pytest.skip("the munge security tests need root (to make test users and run as them)")
    why = ensure_munged()
    if why is not None:
        pytest.fail(f"real munge is needed: {why}")
    return ensure_users()


def slurm_table(owners: dict[str, int]) -> Callable[[Collection[str]], dict[str, SlurmJobFacts]]:
    """A stand-in for Slurm's batched poll: the jobs of ``owners`` (all icefrog-tagged)."""
    return lambda ids: {i: SlurmJobFacts(uid=owners[i], icefrog=True) for i in ids if i in owners}


@dataclass
class Site:
    """An inbox folder, its archive, a fake Slurm owner table and the store."""

    inbox: ReportInbox
    root: Path
    uids: dict[str, int]
    owners: dict[str, int]

    def drop(
        self,
        user: str,
        kind: str,
        payload: dict[str, Any],
        *,
        seq: int = 0,
        job: str = ALICE_JOB,
        folder: str | None = None,
        name: str = "cnn",
        tamper: Callable[[Envelope], Envelope] | None = None,
        raw: bytes | None = None,
    ) -> Path:
        """Write a report as ``user`` would: credential made as that user, file owned by them."""
        env = security.sign(Envelope(1, kind, job, name, seq, 1000.0 + seq, payload), run_as=user)
        if tamper is not None:
            env = tamper(env)
        where = self.root / "inbox" / (folder or job)
        if not where.exists():  # the first writer makes the folder and owns it
            where.mkdir()
            os.chown(where, self.uids[user], -1)
        path = where / f"{seq}-{kind}.json"
        path.write_bytes(raw if raw is not None else env.to_json().encode())
        os.chown(path, self.uids[user], -1)
        return path

    def drain(self) -> DrainResult:
        return self.inbox.drain()

    def reasons(self) -> list[str]:
        with self.inbox.store.transaction() as tx:
            return [r.reason for r in tx.rejected_reports()]

    def state(self) -> Any:
        """Everything a report could change (the rejected-report ledger aside)."""
        with self.inbox.store.transaction() as tx:
            return tx.jobs(), tx.accepted_count(), self.inbox.store.snapshot(include_finished=True)


@pytest.fixture
def site(store: SqlStore, tmp_path: Path, uids: dict[str, int]) -> Iterator[Site]:
    owners = {ALICE_JOB: uids[ALICE], BOB_JOB: uids[BOB]}
    inbox = ReportInbox(
        store=store,
        inbox_dir=tmp_path / "inbox",
        archive_dir=tmp_path / "archive",
        slurm_jobs=slurm_table(owners),
        clock=lambda: 5000.0,
    )
    inbox.prepare()
    yield Site(inbox, tmp_path, uids, owners)


def _register(site: Site, user: str = ALICE, job: str = ALICE_JOB, name: str = "cnn") -> None:
    site.drop(user, "register", _spec_payload(), job=job, name=name)
    assert site.drain() == DrainResult(accepted=1)


def _spec_payload() -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(spec())))


METRIC = {"epoch": 1, "name": "val_acc", "value": 0.5}


def test_good_reports_are_accepted_and_archived(site: Site) -> None:
    _register(site)
    site.drop(ALICE, "metric", METRIC, seq=1)
    site.drop(
        ALICE, "progress", {"epoch": 1, "samples_done": 5, "effective_samples_done": 4.5}, seq=2
    )
    site.drop(
        ALICE,
        "grad_stats",
        {"epoch": 1, "frozen": 1, "grad_var": [1, 2, 3], "grad_sqr": [4, 5, 6]},
        seq=3,
    )
    assert site.drain() == DrainResult(accepted=3)
    (view,) = site.inbox.store.snapshot().jobs
    job = view.job
    assert (job.owner_uid, job.owner_user, job.slurm_job_ids, job.spec) == (
        site.uids[ALICE],
        ALICE,
        (ALICE_JOB,),
        spec(),
    )
    assert [m.value for m in view.metrics] == [0.5] and job.progress.samples_done == 5
    assert view.grad_stats is not None and view.grad_stats.grad_var == (1.0, 2.0, 3.0)
    assert list((site.root / "inbox" / ALICE_JOB).iterdir()) == []
    assert len(list((site.root / "archive" / "accepted" / ALICE_JOB).iterdir())) == 4
    assert site.drain() == DrainResult()  # processed files are never read again
    assert oct(os.stat(site.root / "inbox").st_mode & 0o7777) == "0o1733"


def test_a_report_for_another_users_job_is_rejected(site: Site) -> None:
    _register(site)
    _register(site, BOB, BOB_JOB, name="bobs")
    before = site.state()
    # Bob's credential and file, in Alice's job folder, claiming Alice's job.
    site.drop(BOB, "metric", METRIC, seq=5)
    # Bob's credential on a file that looks like Alice's (as if he had her write it).
    path = site.drop(BOB, "metric", METRIC, seq=6)
    os.chown(path, site.uids[ALICE], -1)
    # Bob's own folder, claiming Alice's job.
    site.drop(BOB, "metric", METRIC, seq=7, folder=BOB_JOB)
    # Bob's own job, but using Alice's job name to reach her record.
    site.drop(BOB, "metric", METRIC, seq=8, job=BOB_JOB, name="cnn")
    assert site.drain() == DrainResult(rejected=4)
    assert site.state() == before
    reasons = sorted(site.reasons())  # owners' files are read in turns: order by text
    assert "is bound to icefrog job" in reasons[0]
    assert f"credential made by uid {site.uids[BOB]}" in reasons[1]
    assert "file owned by uid" in reasons[2]
    assert "in folder 202" in reasons[3]


def test_malformed_oversized_and_unregistered_reports_change_nothing(site: Site) -> None:
    _register(site)
    before = site.state()
    site.drop(ALICE, "metric", METRIC, seq=1, raw=b"{not json")
    site.drop(ALICE, "metric", {**METRIC, "extra": 1}, seq=2)
    site.drop(ALICE, "metric", METRIC, seq=3, raw=b" " * (MAX_REPORT_BYTES + 1))
    site.drop(
        ALICE, "metric", METRIC, seq=4, tamper=lambda e: replace(e, credential="MUNGE:forged:")
    )
    site.drop(ALICE, "metric", METRIC, seq=5, job="303")  # Slurm does not know job 303
    site.owners["404"] = site.uids[ALICE]
    site.drop(ALICE, "metric", METRIC, seq=6, job="404")  # never registered
    (site.root / "inbox" / ALICE_JOB / "7-metric.json").symlink_to("/etc/passwd")
    assert site.drain() == DrainResult(rejected=7)
    assert site.state() == before
    reasons = " | ".join(site.reasons())
    for part in (
        "not valid JSON",
        "extra: unknown field",
        "more than the limit",
        "unmunge",
        "unknown to Slurm",
        "register first",
        "not a plain file",  # the symlink, from its lstat: never opened
    ):
        assert part in reasons
    assert Path("/etc/passwd").is_file()


def test_replayed_credential_on_other_content_and_reused_seq(site: Site) -> None:
    _register(site)
    good = site.drop(ALICE, "metric", METRIC, seq=1)
    copy = json.loads(good.read_text())
    assert site.drain() == DrainResult(accepted=1)
    before = site.state()
    # The same credential on different content: the signed digest no longer matches.
    forged = dict(copy, payload={**METRIC, "value": 0.99}, seq=2)
    site.drop(ALICE, "metric", METRIC, seq=2, raw=json.dumps(forged).encode())
    # The very same report again: a duplicate, archived, changes nothing.
    site.drop(ALICE, "metric", METRIC, seq=1, raw=json.dumps(copy).encode())
    assert site.drain() == DrainResult(rejected=1, duplicates=1)
    # seq 1 again with new content and a fresh valid credential: refused.
    site.drop(ALICE, "metric", {**METRIC, "value": 0.7}, seq=1)
    assert site.drain() == DrainResult(rejected=1)
    assert site.state() == before
    reasons = site.reasons()
    assert "digest mismatch" in reasons[0] and "was used for other content" in reasons[1]


def test_owner_recorded_at_registration_serves_when_slurm_forgot_the_job(site: Site) -> None:
    _register(site)
    del site.owners[ALICE_JOB]  # Slurm purged the finished job (MinJobAge)
    site.drop(
        ALICE, "finished", {"reason": "target_reached", "epoch": 9, "final_metric": 0.95}, seq=1
    )
    site.drop(BOB, "metric", METRIC, seq=2)  # the record's owner still rules out Bob
    assert site.drain() == DrainResult(accepted=1, rejected=1)
    with site.inbox.store.transaction() as tx:
        (job,) = tx.jobs()
    assert (job.state, job.final_metric) == ("finished", 0.95)


def test_a_failing_slurm_lookup_leaves_reports_for_the_next_pass(site: Site) -> None:
    _register(site)
    path = site.drop(ALICE, "metric", METRIC, seq=1)
    lookup = site.inbox.slurm_jobs

    def down(ids: Collection[str]) -> dict[str, SlurmJobFacts]:
        raise OSError("slurmctld is down")

    site.inbox.slurm_jobs = down
    assert site.drain() == DrainResult(deferred=1) and path.exists() and site.reasons() == []
    site.inbox.slurm_jobs = lookup
    assert site.drain() == DrainResult(accepted=1)


def test_the_job_side_writer_run_as_the_user_is_accepted(
    store: SqlStore, uids: dict[str, int]
) -> None:
    """End to end: the job side's own code, run as Alice (a forked child that dropped to her
    uid), signs and drops a report the inbox accepts."""
    base = Path(tempfile.mkdtemp(prefix="icefrog-inbox-"))
    try:
        base.chmod(0o755)
        inbox = ReportInbox(
            store=store,
            inbox_dir=base / "inbox",
            archive_dir=base / "archive",
            slurm_jobs=slurm_table({ALICE_JOB: uids[ALICE]}),
        )
        inbox.prepare()
        env = Envelope(1, "register", ALICE_JOB, "cnn", 0, 1.0, _spec_payload())
        path = as_user(ALICE, lambda: security.drop_report(base / "inbox", security.sign(env)))
        assert (
            oct(path.parent.stat().st_mode & 0o777) == "0o700" and path.stat().st_uid == uids[ALICE]
        )
        assert inbox.drain() == DrainResult(accepted=1)
        with store.transaction() as tx:
            job = tx.job_by_slurm_id(ALICE_JOB)
        assert job is not None and job.owner_uid == uids[ALICE] and job.spec == spec()
    finally:
        shutil.rmtree(base)
