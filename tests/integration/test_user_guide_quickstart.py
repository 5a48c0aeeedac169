"""The user guide's quickstart on the real local cluster: examples/quickstart.sbatch
(running examples/quickstart.py: a Dataset read by DataLoader workers, an LR scheduler)
submitted with the guide's own ``icefrog submit`` line, released as the controller would,
trains to its target under icefrog launch and torchrun; its last checkpoint holds the
scheduler's state as of the epochs trained (the registered ``scheduler=``)."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from tests.integration.conftest import REPO, wait_ended

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]

GUIDE = REPO / "docs" / "user-guide.md"


def _guide_submit_line() -> list[str]:
    """The guide's ``icefrog submit ... quickstart.sbatch`` line, as argv."""
    (line,) = [
        ln for ln in GUIDE.read_text().splitlines() if ln.startswith("icefrog submit ")
        and ln.endswith("quickstart.sbatch")
    ]  # fmt: skip
    return shlex.split(line)[1:]


@pytest.mark.timeout(300)
def test_the_quickstart_trains_as_the_guide_says(job_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    inbox = job_dir / "inbox"
    inbox.mkdir(mode=0o1733)
    workdir = job_dir / "quickstart"
    argv = [sys.executable, "-m", "icefrog_slurm", *_guide_submit_line()]
    argv[-1:-1] = ["--inbox", str(inbox), "--partition", "gpu", "--workdir", str(workdir)]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, cwd=REPO / "examples", check=False,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[-1]
    backend = SlurmCliBackend()
    try:
        backend.release(job_id=job_id)
        final = wait_ended(backend, job_id, timeout=260)
        out = workdir / f"slurm-{job_id}.out"
        log = out.read_text() if out.exists() else ""
        assert final.state == "COMPLETED", log[-3000:]
        assert "finished: target_reached" in log, log[-3000:]
        epochs = int(log.split("finished: target_reached after ")[1].split()[0])
        newest = max((workdir / "checkpoints").glob("ckpt-*.pt"))
        state = torch.load(io.BytesIO(newest.read_bytes()), weights_only=True)
        scheduler = state["objects"]["scheduler"]
        assert scheduler["last_epoch"] == epochs  # stepped once an epoch, saved with it
        assert scheduler["T_max"] == 20
    finally:
        backend.cancel(job_id=job_id)
