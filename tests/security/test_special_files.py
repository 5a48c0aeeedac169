"""A FIFO, a device or a socket where a command reads a file the user names.

Opening a FIFO for reading waits until someone opens it for writing: a report command
(``--config``), or any command reading a user's file through ``icefrog_slurm/userfiles.py``
(settings, workloads, JSON), would hang for ever on one, and ``/dev/zero`` would be read up
to the size limit. Each is refused at once with one line and exit code 2, also when the
FIFO is put at the path after a look at it (the check is made on the opened descriptor).
Each command runs as a real process under a timeout: a hang fails the test, it does not
block the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from icefrog_slurm.errors import InputError
from icefrog_slurm.settings import load_settings
from icefrog_slurm.userfiles import read_bytes

WAIT_S = 20  # far above the fraction of a second a refusal takes


def icefrog(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "icefrog_slurm", *args],
            capture_output=True, text=True, timeout=WAIT_S, cwd=cwd, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"icefrog {' '.join(args)} still waits after {WAIT_S} s")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "icefrog.toml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["squeue", "--config", "{f}"],
        ["sacct", "--config", "{f}"],
        ["show", "job", "1", "--config", "{f}"],
        ["controller", "--check", "--config", "{f}"],
        ["db", "current", "--config", "{f}"],
        ["tune", "{f}"],
    ],
    ids=["squeue", "sacct", "show", "controller-check", "db", "tune"],
)
def test_a_fifo_named_as_a_file_is_refused_at_once(
    fifo: Path, tmp_path: Path, argv: list[str]
) -> None:
    done = icefrog(*(a.replace("{f}", str(fifo)) for a in argv), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not a plain file" in done.stderr, done.stderr


def test_a_device_is_refused_not_read_to_the_limit(tmp_path: Path) -> None:
    done = icefrog("squeue", "--config", "/dev/zero", cwd=tmp_path)
    assert done.returncode == 2 and "/dev/zero: not a plain file" in done.stderr, done.stderr


def test_the_check_is_on_the_descriptor_not_on_a_look_before(fifo: Path, tmp_path: Path) -> None:
    """What the reader gets when the FIFO arrives after any stat() a caller made: the open
    does not wait and the descriptor is refused (in this process: a hang would stop the
    test run, so it is bounded by the test's timeout)."""
    with pytest.raises(InputError, match=r"icefrog\.toml: not a plain file"):
        read_bytes(fifo, limit=1024, kind="settings file")
    with pytest.raises(InputError, match="not a plain file"):
        load_settings(fifo)
    sock_path = tmp_path / "s.toml"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(InputError, match=r"s\.toml: cannot read"):
            read_bytes(sock_path, limit=1024, kind="settings file")


def test_a_plain_file_and_a_folder_still_read_as_before(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[slurm]\npartition = "gpu"\n')
    assert load_settings(good).slurm.partition == "gpu"
    with pytest.raises(InputError, match="is a folder, not a settings file"):
        load_settings(tmp_path)
