"""Which entries of an owner's job folders a scan keeps (``inbox_files.scan``), and a
folder grown past that bound while the controller was away, drained in order: the store on
SQLite, a stand-in for munge (the credential is the body's digest) and for Slurm."""

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


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a folder to another uid")
def test_a_scan_keeps_the_lowest_seqs_of_an_owner_and_his_junk(tmp_path: Path) -> None:
    """Of an owner's folders of more entries than a drain reads of him (10 here), the scan
    keeps the ten a drain reads first: his junk (names that are no
    ``<seq>-<kind>.json``), then the lowest seqs of the job across its folders; whatever
    the folders' own order. A fresh dot file is not kept, a stale one is junk. Another
    owner's folder of the same job keeps its own ten."""
    inbox, second = tmp_path / JOB, tmp_path / f"{JOB}.{'ef' * 8}"
    other = tmp_path / f"{JOB}.{'ab' * 8}"
    for folder in (inbox, second, other):
        folder.mkdir()
        for seq in _shuffled(40):
            (folder / f"{seq}-progress.json").write_bytes(b"{}")
    os.chown(other, 65534, 65534)
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
        found = inbox_files.scan(fd, stale_before=stale_before, per_owner=10)
    finally:
        os.close(fd)
    kept = {f.name: sorted(i.name for i in found.items if i.folder == f) for f in found.folders}
    assert kept[JOB] == sorted(
        ["-1-x.json", ".2-progress.json.9.tmp", "7-progress.json.bak", "notes.txt"]
        + [f"{seq}-progress.json" for seq in range(1, 4)]
    )  # of ten: his four junk, the job's seqs 1 to 3 of each of his two folders
    assert kept[second.name] == sorted(f"{seq}-progress.json" for seq in range(1, 4))
    assert kept[other.name] == sorted(f"{seq}-progress.json" for seq in range(1, 11))


def test_more_reports_than_a_scan_keeps_are_all_accepted_in_order(
    inbox: ReportInbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder of 100 honest reports (the ledger's kept window lowered to 8, a drain and a
    scan taking 15 of an owner: as 12,000 reports against 1,024 and 1,000): drained over
    several drains, every one is accepted, in seq order, none refused as a replay (a scan
    that kept the first in the folder's own order read a lower seq later, below the
    ledger's window)."""
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


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid")
def test_a_scan_holds_no_more_of_an_owner_than_a_drain_reads_of_him(
    inbox: ReportInbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody's 30 job folders of 300 report names each (hard links of one file: no
    inodes), 9000 entries a scan kept (10,000 a folder, 10,000 folders: 10^8 kept and then
    sorted, 2 million took 745 MiB and 14-18 s a drain); a scan keeps 15 of his, those a
    drain reads first (the lowest job, its lowest seqs), and only those are ordered."""
    for n in range(30):
        folder = inbox.inbox_dir / f"{100 + n}.{'cd' * 8}"
        folder.mkdir(mode=0o700)
        seed = folder / "0-progress.json"
        seed.write_bytes(b"{}")
        for seq in range(1, 300):
            os.link(seed, folder / f"{seq}-progress.json")
        os.chown(seed, 65534, 65534)
        os.chown(folder, 65534, 65534)
    ordered: list[int] = []
    fair_order = inbox_files.fair_order

    def counting(items: Any, **kwargs: int) -> list[inbox_files.Item]:
        ordered.append(len(items))
        return fair_order(items, **kwargs)

    monkeypatch.setattr(inbox_files, "fair_order", counting)
    assert inbox.drain() == DrainResult(rejected=15)  # hard links: rejected
    assert ordered == [15]
    with inbox.store.transaction() as tx:
        read = [r.file for r in tx.rejected_reports()]
    assert read == [f"100.{'cd' * 8}/{seq}-progress.json" for seq in range(15)]
