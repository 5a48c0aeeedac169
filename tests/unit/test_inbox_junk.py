"""Junk of any size dropped in the inbox to fill the state filesystem: nobody (uid 65534)
drops a 1 GiB file at the top of the inbox, a 1 GiB "report", a FIFO, a link, a folder of
files in his job's folder, and a claimed folder of another user's job holding a 1 GiB dot
file. Each was moved into the root-only archive and kept ``retention_days``, out of its
owner's reach; now each is deleted (its name recorded as a rejection, as before) and only a
report-sized plain file a drain read is archived. The files are sparse: their size is what
counts. Run as root; the store on SQLite, munge and Slurm played."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from icefrog_slurm.store.inbox import DrainResult, SlurmJobFacts
from tests.support.trusting_inbox import trusting_inbox

NOBODY, OWNER = 65534, 1000
GIB = 1 << 30

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid")


def _nobodys(path: Path, size: int | None = None) -> Path:
    if size is not None:
        with open(path, "wb") as fh:
            fh.truncate(size)
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return path


def _archived(archive: Path) -> list[str]:
    """Every entry under ``archive``, its archived name's ``<time>-<ns>-`` left out."""
    return sorted(str(p.relative_to(archive)).split("-", 2)[-1] for p in archive.rglob("*"))


def test_junk_of_any_size_is_deleted_and_only_a_report_is_archived(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    with trusting_inbox(tmp_path, owner=NOBODY) as box:
        box.slurm_jobs = lambda ids: {
            i: SlurmJobFacts(uid=OWNER if i == "4242" else NOBODY, icefrog=True) for i in ids
        }
        inbox = box.inbox_dir
        _nobodys(inbox / "fill", GIB)
        mine = inbox / "101"
        mine.mkdir(mode=0o700)
        _nobodys(mine)
        _nobodys(mine / "1-progress.json", GIB)  # over MAX_REPORT_BYTES
        os.mkfifo(mine / "2-progress.json")
        _nobodys(mine / "2-progress.json")
        (mine / "3-progress.json").symlink_to(secret)
        _nobodys(mine / "3-progress.json")
        (mine / "4-progress.json").mkdir()
        _nobodys(_nobodys(mine / "4-progress.json") / "fill", GIB)
        (mine / "5-progress.json").write_bytes(b"{not json")  # a report: read, rejected
        _nobodys(mine / "5-progress.json")
        claimed = inbox / "4242"
        claimed.mkdir(mode=0o700)
        _nobodys(claimed)
        _nobodys(claimed / ".fill", GIB)  # never read: a file being written
        assert box.drain() == DrainResult(rejected=6)
        assert os.listdir(inbox) == ["101"] and os.listdir(mine) == []
        assert _archived(box.archive_dir) == ["5-progress.json", "accepted", "rejected",
                                              "rejected/101"]  # fmt: skip
        with box.store.transaction() as tx:
            recorded = sorted(r.file for r in tx.rejected_reports())
        assert recorded == ["101/1-progress.json", "101/2-progress.json", "101/3-progress.json",
                            "101/4-progress.json", "101/5-progress.json", "fill"]  # fmt: skip
    assert secret.read_text() == "root's\n"
