"""Capacity counts the GPUs a foreign job's memory or cores leave unusable: a node's GPUs
usable by icefrog are min(free GPUs, free cores / cores per GPU, free memory / memory per
GPU), free meaning not held by foreign jobs (``slurm/capacity.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag, SlurmJobState
from icefrog_slurm.slurm import capacity
from icefrog_slurm.slurm.capacity import HostNeed
from icefrog_slurm.slurm.port import NodeGpus

# the dev cluster: CR_Core_Memory, DefCpuPerGPU=1, partition DefMemPerGPU=450
NEED = HostNeed(cores=True, memory=True, cpus_per_gpu=1, mem_per_gpu_mb=450)


def _node(name: str, alloc_cpus: int = 0, alloc_mem: int = 0) -> NodeGpus:
    return NodeGpus(name, "mix", 4, 8, 8, alloc_cpus, 4000, alloc_mem)


def _job(jid: str, gpus: int, node: str, *, tag: IcefrogTag | None = None) -> SlurmJobState:
    return SlurmJobState(
        jid, "RUNNING", Gres("gpu", gpus), 1, node, "None", 1, 1000, "gpu", "", tag
    )


def _caps(
    nodes: list[NodeGpus],
    jobs: list[SlurmJobState],
    need: HostNeed | None = NEED,
    *,
    managed: dict[str, int] | None = None,
    asked: dict[str, tuple[int | None, int | None]] | None = None,
) -> dict[str, tuple[int, int, str]]:
    cap = capacity.partition_capacity(
        partition="gpu", nodes=nodes, jobs=jobs, need=need, managed=managed, asked=asked
    )
    return {n.name: (n.foreign_gpus, n.blocked_gpus, n.blocked_by) for n in cap.nodes}


def test_a_foreign_job_holding_the_whole_memory_blocks_the_nodes_other_gpus() -> None:
    nodes = [_node("n1", alloc_cpus=1, alloc_mem=4000), _node("n2")]
    caps = _caps(nodes, [_job("7", 1, "n1")])
    assert caps == {"n1": (1, 3, "memory"), "n2": (0, 0, "")}
    cap = capacity.partition_capacity(
        partition="gpu", nodes=nodes, jobs=[_job("7", 1, "n1")], need=NEED
    )
    assert (cap.available_gpus, cap.blocked_gpus, cap.foreign_gpus) == (4, 3, 1)


def test_a_foreign_job_holding_all_cores_blocks_them_and_part_of_the_memory_some() -> None:
    assert _caps([_node("n1", alloc_cpus=8)], [_job("7", 1, "n1")])["n1"] == (1, 3, "cores")
    # 3000 MB held: 1000 MB free feeds 2 GPUs of 450 MB; 3 GPUs are free
    assert _caps([_node("n1", alloc_cpus=1, alloc_mem=3000)], [_job("7", 1, "n1")])["n1"] == (
        1,
        1,
        "memory",
    )
    both = _caps([_node("n1", alloc_cpus=8, alloc_mem=4000)], [_job("7", 1, "n1")])
    assert both["n1"] == (1, 3, "cores and memory")


def test_a_cpu_only_foreign_job_blocks_gpus_it_does_not_hold() -> None:
    # no GPU job at all on the node: its memory is foreign all the same
    assert _caps([_node("n1", alloc_cpus=2, alloc_mem=4000)], []) == {"n1": (0, 4, "memory")}


def test_the_controllers_own_jobs_memory_and_cores_do_not_block() -> None:
    own = _job("5", 2, "n1", tag=IcefrogTag("k"))
    # the job asked for 1800 MB a GPU: 3600 MB and 2 cores are its own, none foreign
    node = _node("n1", alloc_cpus=2, alloc_mem=3600)
    assert _caps([node], [own], asked={"5": (1800, None)})["n1"] == (0, 0, "")
    # without its ask, the need stands in (900 MB): 2700 MB foreign, 1300 MB feed 2 GPUs
    assert _caps([node], [own])["n1"] == (0, 2, "memory")
    # the store decides what is own, not the comment (a managed job that dropped its tag)
    untagged = _job("5", 2, "n1")
    assert _caps([node], [untagged], managed={"5": 1000}, asked={"5": (1800, None)})["n1"] == (
        0,
        0,
        "",
    )
    assert _caps([node], [untagged], managed={}, asked={"5": (1800, None)})["n1"] == (
        2,
        2,
        "memory",
    )


@pytest.mark.parametrize(
    ("need", "expected"),
    [
        (None, (1, 0, "")),  # no need given: the GPU count alone
        (HostNeed(cores=True), (1, 0, "")),  # CR_Core: memory is not scheduled
        (HostNeed(cores=True, memory=True), (1, 3, "memory")),  # no default, none free
        (HostNeed(), (1, 0, "")),  # schedules neither
    ],
)
def test_sites_that_do_not_schedule_memory_or_have_no_defaults(
    need: HostNeed | None, expected: tuple[int, int, str]
) -> None:
    assert (
        _caps([_node("n1", alloc_cpus=1, alloc_mem=4000)], [_job("7", 1, "n1")], need)["n1"]
        == expected
    )
    # no default and some memory free: no limit from memory
    partial = _caps([_node("n1", alloc_cpus=1, alloc_mem=3990)], [_job("7", 1, "n1")], need)
    assert partial["n1"] == (1, 0, "")


def test_a_node_whose_resources_were_not_read_keeps_its_gpu_count() -> None:
    assert _caps([NodeGpus("n1", "mix", 4, 8)], [_job("7", 1, "n1")])["n1"] == (1, 0, "")


CONFIG = """Configuration data as of 2026-12-02T08:00:00
DefMemPerCPU            = 400
JobDefaults             = DefCpuPerGPU=2
SelectTypeParameters    = CR_CORE_MEMORY
"""
PARTITION = "PartitionName=gpu Nodes=node[1-4] JobDefaults=DefMemPerGPU=450 DefMemPerNode=UNLIMITED"


def test_site_need_from_scontrol() -> None:
    assert capacity.site_need(CONFIG, PARTITION) == HostNeed(True, True, 2, 450)
    # no DefMemPerGPU anywhere: DefMemPerCPU times the cores a GPU gets
    assert capacity.site_need(CONFIG, "PartitionName=gpu JobDefaults=(null)") == HostNeed(
        True, True, 2, 800
    )
    # the partition's own defaults come first
    part = "PartitionName=gpu JobDefaults=DefCpuPerGPU=4,DefMemPerGPU=1000 DefMemPerCPU=10"
    assert capacity.site_need(CONFIG, part) == HostNeed(True, True, 4, 1000)
    core_only = CONFIG.replace("CR_CORE_MEMORY", "CR_CORE").replace("400", "UNLIMITED")
    assert capacity.site_need(core_only, "PartitionName=gpu") == HostNeed(True, False, 2, None)


SHOW_NODE = (
    "NodeName=n1 CPUAlloc=1 CPUEfctv=8 CPUTot=8 RealMemory=4000 AllocMem=4000 State=MIXED\n"
    "NodeName=n2 CPUAlloc=N/A CPUTot=8 RealMemory=4000 AllocMem=0 State=DOWN\n"
    "NodeName=n3 CPUAlloc=0 CPUTot=8 RealMemory=4000 AllocMem=0 Reason=x AllocMem=99999\n"
)


def test_node_resources_from_scontrol_and_odd_values_are_not_read() -> None:
    nodes = [NodeGpus(n, "mix", 4, 8) for n in ("n1", "n2", "n3", "n4")]
    got = {n.name: n for n in capacity.with_resources(nodes, SHOW_NODE)}
    assert (got["n1"].cpus, got["n1"].alloc_cpus, got["n1"].alloc_memory_mb) == (8, 1, 4000)
    assert got["n2"] == nodes[1] and got["n4"] == nodes[3]  # not a count; not listed
    # a second AllocMem in free text (a node's Reason) does not replace Slurm's own field
    assert got["n3"] == replace(nodes[2], cpus=8, alloc_cpus=0, memory_mb=4000, alloc_memory_mb=0)
