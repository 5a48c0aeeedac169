"""An out-of-memory while sharing a GPU, under real ``icefrog launch`` and torchrun (one
process, CPU): the probe's forward raises ``torch.cuda.OutOfMemoryError`` as a job past
its CUDA MPS memory limit does. Shared, it is a sharing failure: the launcher exits 75
(requeue me, never a failed job), the job re-registers with ``accepts_shared: false``
(read back with the controller's own parser) and keeps saying so after its restart, which
resumes from its last checkpoint. On a GPU of its own the same error fails the job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from icefrog_launcher.launch import REQUEUE_EXIT_CODE
from icefrog_launcher.sharing import SHARING_FAILED
from icefrog_slurm.protocol import (
    Decision,
    FinishedReport,
    JobSpec,
    parse_envelope,
    parse_payload,
)
from icefrog_slurm.runfiles import CHECKPOINT_MARKER

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "integration" / "sharing_probe.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
JOB = "202"
STEPS_AN_EPOCH = 256 // 32


def _launch(workdir: Path, *, shared: bool, oom_at: int, epochs: int = 3) -> tuple[int, str]:
    (workdir / "decision.json").write_text(Decision(1, 1, 32, 0, shared=shared).to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICEFROG_", "SLURM_"))}
    env.update(
        PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", SLURM_JOB_ID=JOB, ICEFROG_MANAGED="1",
        PROBE_OOM_AT=str(oom_at),
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", "launch", "--workdir", str(workdir),
         "--inbox", str(workdir / "inbox"), "--max-epochs", str(epochs), "--batch", "32",
         "--torchrun", str(TORCHRUN), "--", str(PROBE)],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    return done.returncode, done.stderr


def _reports(workdir: Path, kind: str) -> list[object]:
    paths = sorted((workdir / "inbox" / JOB).glob(f"*-{kind}.json"))
    return [parse_payload(kind, parse_envelope(p.read_bytes()).payload) for p in paths]


def test_an_oom_while_shared_is_a_sharing_failure_and_the_job_resumes_alone(
    tmp_path: Path,
) -> None:
    # the error in the second epoch, after the first epoch's checkpoint
    code, err = _launch(tmp_path, shared=True, oom_at=STEPS_AN_EPOCH + 3)
    assert code == REQUEUE_EXIT_CODE, err[-3000:]
    assert "ran out of memory while sharing its GPU" in err
    assert (tmp_path / SHARING_FAILED).exists() and (tmp_path / CHECKPOINT_MARKER).exists()
    registers = _reports(tmp_path, "register")
    assert all(isinstance(r, JobSpec) for r in registers)
    assert [r.accepts_shared for r in registers if isinstance(r, JobSpec)] == [True, False]
    assert _reports(tmp_path, "finished") == []  # never reported as a failed job
    # the restart, on a GPU of its own: it resumes from the first epoch's checkpoint,
    # finishes, and still registers as a job that is not to share a GPU
    code, err = _launch(tmp_path, shared=False, oom_at=0)
    assert code == 0, err[-3000:]
    assert "resumed from checkpoint" in err and "(epoch 1," in err
    registers = _reports(tmp_path, "register")
    assert [r.accepts_shared for r in registers if isinstance(r, JobSpec)] == [True, False, False]
    finished = _reports(tmp_path, "finished")
    assert [f.reason for f in finished if isinstance(f, FinishedReport)] == ["max_epochs"]


def test_an_oom_on_a_gpu_of_its_own_fails_the_job(tmp_path: Path) -> None:
    code, err = _launch(tmp_path, shared=False, oom_at=3)
    assert code not in (0, REQUEUE_EXIT_CODE), err[-3000:]
    assert "OutOfMemoryError" in err
    assert not (tmp_path / SHARING_FAILED).exists()
    assert not (tmp_path / CHECKPOINT_MARKER).exists()
    registers = _reports(tmp_path, "register")
    assert [r.accepts_shared for r in registers if isinstance(r, JobSpec)] == [True]
