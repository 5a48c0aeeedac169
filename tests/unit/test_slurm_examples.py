"""The production slurm.conf examples have what icefrog needs: cores and
memory consumable with per-GPU defaults that let every GPU of a node hold two jobs,
``RequeueExit`` offered but left off (the controller requeues an icefrog job that exited
75 itself; Slurm's would requeue every job of the site that exits 75),
``DisableRootJobs=YES``, and shard counts that match gres.conf (two a GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "slurm_conf"
EXAMPLES = ["slurm.conf.a800.example", "slurm.conf.a800-mps.example"]


def _settings(text: str) -> dict[str, str]:
    """Global ``Key=value`` lines (first word of the line; comments dropped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z]+)=(\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _words(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def _lines(text: str, key: str) -> list[dict[str, str]]:
    return [_words(x) for x in text.splitlines() if x.startswith(f"{key}=")]


def _gpus(gres: str, kind: str) -> int:
    m = re.search(rf"(?:^|,){kind}(?::[a-z0-9]+)?:([0-9]+)", gres)
    assert m, f"no {kind} in Gres={gres}"
    return int(m.group(1))


@pytest.mark.parametrize("name", EXAMPLES)
def test_memory_and_cores_are_consumable_with_defaults_that_let_two_jobs_share_a_gpu(
    name: str,
) -> None:
    conf = (CONF / name).read_text()
    glob = _settings(conf)
    assert glob["SelectType"] == "select/cons_tres"
    assert glob["SelectTypeParameters"] == "CR_Core_Memory"
    # the controller requeues itself; RequeueExit=75 is there, commented out, for a site
    # that wants Slurm to requeue too (the controller copes with it: docs/controller.md)
    assert "RequeueExit" not in glob and "RequeueExitHold" not in glob
    assert "\n#RequeueExit=75\n" in conf
    (part,) = _lines(conf, "PartitionName")
    mem_per_gpu = int(part["DefMemPerGPU"])
    cpus_per_gpu = int(glob["DefCpuPerGPU"])
    mem_per_cpu = int(glob["DefMemPerCPU"])
    assert "DefMemPerGPU" not in glob  # one default per level (slurm.conf(5))
    nodes = _lines(conf, "NodeName")
    assert nodes
    for node in nodes:
        share = "mps" if "mps:" in node["Gres"] else "shard"
        gpus, cpus, mem = _gpus(node["Gres"], "gpu"), int(node["CPUs"]), int(node["RealMemory"])
        if share == "shard":
            assert _gpus(node["Gres"], "shard") == 2 * gpus, node
        # every GPU may hold a pair, each with one GPU's worth of cores and memory
        assert 2 * gpus * cpus_per_gpu <= cpus, node
        assert 2 * gpus * mem_per_gpu <= mem, node
        # a node full of one-core jobs never runs out of memory before cores
        assert cpus * mem_per_cpu <= mem, node


@pytest.mark.parametrize("name", EXAMPLES)
def test_no_root_jobs(name: str) -> None:
    assert _settings((CONF / name).read_text())["DisableRootJobs"] == "YES"


@pytest.mark.parametrize(
    ("gres_conf", "gpus"), [("gres.conf.a800-4gpu.example", 4), ("gres.conf.a800-8gpu.example", 8)]
)
def test_gres_examples_have_two_shards_a_gpu(gres_conf: str, gpus: int) -> None:
    text = (CONF / gres_conf).read_text()
    lines = [_words(x) for x in text.splitlines() if x.startswith("Name=")]
    shard = next(x for x in lines if x["Name"] == "shard")
    gpu = next(x for x in lines if x["Name"] == "gpu")
    assert int(shard["Count"]) == 2 * gpus
    assert gpu["File"] == shard["File"] == f"/dev/nvidia[0-{gpus - 1}]"
    node_lines = _lines((CONF / "slurm.conf.a800.example").read_text(), "NodeName")
    assert any(f"gpu:a800:{gpus},shard:{2 * gpus}" in n["Gres"] for n in node_lines)
