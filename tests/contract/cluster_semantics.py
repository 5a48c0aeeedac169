"""The semantic half of the ClusterPort contract, written once and run over every
implementation: ``SimCluster`` (tests/contract/test_sim_cluster.py, no Slurm), the CLI
backend and the pyslurm adapter on the real local cluster (tests/integration/
test_slurm_contract.py). What only a real Slurm shows (the job's environment, StartTime,
the owner's batch script, a signed successor, slurmctld down) stays in the integration tests.

A test module subclasses :class:`ClusterSemantics` as ``Test...`` and provides a ``harness``
fixture: a :class:`ClusterHarness` that builds requests, makes foreign jobs and
administrators' holds, and waits for the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag, SlurmJobState
from icefrog_slurm.slurm.port import (
    ClusterPort,
    GresAllocation,
    JobNotFound,
    SlurmRejected,
    SubmitRequest,
)

T = TypeVar("T")
UNKNOWN = "9999999"  # a job id no implementation knows


class ClusterHarness(Protocol):
    """What a semantic test needs beyond the port: one implementation's way of doing what
    Slurm's other users (a foreign user, an administrator) and its scheduler do."""

    port: ClusterPort
    partition: str
    nodes: tuple[str, ...]  # the partition's nodes, in order (at least 4)
    gpus_per_node: int

    def request(
        self, key: str, gres: Gres, *, nodes: tuple[str, ...] = (), num_nodes: int = 1
    ) -> SubmitRequest:
        """A held icefrog submission tagged ``icefrog:ct-<key>`` (the port's input)."""
        ...

    def wait(self, what: str, fn: Callable[[], T | None], timeout: float = 30.0) -> T:
        """Let the scheduler work until ``fn()`` is truthy; fail naming ``what``."""
        ...

    def settle(self) -> None:
        """Give the scheduler a pass: what would start by itself has started."""
        ...

    def after_requeue(self) -> None:
        """Wait as the controller does between a requeue and the next release of the job
        (its settings' ``release_gap_s``)."""
        ...

    def foreign_job(self, *, gpus: int, node: str, whole_memory: bool = False) -> str:
        """Start a job of another user, without an icefrog comment, on ``node`` (running
        when this returns); ``whole_memory``: it holds the node's whole memory
        (``--mem=0``)."""
        ...

    def owned_held_job(self, key: str, gres: Gres) -> tuple[str, int]:
        """A held icefrog-tagged job of some user, and that user's uid (for resubmit)."""
        ...

    def admin_hold(self, job_id: str) -> None:
        """An administrator holds the pending job."""
        ...

    def checkpointed(self, job_id: str) -> bool:
        """Whether the job's batch shell got the checkpoint signal (USR1)."""
        ...


def state(h: ClusterHarness, jid: str) -> SlurmJobState:
    return h.port.poll(job_ids=[jid])[jid]


def running(h: ClusterHarness, jid: str, timeout: float = 30.0) -> SlurmJobState:
    h.wait(f"job {jid} RUNNING", lambda: state(h, jid).state == "RUNNING", timeout)
    return state(h, jid)


def per_node(allocs: tuple[GresAllocation, ...]) -> dict[str, int]:
    """GPU indices held a node, however an implementation groups its nodes."""
    return {n: len(a.indices) for a in allocs for n in a.nodes}


class ClusterSemantics:
    """The tests every ClusterPort implementation passes (module docstring)."""

    def test_a_submission_is_held_and_idempotent_per_tag(self, harness: ClusterHarness) -> None:
        h = harness
        request = h.request("held", Gres("gpu", 1))
        jid = h.port.submit_held(request=request)
        held = state(h, jid)
        assert held.held and held.state == "PENDING" and not held.admin_held
        assert held.tag == IcefrogTag("ct-held") and held.is_icefrog
        assert h.port.submit_held(request=request) == jid  # the same tag: the same job
        h.settle()
        assert state(h, jid).state == "PENDING"  # held: it does not start by itself

    def test_released_with_the_decided_gpus_and_node(self, harness: ClusterHarness) -> None:
        h = harness
        jid = h.port.submit_held(request=h.request("release", Gres("gpu", 1)))
        h.port.update_pending(job_id=jid, gres=Gres("gpu", 2), num_nodes=1, nodes=(h.nodes[1],))
        h.port.release(job_id=jid)
        run = running(h, jid)
        assert h.port.hostnames(nodelist=run.nodelist) == (h.nodes[1],)
        assert run.gres == Gres("gpu", 2) and run.holds_resources and not run.held
        assert per_node(h.port.gres_allocation(job_id=jid)) == {h.nodes[1]: 2}
        [alloc] = h.port.gres_allocation(job_id=jid)
        assert alloc.kind == "gpu"

    def test_a_pending_jobs_gpus_and_nodes_change(self, harness: ClusterHarness) -> None:
        h = harness
        pair = (h.nodes[2], h.nodes[3])
        jid = h.port.submit_held(request=h.request("resize", Gres("gpu", 1)))
        h.port.update_pending(job_id=jid, gres=Gres("gpu", 3), num_nodes=2, nodes=pair)
        detail = h.port.job_detail(job_id=jid)
        assert detail.gres == Gres("gpu", 3) and detail.num_nodes == 2
        assert h.port.hostnames(nodelist=detail.req_nodes or "") == pair
        assert detail.state == "PENDING" and detail.tag == IcefrogTag("ct-resize")
        h.port.release(job_id=jid)
        run = running(h, jid)
        assert h.port.hostnames(nodelist=run.nodelist) == pair and run.num_nodes == 2
        assert per_node(h.port.gres_allocation(job_id=jid)) == dict.fromkeys(pair, 3)

    def test_requeue_hold_frees_the_gpus_and_release_now_runs_it_again(
        self, harness: ClusterHarness
    ) -> None:
        h = harness
        jid = h.port.submit_held(request=h.request("cycle", Gres("gpu", 1)))
        h.port.release(job_id=jid)
        first = running(h, jid).started_at
        h.port.signal_batch(job_id=jid, signal="USR1")
        h.wait("the checkpoint signal", lambda: h.checkpointed(jid), timeout=15)
        h.port.requeue_hold(job_id=jid)
        h.wait("requeued and held", lambda: state(h, jid).held)
        requeued = state(h, jid)
        assert requeued.state == "PENDING" and not requeued.holds_resources
        assert requeued.started_at is None and first is not None
        h.port.update_pending(job_id=jid, gres=Gres("gpu", 2))
        h.after_requeue()
        h.port.release_now(job_id=jid)
        again = running(h, jid)
        assert again.gres == Gres("gpu", 2)
        assert again.started_at is not None and again.started_at > first  # dated anew
        assert h.port.job_detail(job_id=jid).restarts == 1

    def test_a_released_job_that_waits_can_be_held_again(self, harness: ClusterHarness) -> None:
        h = harness
        blocker = h.foreign_job(gpus=h.gpus_per_node, node=h.nodes[0])
        jid = h.port.submit_held(request=h.request("rehold", Gres("gpu", 1), nodes=(h.nodes[0],)))
        h.port.release(job_id=jid)
        h.settle()
        waiting = state(h, jid)
        assert waiting.state == "PENDING" and not waiting.held  # released, no GPU free
        h.port.hold(job_id=jid)
        assert h.wait("held", lambda: state(h, jid).held)
        h.port.hold(job_id=jid)  # holding a held job again is fine
        h.port.cancel(job_id=blocker)
        h.port.release_now(job_id=jid)
        assert running(h, jid).gres == Gres("gpu", 1)

    def test_an_administrators_hold_is_never_lifted(self, harness: ClusterHarness) -> None:
        h = harness
        jid = h.port.submit_held(request=h.request("adminhold", Gres("gpu", 1)))
        h.port.hold(job_id=jid)  # icefrog's own hold: a user hold
        assert state(h, jid).reason == "JobHeldUser" and not state(h, jid).admin_held
        h.admin_hold(jid)
        assert h.wait("the admin hold", lambda: state(h, jid).admin_held, timeout=10)
        with pytest.raises(SlurmRejected, match="held by an administrator"):
            h.port.release(job_id=jid)
        with pytest.raises(SlurmRejected, match="held by an administrator"):
            h.port.release_now(job_id=jid)
        assert state(h, jid).admin_held

    def test_two_shard_jobs_share_one_gpu(self, harness: ClusterHarness) -> None:
        h = harness
        a = h.port.submit_held(request=h.request("sh-a", Gres("shard", 1), nodes=(h.nodes[0],)))
        b = h.port.submit_held(request=h.request("sh-b", Gres("shard", 1), nodes=(h.nodes[0],)))
        h.port.release(job_id=a)
        running(h, a)
        h.port.release(job_id=b)
        assert running(h, b).gres == Gres("shard", 1)
        [alloc_a] = h.port.gres_allocation(job_id=a)
        [alloc_b] = h.port.gres_allocation(job_id=b)
        assert alloc_a.kind == alloc_b.kind == "shard" and alloc_a.nodes == alloc_b.nodes
        assert alloc_a.indices == alloc_b.indices and len(alloc_a.indices) == 1

    def test_foreign_jobs_gpus_leave_the_capacity(self, harness: ClusterHarness) -> None:
        h = harness
        before = h.port.partition_capacity(partition=h.partition)
        assert before.total_gpus == len(h.nodes) * h.gpus_per_node
        foreign = h.foreign_job(gpus=2, node=h.nodes[3])
        detail = h.port.job_detail(job_id=foreign)
        assert detail.tag is None and not state(h, foreign).is_icefrog
        after = h.port.partition_capacity(partition=h.partition)
        assert foreign in after.foreign_job_ids and after.total_gpus == before.total_gpus
        assert after.available_gpus == before.available_gpus - 2
        node = {n.name: n for n in after.nodes}[h.nodes[3]]
        assert node.foreign_gpus - {n.name: n for n in before.nodes}[h.nodes[3]].foreign_gpus == 2
        h.port.cancel(job_id=foreign)
        assert h.wait(
            "the foreign GPUs back",
            lambda: (
                h.port.partition_capacity(partition=h.partition).available_gpus
                == before.available_gpus
            ),
        )

    def test_a_foreign_job_holding_a_nodes_memory_leaves_its_gpus_unusable(
        self, harness: ClusterHarness
    ) -> None:
        h = harness
        node = h.nodes[3]
        before = h.port.partition_capacity(partition=h.partition)
        assert {n.name: n for n in before.nodes}[node].available == h.gpus_per_node
        foreign = h.foreign_job(gpus=1, node=node, whole_memory=True)
        after = h.port.partition_capacity(partition=h.partition)
        cap = {n.name: n for n in after.nodes}[node]
        assert (cap.foreign_gpus, cap.blocked_gpus, cap.available) == (1, h.gpus_per_node - 1, 0)
        assert cap.blocked_by == "memory" and foreign in after.foreign_job_ids
        assert after.available_gpus == before.available_gpus - h.gpus_per_node
        # the scheduler agrees: an icefrog job sent to one of the free GPUs waits
        jid = h.port.submit_held(request=h.request("mem", Gres("gpu", 1), nodes=(node,)))
        h.port.release(job_id=jid)
        h.settle()
        assert state(h, jid).state == "PENDING"
        h.port.cancel(job_id=foreign)
        running(h, jid)  # and runs once the memory is free
        h.port.cancel(job_id=jid)
        assert h.wait(
            "the node's GPUs back",
            lambda: (
                h.port.partition_capacity(partition=h.partition).available_gpus
                == before.available_gpus
            ),
        )

    def test_icefrog_jobs_do_not_reduce_capacity(self, harness: ClusterHarness) -> None:
        h = harness
        before = h.port.partition_capacity(partition=h.partition).available_gpus
        jid = h.port.submit_held(request=h.request("own", Gres("gpu", 2), nodes=(h.nodes[0],)))
        h.port.release(job_id=jid)
        running(h, jid)
        cap = h.port.partition_capacity(partition=h.partition)
        assert cap.available_gpus == before and jid not in cap.foreign_job_ids

    def test_batched_poll_cancel_and_unknown_jobs(self, harness: ClusterHarness) -> None:
        h = harness
        ids = [h.port.submit_held(request=h.request(f"poll{i}", Gres("gpu", 1))) for i in range(3)]
        states = h.port.poll(job_ids=[*ids, UNKNOWN])
        assert sorted(states) == sorted(ids) and all(s.held for s in states.values())
        assert h.port.poll(job_ids=[UNKNOWN]) == {} and h.port.poll(job_ids=[]) == {}
        h.port.cancel(job_id=ids[0])
        h.port.cancel(job_id=ids[0])  # cancelling twice is fine
        h.port.cancel(job_id=UNKNOWN)  # and so is an unknown job
        assert h.wait("cancelled", lambda: h.port.poll(job_ids=ids)[ids[0]].finished)
        assert state(h, ids[0]).state == "CANCELLED" and not state(h, ids[1]).finished
        with pytest.raises(JobNotFound):
            h.port.job_detail(job_id=UNKNOWN)
        with pytest.raises(JobNotFound):
            h.port.release(job_id=UNKNOWN)

    def test_resubmission_replaces_a_pending_job_as_its_owner(
        self, harness: ClusterHarness
    ) -> None:
        h = harness
        old, owner = h.owned_held_job("owner", Gres("gpu", 1))
        with pytest.raises(SlurmRejected):
            h.port.resubmit(job_id=old, owner_uid=owner + 1, gres=Gres("shard", 1))
        assert state(h, old).held  # refused: nothing changed
        new = h.port.resubmit(
            job_id=old, owner_uid=owner, gres=Gres("shard", 1), num_nodes=1, nodes=(h.nodes[1],)
        )
        assert new != old
        detail = h.port.job_detail(job_id=new)
        assert detail.user_id == owner and detail.gres == Gres("shard", 1)
        assert detail.state == "PENDING" and detail.reason == "JobHeldUser"
        assert detail.tag is not None and (detail.tag.key, detail.tag.previous_id) == (
            "ct-owner",
            old,
        )
        assert h.port.find_successor(job_id=old, owner_uid=owner) == new
        assert h.port.find_successor(job_id=old, owner_uid=owner + 1) is None
        assert state(h, old).held  # left for the caller to cancel once it recorded the new one
        h.port.cancel(job_id=old)
        assert h.wait("the old job cancelled", lambda: state(h, old).state == "CANCELLED")
        h.port.release_now(job_id=new)
        assert running(h, new).gres == Gres("shard", 1)
        with pytest.raises(SlurmRejected, match="only a pending"):
            h.port.resubmit(job_id=new, owner_uid=owner, gres=Gres("gpu", 1))
