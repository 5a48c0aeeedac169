"""A report whose reader leaves (``icefrog squeue | head -1``) ends quietly.

Each command runs as a real process writing into a pipe: one whose reading end is closed
before the command starts (so its first write fails with EPIPE), and ``squeue -i``, read for
one line and then left. Each must end at once with exit code 141 (what a shell shows for a
tool SIGPIPE ended, as Slurm's own squeue) and write no traceback (``cli.main`` points
stdout at /dev/null, as Python's documentation recommends, so the interpreter's last flush
cannot fail again).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from icefrog_slurm.cli import SIGPIPE_EXIT
from icefrog_slurm.store.sql import SqlStore
from tests.integration.report.populate import populate

WAIT_S = 30


@pytest.fixture
def db(tmp_path: Path, sqlite_template: Path) -> list[str]:
    path = tmp_path / "icefrog.db"
    shutil.copyfile(sqlite_template, path)
    store = SqlStore(f"sqlite:///{path}")
    try:
        populate(store)
    finally:
        store.close()
    return ["--db", f"sqlite:///{path}"]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "icefrog_slurm", *args]


@pytest.mark.parametrize(
    "argv",
    [
        ["squeue", "-t", "all"],
        ["squeue", "--json"],
        ["sacct", "-S", "2026-01-01"],
        ["sacct", "-e"],
        ["show", "job", "1"],
    ],
    ids=["squeue", "squeue-json", "sacct", "sacct-helpformat", "show"],
)
def test_a_reader_that_left_before_the_first_line(
    db: list[str], argv: list[str], tmp_path: Path
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            _command(*argv, *db), stdout=write_end, stderr=subprocess.PIPE, text=True,
            timeout=WAIT_S, cwd=tmp_path,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.returncode == SIGPIPE_EXIT == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_squeue_iterate_ends_when_its_reader_leaves(db: list[str], tmp_path: Path) -> None:
    """``icefrog squeue -i 1 | head -1``: before, the loop went on writing into /dev/null
    for ever."""
    with subprocess.Popen(
        _command("squeue", "-i", "1", *db), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=tmp_path,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stderr is not None
            first = proc.stdout.readline()
            proc.stdout.close()  # head -1 exits
            code = proc.wait(timeout=WAIT_S)
            err = proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert first.strip()  # the time stamp line -i prints above each table
    assert code == 141, err
    assert "Traceback" not in err, err
