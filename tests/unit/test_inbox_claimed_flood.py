"""A squatter's mass of claimed folders (icefrog_slurm.store.inbox): nobody (uid 65534)
makes thousands of ``<job id>.<token>`` folders of another user's job, each drain must log
no more of them than of anyone's rejected reports, and the folders must be gone after one
drain, also when they hold dot files dated ahead (which a drain never reads). Run as root
(the folders are given to uid 65534); the store on SQLite, munge and Slurm played."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from icefrog_slurm.store import inbox as inbox_module
from icefrog_slurm.store.inbox import DrainResult
from tests.support.trusting_inbox import trusting_inbox

JOB = "4242"
OWNER, NOBODY = 1000, 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid")


def _as_nobody(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def test_a_squatters_thousands_of_folders_neither_flood_the_log_nor_stay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1000 claimed folders with a junk file and a dot file dated a century ahead, and 1000
    empty ones: one drain logs the squatter's first LOGGED_REJECTIONS lines and one summary
    (it logged a line per folder, 2000 a drain), archives each junk file it read as
    rejected and deletes every folder whole (those with a dot file stayed, and were logged
    again at every drain; then they were moved whole into the archive)."""
    with trusting_inbox(tmp_path, owner=OWNER) as box:
        for i in range(2000):
            folder = box.inbox_dir / f"{JOB}.{i:016x}"
            folder.mkdir(mode=0o700)
            _as_nobody(folder)
            if i < 1000:
                for name in ("junk", ".hidden"):
                    (folder / name).write_bytes(b"x")
                    _as_nobody(folder / name)
                os.utime(folder / ".hidden", (4e9, 4e9))
        for _ in range(2):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="icefrog_slurm.store.inbox"):
                box.drain()
            lines = [r.getMessage() for r in caplog.records]
            assert len(lines) <= inbox_module.LOGGED_REJECTIONS + 1, len(lines)
            assert os.listdir(box.inbox_dir) == []
        archived = list((box.archive_dir / "rejected" / JOB).iterdir())
        assert len(archived) == 1000 and all(p.name.endswith("-junk") for p in archived)


def test_squatter_lines_and_rejections_share_one_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Five claimed folders, each with a junk file, logged with LOGGED_REJECTIONS at 3: the
    first three lines one by one, then one line counting the other seven (5 folders + 5
    rejected files) of uid 65534."""
    with trusting_inbox(tmp_path, owner=OWNER) as box:
        for i in range(5):
            folder = box.inbox_dir / f"{JOB}.{i:016x}"
            folder.mkdir(mode=0o700)
            (folder / "junk").write_bytes(b"x")
            _as_nobody(folder / "junk")
            _as_nobody(folder)
        with (
            pytest.MonkeyPatch.context() as mp,
            caplog.at_level(logging.WARNING, logger="icefrog_slurm.store.inbox"),
        ):
            mp.setattr(inbox_module, "LOGGED_REJECTIONS", 3)
            assert box.drain() == DrainResult(rejected=5)
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 4, lines
        assert f"held by uid {NOBODY}" in lines[0]
        assert f"7 more reports or claimed folders of uid {NOBODY} rejected" in lines[-1]
