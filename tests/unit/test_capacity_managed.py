"""Capacity by the store's own jobs: a job is the controller's only as one of the ``managed``
Slurm job ids with that owner uid, whatever its comment says (its owner can rewrite it)."""

from __future__ import annotations

from icefrog_slurm.domain.cluster import Gres, IcefrogTag, SlurmJobState
from icefrog_slurm.slurm import capacity
from icefrog_slurm.slurm.port import NodeGpus

NODES = [NodeGpus("n1", "mix", 4, 8), NodeGpus("n2", "mix", 4, 8)]


def _job(jid: str, gres: Gres, node: str, uid: int, tag: IcefrogTag | None) -> SlurmJobState:
    return SlurmJobState(jid, "RUNNING", gres, 1, node, "None", 1, uid, "gpu", "", tag)


JOBS = [
    _job("1", Gres("gpu", 2), "n1", 1000, None),  # managed, its tag dropped by its owner
    _job("2", Gres("gpu", 1), "n1", 1000, IcefrogTag("k")),  # tagged by hand, never adopted
    _job("3", Gres("shard", 2), "n2", 1001, IcefrogTag("k2")),  # tagged, store says uid 1000
    _job("4", Gres("gpu", 3), "n2", 1002, IcefrogTag("k3")),  # managed, tag kept
]
MANAGED = {"1": 1000, "3": 1000, "4": 1002}


def test_managed_jobs_are_never_foreign_and_the_rest_always_are() -> None:
    cap = capacity.partition_capacity(partition="gpu", nodes=NODES, jobs=JOBS, managed=MANAGED)
    assert cap.foreign_job_ids == ("2", "3")
    assert {n.name: n.foreign_gpus for n in cap.nodes} == {"n1": 1, "n2": 1}


def test_without_a_store_the_comment_decides() -> None:
    cap = capacity.partition_capacity(partition="gpu", nodes=NODES, jobs=JOBS)
    assert cap.foreign_job_ids == ("1",)
