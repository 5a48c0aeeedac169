"""slurm_conf/dev/cluster.sh against the real daemons: GPUs, shards, idempotent up, status,
and memory scheduled as in the production examples (two users' jobs on one node, a shard
pair on one GPU; a job holding a whole node's memory runs alone)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import cluster_sh, wait_for
from tests.security.slurm_support import sbatch_as
from tests.support.munge import ensure_users

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


def test_generated_config_matches_the_running_version() -> None:
    conf = Path(cluster_sh("conf").stdout.strip()).read_text()
    # the client commands first on PATH are the cluster's version's (the fixture's PATH)
    version = subprocess.run(["scontrol", "--version"], capture_output=True, text=True).stdout
    assert ("TaskPlugin=task/none" in conf) == (" 22.05." in version)
    assert "GresTypes=gpu,shard" in conf and "Gres=gpu:a800:4,shard:8" in conf


def test_sinfo_shows_four_nodes_of_four_gpus_and_eight_shards() -> None:
    nodes = subprocess.run(
        ["sinfo", "-N", "-h", "-o", "%N %G"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    gres = dict(line.split(" ", 1) for line in nodes if line.strip())
    assert sorted(gres) == ["node1", "node2", "node3", "node4"], nodes
    assert set(gres.values()) == {"gpu:a800:4,shard:a800:8"}, gres


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


# --- memory scheduled as in production (CR_Core_Memory with per-GPU defaults) ---------------


@pytest.fixture
def users() -> dict[str, int]:
    if os.geteuid() != 0:
        pytest.skip("submitting as the test users needs root")
    return ensure_users()


BACKFILL_S = 35
"""Long enough for Slurm's backfill scheduler (bf_interval, 30 s by default) to have tried
every pending job once, whatever higher-priority jobs of other sessions wait before it."""


class Pinned:
    """A node nobody holds anything on (other sessions share the cluster) and the jobs a
    test submitted there (cancelled after it, by their ids)."""

    def __init__(self, node: str, job_dir: Path) -> None:
        self.node, self.job_dir, self.jobs = node, job_dir, list[str]()

    def submit(self, uid: int, *args: str) -> str:
        """A job of ``uid`` on the node: prints its GPU ordinals, then waits 60 s."""
        job = sbatch_as(
            uid, self.job_dir, "-J", "icefrog-it-mem", "-w", self.node, "--time=2", *args,
            "--wrap", 'echo "CVD=$CUDA_VISIBLE_DEVICES GDO=$GPU_DEVICE_ORDINAL"; sleep 60',
        )  # fmt: skip
        self.jobs.append(job)
        return job


@pytest.fixture
def idle_node(job_dir: Path) -> Iterator[Pinned]:
    node = wait_for("an idle node", lambda: next(iter(_idle_nodes()), None), timeout=120, every=1)
    pinned = Pinned(node, job_dir)
    yield pinned
    if pinned.jobs:
        subprocess.run(["scancel", *pinned.jobs], capture_output=True, check=False)


def _idle_nodes() -> list[str]:
    """Nodes whose state is exactly ``idle`` (not ``idle*``, not completing or mixed)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %T"], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    return sorted({n for n, state in map(str.split, out.splitlines()) if state == "idle"})


def _show(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True
    ).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _running(job_id: str) -> dict[str, str]:
    return wait_for(f"job {job_id} RUNNING", lambda: _is(job_id, "RUNNING"), timeout=60)


def _is(job_id: str, state: str) -> dict[str, str] | None:
    shown = _show(job_id)
    return shown if shown["JobState"] == state else None


def _tres(shown: dict[str, str]) -> str:
    """A job's allocated TRES: ``TRES=`` on 22.05, ``AllocTRES=`` on 24.11 and 26.05."""
    return shown.get("TRES") or shown["AllocTRES"]


def _node(node: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "-d", "show", "node", node], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _output(job_dir: Path, job_id: str) -> str:
    path = job_dir / f"{job_id}.out"
    return wait_for(f"job {job_id}'s output", lambda: path.exists() and path.read_text().strip())


def test_two_users_gpu_jobs_share_a_node_and_their_shard_jobs_a_gpu(
    job_dir: Path, users: dict[str, int], idle_node: Pinned
) -> None:
    """With the defaults (DefCpuPerGPU=1, DefMemPerGPU=450 of RealMemory=4000 on the
    partition, DefMemPerCPU=400) a job that asks for no memory gets a GPU's share of it:
    alice's and bob's one-GPU jobs run together on one node, and their one-shard jobs on one
    GPU (the same GPU ordinal), as Slurm reports."""
    alice, bob = users["icefrog-alice"], users["icefrog-bob"]
    pin = idle_node
    gpu_jobs = [pin.submit(uid, "--gres=gpu:1") for uid in (alice, bob)]
    shown = [_running(j) for j in gpu_jobs]
    assert [s["NodeList"] for s in shown] == [pin.node, pin.node]
    assert [s["UserId"].split("(")[0] for s in shown] == ["icefrog-alice", "icefrog-bob"]
    for s in shown:  # each its defaults: one core, 450 MB per GPU
        assert "cpu=1," in _tres(s) and "mem=450M" in _tres(s), s
    gpus = [_output(job_dir, j).split()[0] for j in gpu_jobs]
    assert len(set(gpus)) == 2  # two GPUs of the node, one each
    subprocess.run(["scancel", *gpu_jobs], check=True)

    shard_jobs = [pin.submit(uid, "--gres=shard:1") for uid in (alice, bob)]
    shown = [_running(j) for j in shard_jobs]
    for s in shown:  # a shard job has no GPU in Slurm's sense: DefMemPerCPU for its core
        assert "cpu=1," in _tres(s) and "mem=400M" in _tres(s), s
    ordinals = [_output(job_dir, j).split()[1] for j in shard_jobs]
    assert ordinals[0] == ordinals[1] and ordinals[0].removeprefix("GDO=").isdigit(), ordinals


def test_a_job_with_a_whole_nodes_memory_runs_alone(
    users: dict[str, int], idle_node: Pinned
) -> None:
    """The old example's case (CR_Core_Memory without per-GPU defaults: a job that asks for
    no memory is given the whole node's), played with ``--mem=0`` (all of the node's
    memory): Slurm reports the node's memory all allocated with one of its four GPUs, and
    bob's one-GPU job and alice's shard job pinned to it stay pending through a backfill
    pass (bf_interval, 30 s) beside the three free GPUs; once it ends, both start."""
    alice, bob = users["icefrog-alice"], users["icefrog-bob"]
    pin = idle_node
    whole = _running(pin.submit(alice, "--gres=gpu:1", "--mem=0"))
    assert "mem=4000M" in _tres(whole), whole
    node = _node(pin.node)
    assert node["AllocMem"] == node["RealMemory"] == "4000", node
    assert node["GresUsed"].startswith("gpu:a800:1("), node["GresUsed"]  # 3 GPUs free
    waiting = [pin.submit(bob, "--gres=gpu:1"), pin.submit(alice, "--gres=shard:1")]
    deadline = time.monotonic() + BACKFILL_S
    while time.monotonic() < deadline:
        for job in waiting:
            shown = _show(job)
            assert shown["JobState"] == "PENDING", shown
            reason = shown["Reason"].split(",")[0]  # ReqNodeNotAvail,_UnavailableNodes:...
            assert reason in ("Resources", "ReqNodeNotAvail", "Priority", "None"), shown
        time.sleep(1)
    subprocess.run(["scancel", whole["JobId"]], check=True)
    for job in waiting:  # the memory is back: both start
        _running(job)
