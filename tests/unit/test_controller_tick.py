"""The pure tick: round timing, evictions (spec section 8), targets and actions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from icefrog_slurm.controller.release_timing import retry_wait_s
from icefrog_slurm.controller.snapshot import build_snapshot
from icefrog_slurm.controller.tick import (
    EVICTED,
    launch_refused,
    overreaches,
    run_dir_of,
    target_of,
    tick,
)
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.cluster import Gres, NodeCapacity, PartitionCapacity, SlurmJobState
from icefrog_slurm.domain.plan import PolicyResult, SlurmRequest
from icefrog_slurm.domain.records import Allocation, JobRecord, JobView, Progress, StoreSnapshot
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.protocol import JobSpec
from icefrog_slurm.settings import Settings, settings_from_mapping

SPEC = JobSpec(1, 2, 32, 64, 0.9, "acc", ">=", 0.9, 10, 1000, (1.0, 1.0), (1.0, 1.0))
CAP = PartitionCapacity("gpu", (NodeCapacity("node1", 4, 0), NodeCapacity("node2", 4, 1)), ())


def _job(i: int, submit: float = 0.0, utils: tuple[float, ...] = ()) -> JobView:
    rec = JobRecord(
        i, f"j{i}", 0, "root", "running", submit, None, None, SPEC, (str(i),), Progress()
    )
    samples = tuple(ProfileSample(1, 32, 0, True, 0.1, 0.1, 0.0, 0.2, 160.0, 1e9, u) for u in utils)
    return JobView(job=rec, samples=samples)


def _state(
    i: int, gres: Gres | None, state: str = "RUNNING", node: str = "node1", why: str = "None"
) -> SlurmJobState:
    return SlurmJobState(str(i), state, gres, 1, node, why, 1, 0, "gpu", "", None)


class Everyone:
    """Gives every job 1 exclusive GPU on node1."""

    name = "everyone"

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        return PolicyResult(
            {j.id: Allocation(j.id, 1, 32, 0, nodes=("node1",)) for j in snapshot.jobs}
        )


def _snap(views: list[JobView], states: dict[str, SlurmJobState], now: float = 1000.0) -> Snapshot:
    return build_snapshot(
        store=StoreSnapshot(jobs=tuple(views), last_round=None),
        states=states,
        capacity=CAP,
        now=now,
    )


def test_first_tick_is_a_round_and_diffs_actions() -> None:
    settings = settings_from_mapping({})
    views = [_job(1), _job(2)]
    states = {
        "1": _state(1, Gres("gpu", 2)),
        "2": _state(2, Gres("gpu", 1), "PENDING", "", "JobHeldUser"),
    }
    plan = tick(_snap(views, states), Everyone(), settings)
    assert plan.round_no == 1 and plan.capacity_gpus == 7
    assert {j.job_id: j.action for j in plan.jobs} == {1: "change", 2: "start"}
    released = {**states, "2": _state(2, Gres("gpu", 1), "PENDING", "", "Resources")}
    plan = tick(_snap(views, released), Everyone(), settings)
    assert {j.job_id: j.action for j in plan.jobs} == {1: "change", 2: "none"}


def test_a_round_is_never_decided_on_a_snapshot_without_measurements() -> None:
    views, states = [_job(1)], {"1": _state(1, Gres("gpu", 1))}
    bare = build_snapshot(
        store=StoreSnapshot(jobs=tuple(views), last_round=None, measured=False),
        states=states,
        capacity=CAP,
        now=1000.0,
    )
    with pytest.raises(ValueError, match="without measurements"):
        tick(bare, Everyone(), settings_from_mapping({}))


UNSTABLE = (0.1, 0.9, 0.2, 0.95, 0.1)


def test_unstable_packed_job_submitted_later_is_evicted() -> None:
    """Both see the shared GPU's utilization swing: the later-submitted one goes."""
    settings = settings_from_mapping({})
    views = [_job(1, submit=10.0, utils=UNSTABLE), _job(2, submit=20.0, utils=UNSTABLE[::-1])]
    states = {"1": _state(1, Gres("shard", 1)), "2": _state(2, Gres("shard", 1))}
    plan = tick(_snap(views, states), Everyone(), settings)
    by_id = {j.job_id: j for j in plan.jobs}
    assert by_id[2].reason == EVICTED and by_id[2].action == "stop"
    assert by_id[1].allocation.gpus == 1 and by_id[1].reason == ""


def test_a_job_reporting_an_instability_its_partners_do_not_see_evicts_only_itself() -> None:
    """Alice's early job reports a swinging utilization every round; Bob's later job on the
    same node sees a steady one: Alice's job is evicted, never Bob's (it was, every round)."""
    settings = settings_from_mapping({})
    views = [_job(1, submit=10.0, utils=UNSTABLE), _job(2, submit=20.0, utils=(0.5,) * 5)]
    states = {"1": _state(1, Gres("shard", 1)), "2": _state(2, Gres("shard", 1))}
    plan = tick(_snap(views, states), Everyone(), settings)
    by_id = {j.job_id: j for j in plan.jobs}
    assert by_id[1].reason == EVICTED and by_id[1].action == "stop"
    assert by_id[2].allocation.gpus == 1 and by_id[2].reason == ""


def test_stable_pack_is_left_alone() -> None:
    settings = settings_from_mapping({})
    views = [_job(1, utils=(0.4, 0.42, 0.41, 0.4, 0.43)), _job(2, submit=5.0)]
    states = {"1": _state(1, Gres("shard", 1)), "2": _state(2, Gres("shard", 1))}
    plan = tick(_snap(views, states), Everyone(), settings)
    assert all(j.reason == "" for j in plan.jobs)


def test_targets_for_shared_and_multi_node() -> None:
    settings = settings_from_mapping({"slurm": {"shards_per_gpu": 4}})
    shared = target_of(Allocation(1, 1, 32, 0, shared=True, nodes=("node2",)), settings)
    assert shared == SlurmRequest(Gres("shard", 2), 1, ("node2",))
    multi = target_of(Allocation(1, 8, 32, 0, nodes=("node1", "node2")), settings)
    assert multi == SlurmRequest(Gres("gpu", 4), 2, ("node1", "node2"))
    assert target_of(Allocation(1, 0, 0, 0), settings).gres is None
    assert SlurmRequest.from_params(multi.params()) == multi


def test_finished_jobs_end_in_the_store_unless_an_intent_moves_them() -> None:
    settings = settings_from_mapping({})
    states = {"1": _state(1, Gres("gpu", 1), "COMPLETED"), "2": _state(2, None, "CANCELLED")}
    plan = tick(_snap([_job(1), _job(2)], states), Everyone(), settings)
    assert dict(plan.state_changes) == {1: "finished", 2: "cancelled"}
    assert plan.jobs == ()
    held = {"1": _state(1, Gres("gpu", 1), "PENDING", "", "job requeued in held state")}
    assert tick(_snap([_job(1)], held), Everyone(), settings).state_changes == ((1, "pending"),)


def test_run_dir_from_the_trainers_checkpoint_path() -> None:
    assert run_dir_of("/shared/jobs/7/checkpoints/ckpt-00000003.pt") == "/shared/jobs/7"
    assert run_dir_of("") == "" and run_dir_of("/x/ckpt.pt") == ""


def test_a_refused_launch_is_restarted_later_never_failed() -> None:
    """slurmd refused the restart ("Job credential revoked"): whether Slurm shows the job
    pending held or ended with a launch failure, it is pending again and restarted (a
    finished one requeued held first); a real failure still ends ``failed``."""
    settings = settings_from_mapping({})
    views = [_job(1), _job(2), _job(3)]
    states = {
        "1": _state(1, Gres("gpu", 1), "PENDING", "", "launch failed requeued held"),
        "2": _state(2, Gres("gpu", 1), "FAILED", "node1", "JobLaunchFailure"),
        "3": _state(3, Gres("gpu", 1), "FAILED", "node1", "NonZeroExitCode"),
    }
    assert [launch_refused(states[k]) for k in "123"] == [True, True, False]
    assert not launch_refused(_state(4, Gres("gpu", 1), "RUNNING", why="credential revoked"))
    plan = tick(_snap(views, states), Everyone(), settings)
    assert dict(plan.state_changes) == {1: "pending", 2: "pending", 3: "failed"}
    assert {j.job_id: j.action for j in plan.jobs} == {1: "start", 2: "change"}


def test_a_refused_job_is_released_again_only_after_the_retry_delay() -> None:
    assert retry_wait_s(last_release=None, now=100.0, retry_s=130.0) == 0.0
    assert retry_wait_s(last_release=90.0, now=100.0, retry_s=130.0) == 120.0
    assert retry_wait_s(last_release=90.0, now=220.0, retry_s=130.0) == 0.0


def test_a_released_job_not_started_yet_follows_the_round_to_new_nodes_or_is_held() -> None:
    """A pending, unheld job is pinned to the nodes it was released to; when those went to
    another job it would wait for ever, so a round that moves it re-pins it ("start"),
    one that keeps its nodes leaves it alone, and one that tells it to wait holds it."""
    from icefrog_slurm.domain.records import RoundRecord

    settings = settings_from_mapping({})
    views = [_job(1)]
    released = {"1": _state(1, Gres("gpu", 1), "PENDING", "", "Resources")}
    on_node2 = (Allocation(1, 1, 32, 0, nodes=("node2",)),)
    last = RoundRecord(1, 0.0, "everyone", 8, None, None, on_node2)

    def plan_for(policy: object) -> str:
        snap = build_snapshot(
            store=StoreSnapshot(jobs=tuple(views), last_round=last),
            states=released,
            capacity=CAP,
            now=1000.0,
        )
        return tick(snap, policy, settings).jobs[0].action  # type: ignore[arg-type]

    assert plan_for(Everyone()) == "start"  # node2 -> node1: re-pinned

    class Stay:
        name = "stay"

        def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
            return PolicyResult({1: Allocation(1, 1, 32, 0, nodes=("node2",))})

    class Wait:
        name = "wait"

        def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
            return PolicyResult({1: Allocation(1, 0, 0, 0)})

    assert plan_for(Stay()) == "none"
    assert plan_for(Wait()) == "stop"


def _running(gres: Gres | None, nodelist: str = "node1", **more: object) -> SlurmJobState:
    return replace(_state(1, gres, node=nodelist), **more)  # type: ignore[arg-type]


def _given(gres: str | None, nodes: tuple[str, ...] = ("node1",), num_nodes: int = 1) -> dict:  # type: ignore[type-arg]
    return {"gres": gres, "num_nodes": num_nodes, "nodes": list(nodes)}


@pytest.mark.parametrize(
    ("held", "given", "over"),
    [
        (_running(Gres("gpu", 1)), _given("gpu:1"), False),
        (_running(Gres("gpu", 3)), _given("gpu:1"), True),  # more GPUs a node
        (_running(Gres("gpu", 1), "node2"), _given("gpu:1"), True),  # a node not given
        (_running(Gres("gpu", 1), "node2"), _given("gpu:1", ()), False),  # any node given
        (_running(Gres("gpu", 1), "node[1-2]", num_nodes=2), _given("gpu:1", ()), True),
        (
            _running(Gres("gpu", 2), "node[1-2]", num_nodes=2),
            _given("gpu:2", ("node1", "node2"), 2),
            False,
        ),
        (_running(Gres("gpu", 1)), _given(None), True),  # held by the controller
        (_running(Gres("shard", 1)), _given("shard:1"), False),
        (_running(Gres("shard", 2)), _given("shard:1"), True),
        (_running(Gres("gpu", 1)), _given("shard:1"), True),  # a whole GPU for a share
        (_running(Gres("mps", 30)), _given("mps:30"), False),
        (_running(Gres("mps", 100)), _given("mps:30"), True),
        (_running(None, gpus_by_node=(("node1", 4),)), _given("gpu:1"), True),  # per job
        (_running(Gres("gpu", 1), "", state="PENDING"), _given(None), False),  # holds nothing
        (_running(Gres("gpu", 4)), None, False),  # no intent done yet: nothing to compare
    ],
)
def test_a_job_holding_more_than_it_was_released_with_overreaches(
    held: SlurmJobState,
    given: dict | None,
    over: bool,  # type: ignore[type-arg]
) -> None:
    [job] = _snap([_job(1)], {"1": held}).jobs
    assert overreaches(job, given) is over


def test_an_overreaching_job_is_moved_at_once_unless_an_intent_moves_it_already() -> None:
    """It holds gpu:1 on node2 (the plan's count, another node: ``matches`` alone would let
    it be) where it was released with gpu:1 on node1: a change flagged ``overreach``; while
    an intent of its own is open (a move under way), it is not judged."""
    from icefrog_slurm.domain.records import Intent

    views, states = [_job(1)], {"1": _state(1, Gres("gpu", 1), node="node2")}
    snap = replace(_snap(views, states), granted={1: _given("gpu:1")})
    [job] = tick(snap, Everyone(), settings_from_mapping({})).jobs
    assert (job.action, job.overreach) == ("change", True)
    intent = Intent(1, 1, 1, "change", {}, "running", 1, 0.0, 0.0)
    [job] = tick(replace(snap, open_intents=(intent,)), Everyone(), settings_from_mapping({})).jobs
    assert not job.overreach
