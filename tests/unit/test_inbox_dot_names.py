"""Dot names (files still being written) as a way to slow every drain (icefrog_slurm.store
.inbox_files.scan): nobody (uid 65534) fills his job folders with hard links of one file
under dot names, dated a century ahead (``touch -d``): never stale by their mtime, never
archived, so his folders never empty and each drain looked at every name of each of them
(10 million names: 67-97 s a drain, no log line). A dot file is stale by its ``st_ctime``
(no user can set it), and a drain looks at a bounded number of names of one owner's
folders, his folders in turns over the drains, with one log line. Run as root; the store
on SQLite, munge and Slurm played."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.store import inbox_files
from icefrog_slurm.store.inbox import DrainResult, ReportInbox, SlurmJobFacts
from tests.integration.store.helpers import spec
from tests.support.trusting_inbox import signed, trusting_inbox

JOB = "4242"
OWNER, NOBODY = 1000, 65534
LOOKS = 5000

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid")


@pytest.fixture
def box(tmp_path: Path) -> Iterator[ReportInbox]:
    """Job 4242 is OWNER's, every other job nobody's; credentials say OWNER."""
    with trusting_inbox(tmp_path, owner=OWNER) as box:
        box.slurm_jobs = lambda ids: {
            i: SlurmJobFacts(uid=OWNER if i == JOB else NOBODY, icefrog=True) for i in ids
        }
        box.clock = time.time
        yield box


def _put(path: Path, data: bytes, uid: int) -> None:
    path.write_bytes(data)
    os.chown(path, uid, uid)


def _folder(path: Path, uid: int) -> Path:
    path.mkdir(mode=0o700)
    os.chown(path, uid, uid)
    return path


def _dot_names(folder: Path, count: int) -> None:
    """``count`` dot names in ``folder``, hard links of one file of nobody's dated 2096."""
    seed = folder / ".seed"
    _put(seed, b"", NOBODY)
    os.utime(seed, (4e9, 4e9))
    for i in range(count - 1):
        os.link(seed, folder / f".{i}-progress.json.tmp")


def _register() -> bytes:
    payload: Any = json.loads(json.dumps(dataclasses.asdict(spec())))
    return signed(JOB, "register", 0, payload).encode()


def _dot_lstats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The dot names a drain looks at (``lstat`` in a folder), as they are looked at."""
    seen: list[str] = []
    real = os.stat

    def counting(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if kwargs.get("dir_fd") is not None and str(path).startswith("."):
            seen.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting)
    return seen


def test_a_dot_file_dated_ahead_is_stale_by_when_it_last_changed(box: ReportInbox) -> None:
    """Left behind longer than the grace, it is junk of its folder, whatever its mtime."""
    folder = _folder(box.inbox_dir / f"77.{'ab' * 8}", NOBODY)
    _put(folder / ".1-progress.json.tmp", b"x", NOBODY)
    os.utime(folder / ".1-progress.json.tmp", (4e9, 4e9))  # touch -d 2096
    assert box.drain() == DrainResult()  # being written: left alone
    box.clock = lambda: time.time() + 2 * box.folder_grace_s
    assert box.drain() == DrainResult(rejected=1)
    assert os.listdir(folder) == []


def test_an_owners_mass_of_dot_names_costs_a_drain_a_bounded_look_in_turns(
    box: ReportInbox, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Twenty folders of nobody's, each of 400 dot names and one report of his that fails
    to parse; at most LOOKS looks (a folder opened, a name listed, a dot name looked at) a
    drain into his folders: each drain reads the reports of the folders it got to, logs
    the bound once, and the next starts after them; the honest owner's report is read at
    the first drain."""
    monkeypatch.setattr(inbox_files, "MAX_OWNER_LOOKS", LOOKS, raising=False)
    for n in range(20):
        folder = _folder(box.inbox_dir / f"{100 + n}.{'cd' * 8}", NOBODY)
        _dot_names(folder, 400)
        _put(folder / "1-progress.json", b"{not json", NOBODY)
    _put(_folder(box.inbox_dir / JOB, OWNER) / "0-register.json", _register(), OWNER)
    looked = _dot_lstats(monkeypatch)
    results = []
    for _ in range(6):
        looked.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="icefrog_slurm.store.inbox_files"):
            results.append(box.drain())
        assert len(looked) < LOOKS, len(looked)
        lines = [r.getMessage() for r in caplog.records]
        (bounded,) = [line for line in lines if "hold more than a drain looks at" in line]
        assert f"uid {NOBODY}" in bounded
    assert results[0].accepted == 1  # the honest register, at once
    rejected = [r.rejected for r in results]  # a folder takes about 800 looks: 6 a drain,
    assert rejected[0] in (6, 7) and rejected[1] in (6, 7), rejected  # a 7th in part
    assert sum(rejected) == 20, rejected  # the second drain did not start over: turns
    assert sum(len(os.listdir(box.inbox_dir / f"{100 + n}.{'cd' * 8}")) for n in range(20)) == (
        20 * 400
    )  # the dot names are being written: left alone
