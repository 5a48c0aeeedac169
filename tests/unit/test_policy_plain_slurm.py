"""Plain Slurm (``--policy slurm``): FIFO by submission, EASY backfill that never delays the
first waiting job, the requested GPUs placed as the other policies place them."""

from __future__ import annotations

import math
from dataclasses import replace

from icefrog_slurm.domain.cluster import Gres, NodeCapacity, PartitionCapacity, SlurmJobState
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot, Snapshot
from icefrog_slurm.policies.baseline import Free
from icefrog_slurm.policies.plain_slurm import (
    WHY_BEHIND,
    WHY_HEAD,
    PlainSlurmPolicy,
    Release,
    start_time,
)
from icefrog_slurm.protocol import JobSpec, fixed_per_gpu_batch
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import TraceJob

SPEC = JobSpec(1, 8, 32, 256, 0.9, "acc", ">=", 0.9, 10, 1000, (1.0, 1.0), (1.0, 1.0))
NOW = 10_000.0


def _cap(*gpus: int) -> PartitionCapacity:
    return PartitionCapacity("gpu", tuple(NodeCapacity(f"n{i + 1}", g, 0) for i, g in
                                          enumerate(gpus)), ())  # fmt: skip


def _job(
    i: int, want: int, submit: float, *, on: tuple[str, ...] = (), start: float | None = None
) -> JobSnapshot:
    """Job ``i`` asking for ``want`` GPUs (4 a node at most); running on ``on`` when given."""
    per_node = min(want, 4)
    rec = JobRecord(i, f"j{i}", 0, "u", "running" if on else "pending", submit, start, None,
                    SPEC, (str(i),), Progress())  # fmt: skip
    nodes = -(-want // per_node)
    state = SlurmJobState(str(i), "RUNNING" if on else "PENDING", Gres("gpu", per_node), nodes,
                          ",".join(on), "None", 1, 0, "gpu", "", None)  # fmt: skip
    return JobSnapshot(JobView(rec), state, Current(want, False, on) if on else Current())


def _decide(
    jobs: list[JobSnapshot], cap: PartitionCapacity, limits: dict[str, float]
) -> tuple[dict[int, tuple[int, tuple[str, ...]]], dict[int, str]]:
    res = PlainSlurmPolicy(limits).decide(
        Snapshot(time=NOW, jobs=tuple(jobs), capacity=cap, last_round=None), settings=Settings()
    )
    assert set(res.allocations) == {j.id for j in jobs}
    return {k: (a.gpus, a.nodes) for k, a in res.allocations.items()}, dict(res.reasons)


def test_fifo_by_submission_time_not_by_id() -> None:
    jobs = [_job(1, 4, submit=30.0), _job(2, 4, submit=10.0), _job(3, 4, submit=20.0)]
    got, why = _decide(jobs, _cap(4, 4), {})
    assert got[2][0] == 4 and got[3][0] == 4  # the two submitted first
    assert got[1] == (0, ()) and why[1] == WHY_HEAD
    assert {got[2][1], got[3][1]} == {("n1",), ("n2",)}


def test_a_short_job_is_backfilled_before_the_head_s_reservation() -> None:
    # n1 busy until NOW + 1000, n2 free; the head wants both nodes (8 GPUs) at NOW + 1000
    running = _job(1, 4, submit=0.0, on=("n1",), start=NOW - 500)
    head = _job(2, 8, submit=5.0)
    short = _job(3, 2, submit=6.0)
    got, why = _decide([running, head, short], _cap(4, 4), {"j1": 1500.0, "j3": 900.0})
    assert got[1] == (4, ("n1",))  # the running job keeps its GPUs
    assert got[2][0] == 0 and why[2] == WHY_HEAD
    assert got[3] == (2, ("n2",))  # ends at NOW + 900, before the head can start


def test_a_job_that_would_delay_the_head_is_not_backfilled() -> None:
    running = _job(1, 4, submit=0.0, on=("n1",), start=NOW - 500)
    head = _job(2, 8, submit=5.0)
    long = _job(3, 2, submit=6.0)
    unlimited = _job(4, 1, submit=7.0)
    got, why = _decide([running, head, long, unlimited], _cap(4, 4), {"j1": 1500.0,
                                                                      "j3": 1100.0})  # fmt: skip
    assert got[3][0] == 0 and why[3] == WHY_BEHIND  # would hold n2 past NOW + 1000
    assert got[4][0] == 0 and why[4] == WHY_BEHIND  # no time limit: never ends
    # the same long job once the head is gone starts at once (it fits)
    got, _ = _decide([running, long], _cap(4, 4), {"j1": 1500.0, "j3": 1100.0})
    assert got[3][0] == 2


def test_a_long_job_is_backfilled_on_gpus_the_head_does_not_need() -> None:
    # the head (4 GPUs) starts on n1 at NOW + 1000; n2's two free GPUs are no use to it
    a = _job(1, 4, submit=0.0, on=("n1",), start=NOW)
    b = _job(2, 2, submit=1.0, on=("n2",), start=NOW)
    head = _job(3, 4, submit=5.0)
    long = _job(4, 2, submit=6.0)
    got, why = _decide([a, b, head, long], _cap(4, 4), {"j1": 1000.0, "j2": 5000.0})
    assert got[3][0] == 0 and why[3] == WHY_HEAD
    assert got[4] == (2, ("n2",))  # no limit, yet the head still starts at NOW + 1000


def test_after_the_head_the_queue_is_only_backfill() -> None:
    # FIFO stops at the first job that does not fit: a later job that fits and would
    # delay it waits, as under Slurm's main scheduler and backfill
    running = _job(1, 4, submit=0.0, on=("n1",), start=NOW)
    head = _job(2, 8, submit=1.0)
    later = _job(3, 4, submit=2.0)
    got, why = _decide([running, head, later], _cap(4, 4), {"j1": 100.0, "j3": 200.0})
    assert got[3][0] == 0 and why[3] == WHY_BEHIND


def test_whole_node_packing_and_best_fit() -> None:
    # n1 has 3 free, n2 2, n3 4: 9 free GPUs but one whole node
    one = _job(1, 1, submit=0.0, on=("n1",), start=NOW)
    two = _job(2, 2, submit=0.0, on=("n2",), start=NOW)
    small = _job(3, 2, submit=1.0)  # best fit: n2 (2 free), not n1 (3) or n3 (4)
    single = _job(4, 1, submit=2.0)  # then n1 (3 free) before n3 (4)
    got, _ = _decide([one, two, small, single], _cap(4, 4, 4), {})
    assert got[3] == (2, ("n2",)) and got[4] == (1, ("n1",))
    big = _job(5, 8, submit=1.0)  # two whole nodes needed, one is free
    got, why = _decide([one, two, big], _cap(4, 4, 4), {"j1": 50.0, "j2": 80.0})
    assert got[5] == (0, ()) and why[5] == WHY_HEAD
    got, _ = _decide([one, big], _cap(4, 4, 4), {})
    assert got[5] == (8, ("n2", "n3"))


def test_requested_batch_nothing_frozen_never_shared() -> None:
    job = _job(1, 4, submit=0.0)
    job = replace(job, view=replace(job.view, job=replace(job.job, spec=replace(
        SPEC, global_batch=512))))  # fmt: skip
    res = PlainSlurmPolicy().decide(
        Snapshot(time=NOW, jobs=(job,), capacity=_cap(4), last_round=None), settings=Settings()
    )
    a = res.allocations[1]
    assert (a.gpus, a.frozen, a.shared) == (4, 0, False)
    assert a.batch == fixed_per_gpu_batch(512, 4, SPEC.min_batch, SPEC.max_batch) == 128
    res = PlainSlurmPolicy().decide(
        Snapshot(time=NOW, jobs=(_job(2, 2, 0.0),), capacity=_cap(4), last_round=None),
        settings=Settings(),
    )
    assert res.allocations[2].batch == 32  # no global batch: its smallest


def test_start_time_releases_in_order_of_expected_end() -> None:
    snap = Snapshot(time=NOW, jobs=(), capacity=_cap(4, 4), last_round=None)
    free = Free(snap)
    free.free = {"n1": 0, "n2": 1}
    late = Release(NOW + 900, ("n2",), 3)
    soon = Release(NOW + 300, ("n1",), 4)
    assert start_time(free, [late, soon], 1, NOW) == NOW
    assert start_time(free, [late, soon], 4, NOW) == NOW + 300
    assert start_time(free, [late, soon], 8, NOW) == NOW + 900
    assert start_time(free, [late, soon], 12, NOW) == math.inf
    overdue = Release(NOW - 50, ("n1",), 4)  # past its limit: expected to end now
    assert start_time(free, [overdue], 4, NOW) == NOW


def test_the_engine_runs_jobs_in_submission_order_on_their_requested_gpus() -> None:
    jobs = [TraceJob("a", 0.0, "resnet18-cifar10", 4, 512),
            TraceJob("b", 10.0, "resnet18-cifar10", 4, 512),
            TraceJob("c", 20.0, "resnet18-cifar10", 2, 256)]  # fmt: skip
    opts = SimOptions(gpus=4, gpus_per_node=4, seed=1, fixed_batch=True)
    res = Engine(jobs, PlainSlurmPolicy({"a": 1e9, "b": 1e9, "c": 1e9}), settings=Settings(),
                 options=opts).run()  # fmt: skip
    out = {j.name: j for j in res.jobs}
    assert all(j.finish is not None and j.reallocations == 0 for j in res.jobs)
    assert out["a"].start is not None and out["b"].start is not None
    assert out["c"].start is not None
    assert out["a"].finish is not None and out["b"].finish is not None
    # b waits for a (the cluster is one node); c, behind b, never jumps ahead of it
    assert out["b"].start >= out["a"].finish and out["c"].start >= out["b"].finish
    assert not res.frozen and max(g for _, g in res.usage) <= 4
    for j, want in ((out["a"], 4), (out["b"], 4), (out["c"], 2)):  # the GPUs it asked for
        assert j.finish is not None and j.start is not None
        assert abs(j.gpu_seconds / (j.finish - j.start) - want) < 0.01
