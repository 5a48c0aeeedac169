"""Poison pills in a real inbox: files and names that used to halt every drain, for good.

Each pill is put into the inbox as a hostile user would (icefrog-alice, in her own job's
folder or at the top of the inbox), next to honest reports of Alice and Bob signed by real
munge. One drain must finish, reject every pill with a printable reason (archived if it
is a plain file of a job folder, deleted otherwise), and accept the honest reports into the
store (SQLite and Postgres: a value that fits one
database and not the other is a pill too).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.store.inbox import DrainResult
from icefrog_slurm.store.sql import SqlStore
from tests.security.inbox_support import METRIC, Site, make_site
from tests.support.munge import USERS

ALICE, BOB = USERS
ALICE_JOB, BOB_JOB = "101", "202"


@pytest.fixture
def site(store: SqlStore, tmp_path: Path, munge_users: dict[str, int]) -> Site:
    return make_site(store, tmp_path, munge_users)


def _report_with(site: Site, seq: int, mutate: Callable[[dict], str]) -> bytes:  # type: ignore[type-arg]
    """Alice's honest metric report (real credential), its JSON text then changed."""
    env = site.envelope(ALICE, "metric", METRIC, seq=seq, job=ALICE_JOB, name="cnn")
    return mutate(json.loads(env.to_json())).encode()


def _value(text: str) -> Callable[[dict], str]:  # type: ignore[type-arg]
    """The payload's ``value`` replaced by raw JSON text."""

    def mutate(doc: dict) -> str:  # type: ignore[type-arg]
        doc["payload"]["value"] = "@@"
        return json.dumps(doc).replace('"@@"', text)

    return mutate


def _field(key: str, text: str, *, payload: bool = False) -> Callable[[dict], str]:  # type: ignore[type-arg]
    def mutate(doc: dict) -> str:  # type: ignore[type-arg]
        (doc["payload"] if payload else doc)[key] = "@@"
        return json.dumps(doc).replace('"@@"', text)

    return mutate


# file name in Alice's folder -> (how the document is made, what the reason must say)
DOCUMENT_PILLS: dict[str, tuple[Callable[[dict], str], str]] = {  # type: ignore[type-arg]
    "2-metric.json": (_value("[" * 100_000 + "]" * 100_000), "nested deeper than"),
    "3-metric.json": (_value("1" * 5000), "out of the 64-bit range"),
    "4-metric.json": (_field("seq", str(2**63)), "out of the 64-bit range"),
    "5-metric.json": (_field("epoch", str(2**31), payload=True), "epoch: must be <="),
    "6-metric.json": (_value("NaN"), "NaN is not a JSON number"),
    "7-metric.json": (_field("name", '"\\ud800"', payload=True), "lone surrogate"),
    "8-metric.json": (_field("name", '"a\\u0000b"', payload=True), "NUL"),
    "9-metric.json": (_field("job_name", '"\\u001b[2J"'), "control character"),
}


def _binary_payload_credential(site: Site) -> bytes:
    """A real credential of Alice whose signed payload is not UTF-8 (munge -s <bytes>)."""
    cred = (
        subprocess.run(
            ["runuser", "-u", ALICE, "--", "munge", "-s", b"\xff\xfe\x1bx"],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    env = site.envelope(ALICE, "metric", METRIC, seq=10, job=ALICE_JOB, name="cnn")
    doc = json.loads(env.to_json())
    doc["credential"] = cred
    return json.dumps(doc).encode()


def test_poison_pills_are_quarantined_and_honest_reports_still_land(site: Site) -> None:
    site.register(ALICE, ALICE_JOB)
    site.register(BOB, BOB_JOB, name="bobs")
    site.drop(ALICE, "metric", METRIC, seq=1, job=ALICE_JOB)
    for name, (mutate, _) in DOCUMENT_PILLS.items():
        site.put(ALICE, ALICE_JOB, name, _report_with(site, int(name.split("-")[0]), mutate))
    site.put(ALICE, ALICE_JOB, "10-metric.json", _binary_payload_credential(site))
    site.put(ALICE, ALICE_JOB, "\u00b2-metric.json", b"{}")  # '²'.isdigit() is True
    site.put(ALICE, ALICE_JOB, b"\xff\xfe-metric.json", b"{}")  # not UTF-8
    site.put(ALICE, ALICE_JOB, "11-metric.json\n", b"{}")  # '$' would match before \n
    os.mkfifo(site.inbox_dir / ALICE_JOB / "12-metric.json")
    site.put(ALICE, "\u00b2", "1-metric.json", b"{}")  # a folder named '²'
    site.put(ALICE, b"\xff1", "1-metric.json", b"{}")  # a folder name that is not UTF-8
    (site.inbox_dir / "303").symlink_to("/etc")  # a "job folder" that is a symlink
    (site.inbox_dir / "404").write_bytes(b"")  # ... and one that is a file

    result = site.drain()

    pills = len(DOCUMENT_PILLS) + 9
    assert result == DrainResult(accepted=3, rejected=pills)
    alice, bob = site.job(ALICE_JOB), site.job(BOB_JOB)
    assert alice is not None and alice.owner_uid == site.uids[ALICE]
    assert bob is not None and bob.name == "bobs"
    assert site.metrics(ALICE_JOB) == [0.5]
    assert site.left_in_inbox() == []
    # the FIFO and the four entries that are no job folder are deleted, not archived
    assert site.archived("rejected") == pills - 5 and site.archived("accepted") == 3
    assert sorted(os.listdir(site.root / "archive" / "rejected")) == [ALICE_JOB]
    reasons = dict(zip(site.rejected_files(), site.reasons(), strict=True))
    assert all(r.isprintable() and f.isprintable() for f, r in reasons.items())
    for name, (_, fragment) in DOCUMENT_PILLS.items():
        assert fragment in reasons[f"{ALICE_JOB}/{name}"], name
    assert "digest mismatch" in reasons[f"{ALICE_JOB}/10-metric.json"]
    for name in ("\u00b2-metric.json", "\\udcff\\udcfe-metric.json", "11-metric.json\\x0a"):
        assert "is not <seq>-<kind>.json" in reasons[f"{ALICE_JOB}/{name}"], name
    assert "not a plain file" in reasons[f"{ALICE_JOB}/12-metric.json"]
    for junk in ("\u00b2", "\\udcff1", "303", "404"):
        assert "not a job folder" in reasons[junk], junk
    assert Path("/etc/passwd").is_file()
    assert site.drain() == DrainResult()  # nothing is read twice


def test_a_fault_outside_the_reports_reach_is_quarantined_too(site: Site) -> None:
    """The catch-all: an error no check foresaw (here a decoder that breaks) rejects that
    report with the error's name, and the drain goes on to the next."""
    site.register(ALICE, ALICE_JOB)
    assert site.drain() == DrainResult(accepted=1)
    decode = site.inbox.decode

    def broken_once(credential: str):  # type: ignore[no-untyped-def]
        site.inbox.decode = decode
        raise RecursionError("maximum recursion depth exceeded \x00\ud800")

    site.inbox.decode = broken_once
    site.drop(ALICE, "metric", METRIC, seq=1, job=ALICE_JOB)
    site.drop(ALICE, "metric", {**METRIC, "epoch": 2, "value": 0.7}, seq=2, job=ALICE_JOB)
    assert site.drain() == DrainResult(accepted=1, rejected=1)
    (reason,) = site.reasons()
    assert "RecursionError" in reason and reason.isprintable() and "\\x00" in reason
    assert site.metrics(ALICE_JOB) == [0.7] and site.left_in_inbox() == []


def test_one_jobs_flood_of_rows_is_bounded_and_others_still_land(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob sends more profile samples and metric epochs for his own job than the store
    keeps of a job (bounds lowered here: 10 and 3): the reports past them are rejected with
    the reason, the rows stop growing (every round reads them), and Alice's reports land.
    Of his gradient statistics, sent for epochs going up and then down (each up to 190 KB),
    the store keeps those within KEPT_GRAD_EPOCHS (2 here) of the latest, which the round
    reads."""
    from dataclasses import asdict

    from icefrog_slurm.core.samples import ProfileSample
    from icefrog_slurm.store import inbox_apply, tx

    monkeypatch.setattr(inbox_apply, "KEPT_A_JOB", {"profile": 10, "metric": 3})
    monkeypatch.setattr(tx, "KEPT_GRAD_EPOCHS", 2)
    site.register(ALICE, ALICE_JOB)
    site.register(BOB, BOB_JOB, name="bobs")
    assert site.drain() == DrainResult(accepted=2)
    sample = asdict(ProfileSample(1, 32, 0, False, 0.0, 0.0, 0.0, 0.1, 320.0, 1e9, 0.5))
    for seq in (1, 2, 3):  # 4 + 4 samples fit, the third report's 4 would pass 10
        site.drop(BOB, "profile", {"samples": [sample] * 4}, seq=seq, job=BOB_JOB, name="bobs")
    for seq in range(4, 9):  # 3 metric epochs fit, 2 more do not
        site.drop(BOB, "metric", {**METRIC, "epoch": seq}, seq=seq, job=BOB_JOB, name="bobs")
    grad = {"frozen": 0, "grad_var": [1.0] * 4, "grad_sqr": [1.0] * 4}
    epochs = (9, 10, 11, 500, 400, 300, 499)
    for seq, epoch in enumerate(epochs, start=9):
        site.drop(BOB, "grad_stats", {**grad, "epoch": epoch}, seq=seq, job=BOB_JOB, name="bobs")
    site.drop(ALICE, "metric", METRIC, seq=1, job=ALICE_JOB)
    assert site.drain() == DrainResult(accepted=2 + 3 + len(epochs) + 1, rejected=1 + 2)
    [bob] = [v for v in site.inbox.store.snapshot().jobs if v.job.slurm_job_id == BOB_JOB]
    assert (len(bob.samples), len(bob.metrics)) == (8, 3)
    assert bob.grad_stats is not None and bob.grad_stats.epoch == 500
    with site.inbox.store.transaction() as store_tx:
        assert store_tx.kept_rows(job_id=bob.job.id, kind="grad_stats") == 2  # 499 and 500
    assert sum("the 10 a job may keep" in r for r in site.reasons()) == 1
    assert site.metrics(ALICE_JOB) == [0.5]


def test_a_job_reporting_for_ever_keeps_a_bounded_ledger(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's job sends progress reports without end (by hand, held pending for months: each
    drain takes up to his per-owner share). The ledger keeps his Slurm job's latest
    KEPT_REPORTS (3 here) alone; a report older than those, replayed or made anew, is
    rejected with the reason and rolls nothing back; Alice's job keeps its own rows."""
    from icefrog_slurm.store import ledger

    monkeypatch.setattr(ledger, "KEPT_REPORTS", 3)
    site.register(ALICE, ALICE_JOB)
    site.register(BOB, BOB_JOB, name="bobs")
    site.drop(ALICE, "metric", METRIC, seq=1, job=ALICE_JOB)
    assert site.drain() == DrainResult(accepted=3)

    def progress(epoch: int) -> dict[str, Any]:
        return {"epoch": epoch, "samples_done": 10 * epoch, "effective_samples_done": 9.0}

    for seq in range(1, 9):
        site.drop(BOB, "progress", progress(seq), seq=seq, job=BOB_JOB, name="bobs")
        assert site.drain() == DrainResult(accepted=1)
    bob, alice = site.job(BOB_JOB), site.job(ALICE_JOB)
    assert bob is not None and alice is not None
    with site.inbox.store.transaction() as tx:
        assert tx.accepted_count(job_id=bob.id) == 3  # seq 6, 7 and 8 of 9 accepted
        assert tx.accepted_count(job_id=alice.id) == 2
    site.drop(BOB, "progress", progress(2), seq=2, job=BOB_JOB, name="bobs")  # anew
    site.drop(BOB, "progress", progress(7), seq=7, job=BOB_JOB, name="bobs")  # kept: a duplicate
    assert site.drain() == DrainResult(rejected=1, duplicates=1)
    assert "older than the reports of it the ledger keeps (seq 6 on)" in site.reasons()[-1]
    assert site.job(BOB_JOB).progress.epoch == 8  # type: ignore[union-attr]


def test_a_read_fault_of_the_reader_defers_a_report_instead_of_rejecting_it(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller runs out of file descriptors (EMFILE) just as it opens one of Alice's
    reports: no file of hers caused it, so the report waits for the next drain, which takes
    it; a file a user can make unreadable (a symlink) is still rejected."""
    import errno

    site.register(ALICE, ALICE_JOB)
    assert site.drain() == DrainResult(accepted=1)
    for seq in (1, 2):
        site.drop(ALICE, "metric", {**METRIC, "epoch": seq}, seq=seq, job=ALICE_JOB)
    (site.inbox_dir / ALICE_JOB / "3-metric.json").symlink_to("/etc/passwd")
    real_open = os.open
    faults: list[str] = []

    def out_of_descriptors(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "1-metric.json" and not faults:
            faults.append(path)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", out_of_descriptors)  # what inbox_files.read_report calls
    assert site.drain() == DrainResult(accepted=1, rejected=1, deferred=1)
    assert faults and [r for r in site.reasons() if "not a plain file" in r]  # the symlink
    assert site.drain() == DrainResult(accepted=1)
    assert site.metrics(ALICE_JOB) == [0.5, 0.5] and site.left_in_inbox() == []
