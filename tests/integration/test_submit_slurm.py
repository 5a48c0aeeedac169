"""``icefrog submit`` on the real local cluster: the script is written, the job waits held
with its name, icefrog comment and minimal GRES, its ``register`` report is in the inbox,
and once released it trains examples/train_digits.py to its target and reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from icefrog_slurm.protocol import parse_envelope, parse_payload
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from tests.integration.conftest import REPO, wait_ended

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def _icefrog(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def _reports(inbox: Path, job_id: str, kind: str) -> list[object]:
    return [
        parse_payload(kind, parse_envelope(p.read_bytes()).payload)
        for p in sorted((inbox / job_id).glob(f"*-{kind}.json"))
    ]


@pytest.mark.timeout(240)
def test_submit_held_then_train_to_target(job_dir: Path) -> None:
    inbox = job_dir / "inbox"
    inbox.mkdir(mode=0o1733)
    workdir = job_dir / "digits"
    done = _icefrog(
        "submit", "--gpus", "1-2", "--batch", "64", "--target", "val_acc>=0.85",
        "--max-epochs", "8", "--job-name", "it-digits", "--workdir", str(workdir),
        "--inbox", str(inbox), "--partition", "gpu",
        "--", str(REPO / "examples" / "train_digits.py"), "--model", "mlp",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Submitted batch job ")
    job_id = done.stdout.split()[-1]
    backend = SlurmCliBackend()
    try:
        script = (workdir / "job.sbatch").read_text()
        assert "icefrog_slurm launch --gpus=1-2 --batch=64-64" in script
        assert "--target=val_acc>=0.85" in script
        state = backend.poll(job_ids=[job_id])[job_id]
        assert (state.state, state.held) == ("PENDING", True)
        assert state.tag is not None and state.comment.startswith("icefrog:")
        assert str(state.gres) == "gpu:1"
        detail = backend.job_detail(job_id=job_id)
        assert (detail.name, detail.work_dir) == ("it-digits", str(workdir))
        (spec,) = _reports(inbox, job_id, "register")  # from submit: the held job is known
        assert (spec.min_gpus, spec.max_gpus, spec.target_value) == (1, 2, 0.85)  # type: ignore[attr-defined]
        assert spec.layer_flops == (1.0,)  # type: ignore[attr-defined]  # unknown until it runs

        backend.release(job_id=job_id)
        final = wait_ended(backend, job_id, timeout=200)
        log = (workdir / f"slurm-{job_id}.out").read_text()
        assert final.state == "COMPLETED", log[-3000:]
        assert "finished: target_reached" in log
        registers = _reports(inbox, job_id, "register")
        assert len(registers) == 2 and len(registers[1].layer_flops) > 1  # type: ignore[attr-defined]
        (finished,) = _reports(inbox, job_id, "finished")
        assert finished.reason == "target_reached" and finished.final_metric >= 0.85  # type: ignore[attr-defined]
        assert _reports(inbox, job_id, "progress")
        assert list((workdir / "checkpoints").glob("ckpt-*.pt"))
    finally:
        backend.cancel(job_id=job_id)
