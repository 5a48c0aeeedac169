"""How a drain reads the inbox (icefrog_slurm.store.inbox): a report file is opened only
once it is known to be a plain file, never as a controlling terminal; and a drain asks
Slurm once, however many job folders it looks up (each call is a whole ``squeue --json``,
and it asked once per 1000 ids). The store on SQLite, munge and Slurm played."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.store import inbox as inbox_module
from icefrog_slurm.store.inbox import DrainResult, SlurmJobFacts
from tests.support.trusting_inbox import trusting_inbox

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a device node and gives it away")
def test_a_device_named_as_a_report_is_never_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody's character device (as a hard link to one would be) named ``1-progress.json``
    in his job folder: rejected from its ``lstat``; opening a device can act (a tape
    rewinds, a terminal becomes the daemon's). A report is opened with ``O_NOCTTY``."""
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def recording(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if kwargs.get("dir_fd") is not None:
            opened.append((str(path), flags))
        return real_open(path, flags, *args, **kwargs)

    with trusting_inbox(tmp_path, owner=NOBODY) as box:
        folder = box.inbox_dir / "101"
        folder.mkdir(mode=0o700)
        os.mknod(folder / "1-progress.json", 0o600 | 0o020000, os.makedev(1, 3))  # /dev/null
        (folder / "2-progress.json").write_bytes(b"{not json")
        for path in (folder, *folder.iterdir()):
            os.chown(path, NOBODY, NOBODY)
        monkeypatch.setattr(os, "open", recording)
        assert box.drain() == DrainResult(rejected=2)
        with box.store.transaction() as tx:
            reasons = {r.file: r.reason for r in tx.rejected_reports()}
    assert reasons["101/1-progress.json"] == "not a plain file with one link"
    reports = [(name, flags) for name, flags in opened if name.endswith(".json")]
    assert [name for name, _ in reports] == ["2-progress.json"], reports
    assert all(flags & os.O_NOCTTY and flags & os.O_NONBLOCK for _, flags in reports)


def test_a_drain_asks_slurm_once_however_many_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2500 idle job folders looked up in one drain (the window raised from 1000)."""
    monkeypatch.setattr(inbox_module, "_IDLE_FOLDERS_A_DRAIN", 3000)
    calls: list[int] = []
    with trusting_inbox(tmp_path) as box:
        for n in range(2500):
            (box.inbox_dir / str(100 + n)).mkdir()

        def lookup(ids: Collection[str]) -> dict[str, SlurmJobFacts]:
            calls.append(len(ids))
            return {i: SlurmJobFacts(uid=0, icefrog=True) for i in ids}

        box.slurm_jobs = lookup
        assert box.drain() == DrainResult()
    assert calls == [2500]
