"""``icefrog submit`` of an existing batch script on the real local cluster: what the job was
submitted with survives the controller's moves.

The moves are the backend's own (``SlurmCliBackend.resubmit``, as the controller makes them
to move a pending job between whole GPUs and GPU shards; ``update_pending`` for a resize in
place). The job keeps its account, time limit (the command line's, over the script's),
mail settings and host memory per GPU: ``scontrol show job`` of every new job is
compared with the original's. The dev cluster has no accounting database, so Slurm shows
``QOS=(null)`` whatever was asked: that the QOS is replayed is shown by the ``#SBATCH
"--qos=normal"`` line of every new job's own batch script (``scontrol write
batch_script``), the script sbatch applied. Once released, the job's output shows its
environment: a variable of the submitting shell (``--export`` ALL) and one given by
``--export=ALL,NAME=VALUE``, recorded in the script, reach the run after two resubmissions.
A header smuggling an option the controller decides (``--nodelist``, ``--gres``) into a
job's stored script is refused at resubmission, and the old job is left as it was. The
example of docs/user-guide.md (examples/train_digits.sbatch) is submitted as documented and
trains to its target.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.protocol import parse_envelope, parse_payload
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.port import SlurmRejected
from tests.integration.conftest import REPO, wait_ended, wait_for

pytestmark = [pytest.mark.slurm]

SCRIPT = """#!/bin/bash
#SBATCH --account=physics --qos=normal
#SBATCH --time=01:30:00
#SBATCH --mem-per-gpu=900M --mail-type=END,FAIL --mail-user=alice@example.org
echo "KEPT=$ICEFROG_IT_KEPT GIVEN=$ICEFROG_IT_GIVEN ARG=$1 PWD=$PWD"
#SBATCH --gres=gpu:4
"""
KEPT_FIELDS = ("Account", "TimeLimit", "MailUser", "MailType", "Partition")


def _icefrog(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
        env=dict(os.environ, PYTHONPATH=str(REPO), **env),
    )  # fmt: skip


def _show(job_id: str) -> dict[str, str]:
    """``scontrol -o show job``'s fields (GRES as 22.05 prints them: ``gres:gpu:1``, where
    24.11 prints ``gres/gpu:1``)."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    return {k: v.replace("gres/", "gres:") for k, v in re.findall(r"(\w+)=(\S*)", out)}


def _batch_script(job_id: str) -> str:
    return subprocess.run(
        ["scontrol", "write", "batch_script", job_id, "-"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip


def _kept(job_id: str) -> dict[str, str]:
    return {k: _show(job_id)[k] for k in KEPT_FIELDS}


@pytest.mark.timeout(240)
def test_sbatch_options_and_environment_survive_moves(job_dir: Path) -> None:
    inbox = job_dir / "inbox"
    inbox.mkdir(mode=0o1733)
    (job_dir / "job.sh").write_text(SCRIPT)
    workdir = job_dir / "w"
    done = _icefrog(
        "submit", "--gpus", "1-2", "--inbox", str(inbox), "--partition", "gpu",
        "--workdir", str(workdir), "--time=2:00:00", "--export=ALL,ICEFROG_IT_GIVEN=given",
        "job.sh", "first-arg",
        cwd=job_dir, ICEFROG_IT_KEPT="kept value",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = done.stdout.split()[-1]
    backend = SlurmCliBackend()
    ids = [first]
    try:
        original = _kept(first)
        assert original == {
            "Account": "physics", "TimeLimit": "02:00:00",
            "MailUser": "alice@example.org", "MailType": "END,FAIL", "Partition": "gpu",
        }  # fmt: skip
        assert _show(first)["MemPerTres"] == "gres:gpu:900"
        assert '#SBATCH "--qos=normal"\n' in _batch_script(first)

        shard = backend.resubmit(job_id=first, owner_uid=os.getuid(), gres=Gres("shard", 1))
        ids.append(shard)
        assert _kept(shard) == original
        assert _show(shard)["TresPerNode"] == "gres:shard:1"
        assert _show(shard)["MinMemoryNode"] == "900M"  # one GPU's worth, per node
        assert '#SBATCH "--qos=normal"\n' in _batch_script(shard)

        back = backend.resubmit(job_id=shard, owner_uid=os.getuid(), gres=Gres("gpu", 2))
        ids.append(back)
        backend.update_pending(job_id=back, gres=Gres("gpu", 1), num_nodes=1)  # a resize
        assert _kept(back) == original
        assert (_show(back)["TresPerNode"], _show(back)["MemPerTres"]) == (
            "gres:gpu:1", "gres:gpu:900",
        )  # fmt: skip
        assert '#SBATCH "--qos=normal"\n' in _batch_script(back)

        backend.release(job_id=back)
        final = wait_ended(backend, back, timeout=120)
        out = workdir / f"slurm-{back}.out"
        log = out.read_text() if out.exists() else ""
        assert final.state == "COMPLETED", log[-3000:] or _show(back).get("Reason")
        assert f"KEPT=kept value GIVEN=given ARG=first-arg PWD={job_dir}\n" in log
    finally:
        for jid in ids:
            backend.cancel(job_id=jid)


@pytest.mark.parametrize("smuggled", ["--nodelist=node4", "--gres=gpu:4"])
def test_a_smuggled_header_is_refused_at_resubmission(job_dir: Path, smuggled: str) -> None:
    """The owner's own sbatch with an icefrog comment (no icefrog submit in between): the
    header asks for what the controller decides; the controller does not replay it."""
    script = f'#!/bin/bash\n#SBATCH --time=5 "{smuggled}"\ntrue\n'
    jid = subprocess.run(
        ["sbatch", "--parsable", "--hold", "--requeue", "--gres=gpu:1", "--nodes=1-1",
         "--partition=gpu", "--comment=icefrog:smuggle", f"--chdir={job_dir}",
         f"--output={job_dir}/%j.out"],
        input=script, capture_output=True, text=True, timeout=30, check=True,
    ).stdout.strip()  # fmt: skip
    backend = SlurmCliBackend()
    try:
        with pytest.raises(SlurmRejected, match=re.escape(smuggled.split("=")[0])):
            backend.resubmit(job_id=jid, owner_uid=os.getuid(), gres=Gres("shard", 1))
        state = backend.poll(job_ids=[jid])[jid]
        assert (state.state, state.held) == ("PENDING", True)  # left as it was
    finally:
        backend.cancel(job_id=jid)


STAGING = """#!/bin/bash
#SBATCH --time=10
echo "staging"
sleep 300
echo "staged"
icefrog launch -- train.py
"""


@pytest.mark.timeout(180)
def test_a_term_while_the_script_stages_ends_the_job_before_its_launch(job_dir: Path) -> None:
    """Slurm's TERM to the batch step and its children (a time limit, ``scancel --full``)
    while the script still stages its data: the staging command dies, the job ends with 143
    at once, saying why, and its launch line never runs. Before, the script went on past
    the staging to its launch line, and the launcher started only to be killed when
    ``KillWait`` ran out."""
    inbox, workdir = job_dir / "inbox", job_dir / "staging"
    inbox.mkdir(mode=0o1733)
    (job_dir / "stage.sbatch").write_text(STAGING)
    done = _icefrog(
        "submit", "--gpus", "1", "--batch", "8", "--inbox", str(inbox), "--partition", "gpu",
        "--workdir", str(workdir), "stage.sbatch", cwd=job_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[-1]
    backend = SlurmCliBackend()
    out = workdir / f"slurm-{job_id}.out"
    try:
        backend.release(job_id=job_id)
        wait_for("the script to stage", lambda: out.exists() and "staging" in out.read_text(), 60)
        subprocess.run(["scancel", "--full", "--signal=TERM", job_id], check=True, timeout=30)
        wait_ended(backend, job_id, timeout=60, every=0.5)
        log = out.read_text()
        assert "icefrog: terminated before the launch: exit 143" in log, log
        assert "staged" not in log  # the script stopped where the TERM found it
        assert _show(job_id)["ExitCode"] == "143:0"
    finally:
        backend.cancel(job_id=job_id)


def _reports(inbox: Path, job_id: str, kind: str) -> list[object]:
    return [
        parse_payload(kind, parse_envelope(p.read_bytes()).payload)
        for p in sorted((inbox / job_id).glob(f"*-{kind}.json"))
    ]


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_the_user_guide_example_trains(job_dir: Path) -> None:
    inbox = job_dir / "inbox"
    inbox.mkdir(mode=0o1733)
    workdir = job_dir / "digits"
    done = _icefrog(
        "submit", "--gpus", "1-2", "--batch", "64", "--target", "val_acc>=0.85",
        "--max-epochs", "8", "--inbox", str(inbox), "--partition", "gpu",
        "--workdir", str(workdir), "train_digits.sbatch", "--model", "mlp",
        cwd=REPO / "examples",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[-1]
    backend = SlurmCliBackend()
    try:
        assert _kept(job_id)["TimeLimit"] == "00:30:00"
        assert backend.job_detail(job_id=job_id).name == "digits"
        backend.release(job_id=job_id)
        final = wait_ended(backend, job_id, timeout=260)
        out = workdir / f"slurm-{job_id}.out"
        log = out.read_text() if out.exists() else ""
        assert final.state == "COMPLETED", log[-3000:] or _show(job_id).get("Reason")
        assert f"in {REPO / 'examples'}\n" in log
        assert "finished: target_reached" in log
        (finished,) = _reports(inbox, job_id, "finished")
        assert finished.reason == "target_reached"  # type: ignore[attr-defined]
    finally:
        backend.cancel(job_id=job_id)
