"""Checkpoint saves that fail or are killed leave no files behind, and the previous good
checkpoint still loads. The faults are real where they can be: a file-size limit makes the
kernel refuse the write (EFBIG, as a full disk refuses with ENOSPC), and SIGKILL kills a
save between its write and its rename."""

from __future__ import annotations

import errno
import multiprocessing
import os
import resource
import signal
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from icefrog_launcher import checkpoint  # noqa: E402


def _state(size: int) -> dict[str, Any]:
    return {"weights": torch.zeros(size), "epoch": 3}


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _save_with_file_size_limit(folder: str, limit: int) -> None:
    """In a child: a save refused by the kernel once a file passes ``limit`` bytes."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        checkpoint.save(folder, 1, _state(100_000))
    except OSError as exc:
        os._exit(10 if exc.errno == errno.EFBIG else 11)
    os._exit(0)


def _save_killed_before_rename(folder: str) -> None:
    """In a child: a save killed after writing its temp file, before the rename."""

    def die(fd: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    os.fsync = die  # (only in this child)
    checkpoint.save(folder, 1, _state(1000))


def _run(target: Any, *args: Any) -> int:
    """``target(*args)`` in a fresh interpreter (spawn: a fork after torch ran a parallel
    op in this process can hang the child in OpenMP); its exit code."""
    child = multiprocessing.get_context("spawn").Process(target=target, args=args)
    child.start()
    child.join(60)
    assert child.exitcode is not None
    return child.exitcode


def test_a_save_refused_for_space_leaves_nothing_and_the_old_checkpoint(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 0, _state(10))
    before = _names(tmp_path)
    assert _run(_save_with_file_size_limit, str(tmp_path), 64 * 1024) == 10  # EFBIG seen
    assert _names(tmp_path) == before  # no temp file, no .pt without a manifest
    found = checkpoint.load_latest(tmp_path)
    assert found is not None and found[0] == 0


def test_a_failed_manifest_removes_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save(tmp_path, 0, _state(10))
    before = _names(tmp_path)
    real = checkpoint.write_atomic

    def manifest_fails(path: Path, data: bytes, **kw: Any) -> None:
        if path.suffix == ".json":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, **kw)

    monkeypatch.setattr(checkpoint, "write_atomic", manifest_fails)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(tmp_path, 1, _state(10))
    assert _names(tmp_path) == before
    assert checkpoint.latest_number(tmp_path) == 0


def test_a_killed_saves_temp_file_is_removed_by_the_next_save(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 0, _state(10))
    assert _run(_save_killed_before_rename, str(tmp_path)) == -signal.SIGKILL
    leftovers = [n for n in _names(tmp_path) if n.startswith(".")]
    assert leftovers, "the killed save left its temp file (the case to clean up)"
    checkpoint.save(tmp_path, 1, _state(10))
    assert [n for n in _names(tmp_path) if n.startswith(".")] == []
    assert _names(tmp_path) == ["ckpt-00000000.json", "ckpt-00000000.pt", "ckpt-00000001.json",
                                "ckpt-00000001.pt"]  # fmt: skip
