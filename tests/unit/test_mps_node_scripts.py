"""slurm_conf's node scripts for CUDA MPS (prolog, task prolog, epilog) run against a
stand-in ``nvidia-cuda-mps-control`` (there is no GPU here): which daemon each starts or
quits, and what it leaves alone. The stand-in keeps a daemon as a file in its pipe folder,
its servers and clients as files beside it; ``logger`` and ``scontrol`` record their calls.
The scripts run as written except for their PATH and their two folders."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SLURM_CONF = Path(__file__).resolve().parents[2] / "slurm_conf"

FAKE_MPS = """#!/bin/bash
d=$CUDA_MPS_PIPE_DIRECTORY
echo "${*:-stdin} CVD=${CUDA_VISIBLE_DEVICES:-} pipe=${d##*/}" >> "$STUB/calls"
if [[ ${1:-} == -d ]]; then echo up > "$d/daemon"; exit 0; fi
[[ -f $d/daemon ]] || exit 1
read -r cmd arg
echo "  $cmd $arg" >> "$STUB/calls"
case $cmd in
    get_server_list) [[ ! -f $d/server ]] || cat "$d/server" ;;
    get_client_list) [[ ! -f $d/clients ]] || cat "$d/clients" ;;
    quit) [[ -f $STUB/stuck ]] || rm -f "$d/daemon" ;;
esac
"""
RECORD = '#!/bin/bash\necho "$*" >> "$STUB/$(basename "$0")"\n'


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {"nvidia-cuda-mps-control": FAKE_MPS, "logger": RECORD, "scontrol": RECORD}
    for name, text in stand_ins.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return tmp_path


def run(stub: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script with the stand-ins first on its PATH and its folders under ``stub``."""
    text = (SLURM_CONF / script).read_text()
    text = text.replace("export PATH=/usr/bin", f"export PATH={stub}/bin:/usr/bin")
    text = text.replace("/run/nvidia-mps", f"{stub}/pipes").replace(
        "/var/log/nvidia-mps", f"{stub}/logs"
    )
    path = stub / script
    path.write_text(text)
    clean = {"PATH": f"{stub}/bin:/usr/bin:/bin", "STUB": str(stub), "SLURMD_NODENAME": "n1"}
    return subprocess.run(
        ["bash", str(path)], env=clean | env, capture_output=True, text=True, timeout=60
    )


def calls(stub: Path, name: str = "calls") -> str:
    return (stub / name).read_text() if (stub / name).exists() else ""


def daemon(stub: Path, gpu: int, *, clients: str = "") -> Path:
    """A daemon already running on ``gpu`` (with one server, and these clients)."""
    pipe = stub / "pipes" / f"gpu{gpu}"
    pipe.mkdir(parents=True)
    (pipe / "daemon").write_text("up")
    (pipe / "server").write_text("4242\n")
    if clients:
        (pipe / "clients").write_text(clients)
    return pipe


MPS_JOB = {"CUDA_VISIBLE_DEVICES": "2", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}


def test_an_mps_job_starts_the_daemon_of_its_gpu_once(stub: Path) -> None:
    first = run(stub, "prolog-mps.sh.example", **MPS_JOB)
    assert first.returncode == 0, first.stderr
    assert "-d CVD=2 pipe=gpu2" in calls(stub)  # sees its GPU alone, its own pipe folder
    assert (stub / "pipes" / "gpu2" / "daemon").exists() and (stub / "logs" / "gpu2").is_dir()
    again = run(stub, "prolog-mps.sh.example", **MPS_JOB)  # the GPU's other mps job
    assert again.returncode == 0 and calls(stub).count("-d ") == 1


def test_a_job_without_gpus_or_with_whole_free_gpus_is_left_alone(stub: Path) -> None:
    assert run(stub, "prolog-mps.sh.example").returncode == 0
    assert run(stub, "prolog-mps.sh.example", CUDA_VISIBLE_DEVICES="0,1").returncode == 0
    assert "-d" not in calls(stub) and "quit" not in calls(stub)


def test_a_whole_gpu_quits_a_daemon_left_without_clients(stub: Path) -> None:
    pipe = daemon(stub, 1)
    done = run(stub, "prolog-mps.sh.example", CUDA_VISIBLE_DEVICES="0,1")
    assert done.returncode == 0 and "quit" in calls(stub)
    assert not (pipe / "daemon").exists() and not calls(stub, "scontrol")


def test_a_daemon_that_will_not_quit_drains_the_node(stub: Path) -> None:
    daemon(stub, 1)
    (stub / "stuck").write_text("")
    done = run(stub, "prolog-mps.sh.example", CUDA_VISIBLE_DEVICES="1")
    assert done.returncode == 1
    assert "nodename=n1 state=drain" in calls(stub, "scontrol")


def test_a_whole_gpu_still_serving_a_client_is_left_running(stub: Path) -> None:
    """Slurm 22.05 can give a shared GPU whole while one of its mps jobs still runs."""
    pipe = daemon(stub, 0, clients="777\n")
    done = run(stub, "prolog-mps.sh.example", CUDA_VISIBLE_DEVICES="0")
    assert done.returncode == 0 and "quit" not in calls(stub)
    assert (pipe / "daemon").exists() and "still serves MPS clients" in calls(stub, "logger")


def test_the_task_prolog_points_only_an_mps_job_at_its_gpus_daemon(stub: Path) -> None:
    out = run(stub, "taskprolog-mps.sh.example", **MPS_JOB).stdout.splitlines()
    assert out == [
        f"export CUDA_MPS_PIPE_DIRECTORY={stub}/pipes/gpu2",
        f"export CUDA_MPS_LOG_DIRECTORY={stub}/logs/gpu2",
        "export CUDA_VISIBLE_DEVICES=0",
    ]
    assert run(stub, "taskprolog-mps.sh.example", CUDA_VISIBLE_DEVICES="2").stdout == ""


def test_the_epilog_quits_the_daemon_after_its_last_client(stub: Path) -> None:
    pipe = daemon(stub, 2, clients="777\n")  # the GPU's other mps job still runs
    assert run(stub, "epilog-mps.sh.example", **MPS_JOB).returncode == 0
    assert (pipe / "daemon").exists() and "quit" not in calls(stub)
    (pipe / "clients").unlink()
    assert run(stub, "epilog-mps.sh.example", **MPS_JOB).returncode == 0
    assert not (pipe / "daemon").exists()
    # after a job of whole GPUs, or with no daemon left: nothing more is asked
    before = calls(stub)
    assert run(stub, "epilog-mps.sh.example", CUDA_VISIBLE_DEVICES="2").returncode == 0
    assert calls(stub) == before
    assert run(stub, "epilog-mps.sh.example", **MPS_JOB).returncode == 0
    assert "quit" not in calls(stub)[len(before) :]


def test_the_dev_cluster_refuses_an_unknown_sharing_kind() -> None:
    out = subprocess.run(
        ["bash", str(SLURM_CONF / "dev" / "cluster.sh"), "conf", "--sharing", "mig"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert "--sharing must be shard or mps, not 'mig'" in out.stderr
