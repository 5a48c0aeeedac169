"""A job holds the GPUs Slurm allocated it, however it asked for them: ``--gres``,
``--gpus-per-node`` (per node, ``tres_per_node``) or ``--gpus``, ``--gpus-per-task``,
``--gpus-per-socket`` (``tres_per_job``/``tres_per_task``/``tres_per_socket``, with
``tres_per_node`` empty). The records below are the fields squeue --json printed on Slurm
22.05 for such jobs (the real-cluster test is tests/integration/test_slurm_contract.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from icefrog_slurm.domain.cluster import PartitionCapacity
from icefrog_slurm.slurm import capacity, parse
from icefrog_slurm.slurm.port import NodeGpus

NODES = [NodeGpus(f"node{i}", "mix", 4, 8) for i in range(1, 5)]


def _record(jid: int, nodes: str, detail: list[str], **tres: str) -> dict[str, Any]:
    return {
        "job_id": jid, "user_id": 1001, "group_id": 1001, "job_state": "RUNNING",
        "name": "theirs", "nodes": nodes, "node_count": len(detail) or 1, "partition": "gpu",
        "gres_detail": detail, "tres_per_node": "", "tres_per_job": "", "tres_per_task": "",
        "tres_per_socket": "", **tres,
    }  # fmt: skip


def _jobs(*records: dict[str, Any]) -> dict[str, Any]:
    return {
        k: d.state_view() for k, d in parse.parse_squeue_json(json.dumps({"jobs": records})).items()
    }


def _foreign(cap: PartitionCapacity) -> list[int]:
    """Foreign GPUs of node1..node4."""
    return [n.foreign_gpus for n in cap.nodes]


REAL = (  # sbatch --gpus=2; -n2 --gpus-per-task=1; --gpus-per-node=2; --gpus=3 -N2; --gres=gpu:1
    _record(1, "node1", ["gpu:a800:2(IDX:0-1)"], tres_per_job="gres:gpu:2"),
    _record(2, "node1", ["gpu:a800:2(IDX:2-3)"], tres_per_task="gres:gpu:1"),
    _record(3, "node2", ["gpu:a800:2(IDX:0-1)"], tres_per_node="gres:gpu:2"),
    _record(
        4, "node[3-4]", ["gpu:a800:2(IDX:0-1)", "gpu:a800:1(IDX:0)"], tres_per_job="gres:gpu:3"
    ),
    _record(5, "node2", ["gpu:a800:1(IDX:2)"], tres_per_node="gres:gpu:1"),
)


def test_every_form_of_gpu_request_holds_the_gpus_slurm_allocated() -> None:
    jobs = _jobs(*REAL)
    assert jobs["1"].gres is None and jobs["1"].gpus_otherwise
    assert jobs["3"].gres is not None and not jobs["3"].gpus_otherwise
    assert jobs["4"].gpus_by_node == (("node3", 2), ("node4", 1))
    cap = capacity.partition_capacity(partition="gpu", nodes=NODES, jobs=jobs.values())
    assert _foreign(cap) == [4, 3, 2, 1]
    assert cap.available_gpus == 6 and set(cap.foreign_job_ids) == {"1", "2", "3", "4", "5"}


def test_without_slurm_s_allocation_a_job_asking_per_job_holds_its_nodes() -> None:
    """A completing job, or a detail that does not line up with the node list: a per-node
    request counts as asked, one per job or task as every GPU of its nodes (never fewer than
    it may hold)."""
    odd = (
        _record(1, "node1", [], tres_per_task="gres/gpu=1"),  # no allocation shown (24.11)
        _record(2, "node2", ["gpu:a800:1(IDX:0)", "gpu:a800:1(IDX:1)"], tres_per_task="gres:gpu:1"),
        _record(3, "node3", ["gpu:a800:1(IDX:z)"], tres_per_node="gres:gpu:1"),  # unreadable
        _record(4, "node4", ["nic:1(IDX:0)"]),  # no GPU at all
    )
    jobs = _jobs(*odd)
    assert all(jobs[k].gpus_by_node is None for k in ("1", "2", "3"))
    assert jobs["4"].gpus_by_node == (("node4", 0),) and not jobs["4"].gpus_otherwise
    cap = capacity.partition_capacity(partition="gpu", nodes=NODES, jobs=jobs.values())
    assert _foreign(cap) == [4, 4, 1, 0]
    assert "4" not in cap.foreign_job_ids


@pytest.mark.parametrize(
    ("detail", "want"),
    [
        (["shard:1(IDX:0)"], 1),  # 22.05
        (["shard:3(1/2,2/2,0/2,0/2)"], 2),  # 24.11: used/available a GPU
        (["mps:30(IDX:0)"], 1),
        (["shard:2(IDX:N/A)"], None),  # no index: counted by shards
    ],
)
def test_a_shard_job_holds_the_gpus_its_shards_sit_on(detail: list[str], want: int | None) -> None:
    kind = detail[0].split(":")[0]
    [job] = _jobs(_record(1, "node1", detail, tres_per_node=f"gres:{kind}:1")).values()
    assert job.gpus_on("node1") == want
    if want is None:  # ceil(1 shard / 2 a GPU)
        assert (
            capacity.partition_capacity(partition="gpu", nodes=NODES, jobs=[job]).foreign_gpus == 1
        )


def test_an_own_job_s_allocation_is_never_foreign() -> None:
    jobs = _jobs(_record(7, "node1", ["gpu:a800:4(IDX:0-3)"], tres_per_job="gres:gpu:4"))
    cap = capacity.partition_capacity(
        partition="gpu", nodes=NODES, jobs=jobs.values(), managed={"7": 1001}
    )
    assert cap.foreign_gpus == 0
    stranger = capacity.partition_capacity(
        partition="gpu", nodes=NODES, jobs=[replace(jobs["7"], user_id=1002)], managed={"7": 1001}
    )
    assert stranger.foreign_gpus == 4
