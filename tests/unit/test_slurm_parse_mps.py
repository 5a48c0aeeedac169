"""The Slurm parsers on a cluster that shares GPUs by CUDA MPS, pinned by golden output of
the real 22.05, 24.11 and 26.05 daemons (tests/golden/slurm-V-mps, tests/golden/capture-mps.sh)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.slurm import capacity, commands, parse

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
VERSIONS = ["slurm-22.05-mps", "slurm-24.11-mps", "slurm-26.05-mps"]


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def golden(version: str, name: str) -> str:
    return (GOLDEN / version / name).read_text()


def test_sinfo_counts_the_typed_mps_of_each_node(version: str) -> None:
    nodes = parse.parse_sinfo_nodes(golden(version, "sinfo.txt"))
    assert [(n.name, n.gpus, n.shards, n.mps, n.usable) for n in nodes] == [
        (f"node{i}", 4, 0, 400, True) for i in range(1, 5)
    ]


def test_squeue_json_reads_mps_requests(version: str) -> None:
    jobs = parse.parse_squeue_json(golden(version, "squeue.json"))
    by_key = {j.tag.key: j for j in jobs.values() if j.tag}
    a, b = by_key["golden-mps-a"], by_key["golden-mps-b"]
    assert (a.state, a.gres, a.nodelist) == ("RUNNING", Gres("mps", 30), "node1")
    assert (b.state, b.gres, b.nodelist) == ("RUNNING", Gres("mps", 60), "node1")
    assert a.gres is not None and a.gres.shared
    assert by_key["golden-held-mps"].gres == Gres("mps", 20)  # (updated to 45 afterwards)
    assert by_key["golden-held"].gres == Gres("gpu", 1)
    [foreign] = [j for j in jobs.values() if j.name == "foreign-mps"]
    assert (foreign.user_id, foreign.gres, foreign.tag) == (65534, Gres("mps", 50), None)


def test_gres_detail_names_the_gpu_an_mps_job_sits_on(version: str) -> None:
    jobs = parse.parse_squeue_json(golden(version, "squeue.json"))
    [job] = [j for j in jobs.values() if j.tag and j.tag.key == "golden-mps-a"]
    [mps] = parse.gres_allocations(job.gres_detail, job.nodelist or "")  # (IDX:0) / (30/100,..)
    assert (mps.nodes, mps.kind, mps.count, mps.indices) == (("node1",), "mps", 30, (0,))


def test_a_foreign_mps_job_holds_one_gpu_of_its_node(version: str) -> None:
    nodes = parse.parse_sinfo_nodes(golden(version, "sinfo.txt"))
    jobs = [
        d.state_view() for d in parse.parse_squeue_json(golden(version, "squeue.json")).values()
    ]
    [foreign] = [j for j in jobs if j.name == "foreign-mps"]
    assert foreign.gpus_by_node == (("node2", 1),)  # its GPU index, from squeue's gres_detail
    # counted by its GPU index, or by MPS when Slurm gave none (ceil(50 / 100 a GPU)): one GPU
    for counted in (jobs, [replace(j, gpus_by_node=None) for j in jobs]):
        cap = capacity.partition_capacity(partition="gpu", nodes=nodes, jobs=counted)
        assert {n.name: n.foreign_gpus for n in cap.nodes} == {
            "node1": 0,
            "node2": 1,
            "node3": 0,
            "node4": 0,
        }
        assert cap.available_gpus == 15


def test_an_mps_count_update_is_read_back(version: str) -> None:
    assert parse.parse_gres_request(golden(version, "gres-after-mps-update.txt").strip()) == Gres(
        "mps", 45
    )
    # a pending job cannot change from gpu to mps on 22.05; 24.11 can (one path: resubmit)
    refused = "Invalid generic resource" in golden(version, "update-gpu-to-mps.txt")
    assert refused == (version == "slurm-22.05-mps")
    assert "Invalid generic resource" in golden(version, "shard-on-mps.txt")


def test_slurm_gives_each_mps_job_its_thread_percentage(version: str) -> None:
    """What an mps job's processes see: the GPU, and its share as the MPS thread limit."""
    for name, share in (("job-env-a.txt", "30"), ("job-env-b.txt", "60")):
        env = dict(line.split("=", 1) for line in golden(version, name).splitlines())
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == share
        assert env["CUDA_VISIBLE_DEVICES"] == env["SLURM_JOB_GPUS"] == "0"


def test_an_mps_job_is_asked_for_as_a_shared_one() -> None:
    """sbatch/scontrol arguments: the GRES as is; memory and cores one GPU's worth a node."""
    assert "Gres=mps:37" in commands.update_job("7", gres=Gres("mps", 37))
    assert commands.host_share(Gres("mps", 37), 900, 2) == ["--mem=900M", "--cpus-per-task=2"]
    assert commands.host_share(Gres("gpu", 1), 900, 2) == ["--mem-per-gpu=900M", "--cpus-per-gpu=2"]


def test_the_mps_node_scripts_comment_every_command_and_parse() -> None:
    """slurm_conf's prolog, task prolog and epilog for MPS nodes: each command has its
    comment above it (a continued line, or the fi/done/} closing a block, goes with the
    command it ends), and bash reads them (they need a GPU to run)."""
    scripts = sorted((GOLDEN.parents[1] / "slurm_conf").glob("*-mps.sh.example"))
    assert [p.name for p in scripts] == [
        "epilog-mps.sh.example",
        "prolog-mps.sh.example",
        "taskprolog-mps.sh.example",
    ]
    for path in scripts:
        lines = path.read_text().splitlines()
        assert lines[0] == "#!/bin/bash"
        for i, line in enumerate(lines):
            text, above = line.strip(), lines[i - 1].strip()
            if not text or text.startswith("#") or text in ("fi", "done", "}"):
                continue
            assert above.startswith("#") or above.endswith("\\"), f"{path.name}:{i + 1}"
        subprocess.run(["bash", "-n", str(path)], check=True)
