"""The job side of a sharing failure (icefrog_launcher.sharing): which errors are an
out-of-memory, what the guard writes and reports, and the spec a job registers with after."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from icefrog_launcher.sharing import (  # noqa: E402
    SHARING_FAILED,
    SharingGuard,
    is_out_of_memory,
    without_sharing,
)
from icefrog_slurm.runfiles import CHECKPOINT_MARKER  # noqa: E402
from tests.integration.store.helpers import spec  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("exc", "oom"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 1 GiB"), True),
        (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be..."), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory"), False),
        (MemoryError(), False),
        (ValueError("CUDA out of memory"), False),
    ],
)
def test_which_errors_are_cuda_out_of_memory(exc: BaseException, oom: bool) -> None:
    assert is_out_of_memory(exc) is oom


def _guard(tmp_path: Path, *, shared: bool, rank: int = 0, fail: bool = False) -> list[str]:
    sent: list[str] = []

    def register() -> None:
        if fail:
            raise OSError("munged is away")
        sent.append("register")

    guard = SharingGuard(str(tmp_path), rank=rank, shared=lambda: shared, register=register)
    return sent if guard.handle(torch.cuda.OutOfMemoryError("CUDA out of memory")) else []


def test_an_oom_while_shared_marks_reports_and_asks_for_a_requeue(tmp_path: Path) -> None:
    assert _guard(tmp_path, shared=True) == ["register"]
    assert (tmp_path / SHARING_FAILED).exists() and (tmp_path / CHECKPOINT_MARKER).exists()
    assert without_sharing(spec(), str(tmp_path)).accepts_shared is False


def test_a_report_that_cannot_be_sent_still_asks_for_the_requeue(tmp_path: Path) -> None:
    _guard(tmp_path, shared=True, fail=True)
    assert (tmp_path / CHECKPOINT_MARKER).exists()


def test_nothing_when_not_shared_or_not_rank_0(tmp_path: Path) -> None:
    assert _guard(tmp_path, shared=False) == []
    assert _guard(tmp_path, shared=True, rank=1) == []
    assert not (tmp_path / SHARING_FAILED).exists()
    assert not (tmp_path / CHECKPOINT_MARKER).exists()
    assert without_sharing(spec(), str(tmp_path)) == spec()
