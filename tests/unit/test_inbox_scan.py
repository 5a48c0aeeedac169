"""Which entries of a job folder a scan keeps (icefrog_slurm.store.inbox_files.scan), and
a folder grown past that bound while the controller was away, drained in order: the store
on SQLite, a stand-in for munge (the credential is the body's digest) and for Slurm."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.store import inbox_files, ledger
from icefrog_slurm.store.inbox import DrainResult, ReportInbox
from tests.integration.store.helpers import spec
from tests.support.trusting_inbox import signed, trusting_inbox

JOB = "4242"


def _report(kind: str, seq: int, payload: dict[str, Any]) -> bytes:
    return signed(JOB, kind, seq, payload).encode()


def _progress(seq: int) -> bytes:
    payload = {"epoch": seq, "samples_done": 5 * seq, "effective_samples_done": 4.5 * seq}
    return _report("progress", seq, payload)


def _shuffled(n: int) -> list[int]:
    """1..n in an order no file system lists by seq (nor by name: "10-" before "9-")."""
    seqs = list(range(1, n + 1))
    random.Random(7).shuffle(seqs)
    return seqs


@pytest.fixture
def inbox(tmp_path: Path) -> Iterator[ReportInbox]:
    with trusting_inbox(tmp_path, max_reports=1000, max_reports_per_owner=15) as box:
        yield box


def test_a_scan_keeps_the_lowest_seqs_of_a_folder_and_its_junk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of a folder of more entries than the bound (lowered to 10), the scan keeps the ten
    a drain reads first: its junk (names that are no ``<seq>-<kind>.json``), then the
    lowest seqs; whatever the folder's own order. A fresh dot file is not kept, a stale
    one is junk. Another owner's folder of the same job keeps its own ten."""
    monkeypatch.setattr(inbox_files, "MAX_FOLDER_ENTRIES", 10)
    inbox, other = tmp_path / JOB, tmp_path / f"{JOB}.{'ab' * 8}"
    for folder in (inbox, other):
        folder.mkdir()
        for seq in _shuffled(40):
            (folder / f"{seq}-progress.json").write_bytes(b"{}")
    for junk in ("notes.txt", "7-progress.json.bak", "-1-x.json"):
        (inbox / junk).write_bytes(b"")
    stale = inbox / ".2-progress.json.9.tmp"
    stale.write_bytes(b"")
    os.utime(stale, (4e9, 4e9))  # dated ahead (touch -d): its last change is what counts
    stale_before = stale.stat().st_ctime + 0.001
    time.sleep(0.05)
    (inbox / ".1-progress.json.9.tmp").write_bytes(b"")  # being written
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = inbox_files.scan(fd, stale_before=stale_before)
    finally:
        os.close(fd)
    kept = {f.name: sorted(i.name for i in found.items if i.folder == f) for f in found.folders}
    assert kept[JOB] == sorted(
        ["-1-x.json", ".2-progress.json.9.tmp", "7-progress.json.bak", "notes.txt"]
        + [f"{seq}-progress.json" for seq in range(1, 6)]
    )  # 10 taken: 5 junk (the fresh dot file among them, then left out), seqs 1 to 5
    assert kept[other.name] == sorted(f"{seq}-progress.json" for seq in range(1, 11))


def test_more_reports_than_a_scan_keeps_are_all_accepted_in_order(
    inbox: ReportInbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder of 100 honest reports (the scan's bound lowered to 40, the ledger's kept
    window to 8, a drain taking 15 of an owner: as 12,000 reports against 10,000, 1,024
    and 1,000): drained over several drains, every one is accepted, in seq order, none
    refused as a replay (before, the first 40 in the folder's own order were kept, and a
    lower seq read later fell below the ledger's window)."""
    monkeypatch.setattr(inbox_files, "MAX_FOLDER_ENTRIES", 40)
    monkeypatch.setattr(ledger, "KEPT_REPORTS", 8)
    folder = inbox.inbox_dir / JOB
    folder.mkdir()
    register = json.loads(json.dumps(dataclasses.asdict(spec())))
    (folder / "0-register.json").write_bytes(_report("register", 0, register))
    assert inbox.drain() == DrainResult(accepted=1)
    for seq in _shuffled(100):
        (folder / f"{seq}-progress.json").write_bytes(_progress(seq))
    results = []
    while any(folder.iterdir()) and len(results) < 20:
        results.append(inbox.drain())
    assert len(results) == 7 and sum(r.accepted for r in results) == 100
    assert all(r == DrainResult(accepted=r.accepted) for r in results), results
    archived = sorted(
        (inbox.archive_dir / "accepted" / JOB).iterdir(),
        key=lambda p: int(p.name.split("-")[1]),  # <now>-<ns>-<name>: the order of the drain
    )
    assert [int(p.name.split("-")[2]) for p in archived] == list(range(101))
    with inbox.store.transaction() as tx:
        assert tx.rejected_reports() == []
