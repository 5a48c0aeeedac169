"""The ClusterPort semantics (``cluster_semantics.py``) over ``SimCluster``, the simulator's
in-memory Slurm: no Slurm needed. A scheduler pass is ``SimCluster.schedule``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.sim.cluster import SimCluster
from icefrog_slurm.slurm.port import ClusterPort, SubmitRequest
from tests.contract.cluster_semantics import ClusterSemantics

T = TypeVar("T")
OTHER_UID = 65534


class SimHarness:
    """``ClusterHarness`` over a 4-node SimCluster (4 GPUs a node, 2 shards a GPU)."""

    partition = "gpu"
    gpus_per_node = 4

    def __init__(self) -> None:
        self.signalled: list[str] = []
        self.time = 0.0  # a scheduler pass is a second later than the last
        self.sim = SimCluster(
            nodes=4, gpus_per_node=self.gpus_per_node, shards_per_gpu=2,
            partition=self.partition, on_signal=self.signalled.append, clock=lambda: self.time,
        )  # fmt: skip
        self.port: ClusterPort = self.sim
        self.nodes = self.sim.node_names

    def request(
        self, key: str, gres: Gres, *, nodes: tuple[str, ...] = (), num_nodes: int = 1
    ) -> SubmitRequest:
        return SubmitRequest(
            script="job.sh", tag=IcefrogTag(f"ct-{key}"), name=f"icefrog-ct-{key}", gres=gres,
            num_nodes=num_nodes, nodes=nodes, partition=self.partition,
        )  # fmt: skip

    def wait(self, what: str, fn: Callable[[], T | None], timeout: float = 30.0) -> T:
        self.settle()
        value = fn()
        assert value, f"after a scheduler pass, still waiting for {what}"
        return value

    def settle(self) -> None:
        self.time += 1.0
        self.sim.schedule()

    def after_requeue(self) -> None:
        pass  # the simulated slurmd refuses no launch

    def foreign_job(self, *, gpus: int, node: str, whole_memory: bool = False) -> str:
        jid = self.sim.run_foreign(
            name="ct-foreign", gres=Gres("gpu", gpus), nodes=(node,), user_id=OTHER_UID,
            whole_memory=whole_memory,
        )  # fmt: skip
        assert self.sim.poll(job_ids=[jid])[jid].state == "RUNNING"
        return jid

    def owned_held_job(self, key: str, gres: Gres) -> tuple[str, int]:
        return self.sim.submit_held(request=self.request(key, gres)), self.sim.user_id

    def admin_hold(self, job_id: str) -> None:
        self.sim.admin_hold(job_id=job_id)

    def checkpointed(self, job_id: str) -> bool:
        return job_id in self.signalled


class TestSimClusterSemantics(ClusterSemantics):
    @pytest.fixture
    def harness(self) -> Iterator[SimHarness]:
        yield SimHarness()


def test_a_foreign_job_waits_for_its_gpus_and_a_shard_job_counts_its_gpus() -> None:
    h = SimHarness()
    node = h.nodes[0]
    first = h.foreign_job(gpus=3, node=node)
    second = h.sim.run_foreign(name="f2", gres=Gres("gpu", 2), nodes=(node,), user_id=OTHER_UID)
    assert h.sim.poll(job_ids=[second])[second].state == "PENDING"  # 1 GPU left on the node
    shard = h.sim.run_foreign(name="f3", gres=Gres("shard", 2), nodes=(node,), user_id=OTHER_UID)
    cap = h.sim.partition_capacity(partition="gpu")
    assert {n.name: n.foreign_gpus for n in cap.nodes}[node] == 4  # 3 exclusive + 1 sharded
    assert set(cap.foreign_job_ids) == {first, shard}
    h.sim.cancel(job_id=first)
    assert h.sim.schedule() == [second]
    assert h.sim.partition_capacity(partition="gpu").available_gpus == 16 - 3
