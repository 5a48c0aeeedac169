"""slurm_conf/dev/cluster.sh against the real daemons: GPUs, shards, idempotent up, status."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import cluster_sh, wait_for

pytestmark = pytest.mark.slurm


def _run_job(job_dir: Path, gres: str, command: str) -> str:
    out = job_dir / f"{gres.replace(':', '-')}.out"
    subprocess.run(
        ["sbatch", "--parsable", f"--gres={gres}", f"--output={out}", "--wrap", command],
        check=True,
        capture_output=True,
        text=True,
    )
    return wait_for(f"{gres} job output", lambda: out.exists() and out.read_text().strip())


def test_gpu2_job_sees_two_cuda_visible_devices(job_dir: Path) -> None:
    text = _run_job(job_dir, "gpu:2", 'echo "CVD=$CUDA_VISIBLE_DEVICES"')
    devices = text.removeprefix("CVD=").split(",")
    assert text.startswith("CVD=") and len(devices) == 2 and len(set(devices)) == 2


def test_shard_job_gets_gpu_device_ordinal(job_dir: Path) -> None:
    text = _run_job(job_dir, "shard:1", 'echo "GDO=$GPU_DEVICE_ORDINAL SH=$SLURM_SHARDS_ON_NODE"')
    gdo, sh = text.split()
    assert gdo.removeprefix("GDO=").isdigit() and sh == "SH=1"


def test_up_twice_is_idempotent() -> None:
    conf = Path(cluster_sh("conf").stdout.strip())
    pids = sorted((conf.parent.parent / "run").glob("*.pid"))
    before = {p.name: p.read_text() for p in pids}
    mtime = conf.stat().st_mtime_ns
    up = cluster_sh("up")
    assert up.returncode == 0, up.stderr
    assert f"export SLURM_CONF={conf}" in up.stdout
    assert {p.name: p.read_text() for p in pids} == before and len(before) == 5
    assert conf.stat().st_mtime_ns == mtime
    status = cluster_sh("status")
    assert (
        status.returncode == 0 and status.stdout.count(" idle") + status.stdout.count(" mix") >= 4
    )


def test_status_is_nonzero_for_a_cluster_that_is_not_up(tmp_path: Path) -> None:
    env = {**os.environ, "ICEFROG_CLUSTER_DIR": str(tmp_path / "nothing")}
    status = cluster_sh("status", env=env)
    assert status.returncode == 1 and "slurmctld:  DOWN" in status.stdout


def test_generated_config_matches_the_installed_version() -> None:
    conf = Path(cluster_sh("conf").stdout.strip()).read_text()
    version = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout
    assert ("TaskPlugin=task/none" in conf) == (" 22.05." in version)
    assert "GresTypes=gpu,shard" in conf and "Gres=gpu:a800:4,shard:8" in conf


def test_up_refuses_a_port_owned_by_another_cluster(tmp_path: Path) -> None:
    """A second cluster folder on the same ports: `up` fails naming the owner, and neither
    its `up` nor its `down` touches the running cluster (same daemons, its job survives)."""
    conf = Path(cluster_sh("conf").stdout.strip())
    pids = sorted((conf.parent.parent / "run").glob("*.pid"))
    before = {p.name: p.read_text() for p in pids}
    job = subprocess.run(
        ["sbatch", "--parsable", "--wrap", "sleep 60"], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        other = {**os.environ, "ICEFROG_CLUSTER_DIR": str(tmp_path / "other")}
        other.pop("SLURM_CONF", None)
        up = cluster_sh("up", env=other)
        assert up.returncode == 1
        assert "is owned by another cluster's slurmctld" in up.stderr
        assert f"StateSaveLocation={conf.parent.parent / 'state'}" in up.stderr
        assert not (tmp_path / "other" / "run" / "slurmctld.pid").exists()
        assert cluster_sh("status", env=other).returncode == 1
        assert cluster_sh("down", env=other).returncode == 0
        assert {p.name: p.read_text() for p in pids} == before
        queued = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True)
        assert queued.stdout.decode().strip() == job
    finally:
        subprocess.run(["scancel", job], check=False)
