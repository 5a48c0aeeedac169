"""The controller's side of a sharing failure: a job that re-registered with
``accepts_shared`` false (it ran out of memory while sharing its GPU) is never put back on
a shared GPU by the last round's decision; it waits until a round gives it a GPU of its
own. A job still accepting sharing follows its decision as before."""

from __future__ import annotations

import dataclasses

from icefrog_slurm.controller.snapshot import build_snapshot
from icefrog_slurm.controller.tick import UNSHARED, tick
from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.domain.records import Allocation, JobView, RoundRecord, StoreSnapshot
from icefrog_slurm.settings import settings_from_mapping
from tests.unit.test_controller_tick import CAP, SPEC, Everyone, _job, _state

SHARED = Allocation(1, 1, 32, 0, shared=True, nodes=("node1",), predicted_util=0.4)


def _after_a_shared_round(view: JobView, gres: Gres, state: str, why: str) -> tuple[int, str, str]:
    """(GPUs, action, reason) the tick decides between rounds, the last one sharing the job."""
    last = RoundRecord(4, 900.0, "icefrog", 8, None, None, (SHARED,))
    snap = build_snapshot(
        store=StoreSnapshot(jobs=(view,), last_round=last),
        states={"1": _state(1, gres, state, "node1" if state == "RUNNING" else "", why)},
        capacity=CAP,
        now=1000.0,  # 100 s after the round: none due
    )
    plan = tick(snap, Everyone(), settings_from_mapping({"sharing": {"gres": "mps"}}))
    assert plan.round_no is None
    (job,) = plan.jobs
    return job.allocation.gpus, job.action, job.reason


def _refusing(view: JobView) -> JobView:
    spec = dataclasses.replace(SPEC, accepts_shared=False)
    return dataclasses.replace(view, job=dataclasses.replace(view.job, spec=spec))


def test_a_job_whose_sharing_failed_waits_instead_of_being_shared_again() -> None:
    held = (Gres("mps", 40), "PENDING", "JobHeldUser")  # requeued held after its exit 75
    assert _after_a_shared_round(_refusing(_job(1)), *held) == (0, "none", UNSHARED)
    # one still running shared when its report came is stopped (checkpointed, held)
    running = (Gres("mps", 40), "RUNNING", "None")
    assert _after_a_shared_round(_refusing(_job(1)), *running) == (0, "stop", UNSHARED)


def test_a_job_that_accepts_sharing_follows_the_shared_decision() -> None:
    held = (Gres("mps", 40), "PENDING", "JobHeldUser")
    assert _after_a_shared_round(_job(1), *held) == (1, "start", "")


def test_a_round_gives_it_a_gpu_of_its_own() -> None:
    snap = build_snapshot(
        store=StoreSnapshot(jobs=(_refusing(_job(1)),), last_round=None),
        states={"1": _state(1, Gres("mps", 40), "PENDING", "", "JobHeldUser")},
        capacity=CAP,
        now=1000.0,
    )
    plan = tick(snap, Everyone(), settings_from_mapping({}))
    (job,) = plan.jobs
    assert (job.allocation.gpus, job.allocation.shared, job.action) == (1, False, "start")
