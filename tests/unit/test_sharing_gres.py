"""The GRES a shared job asks for: ``shard:K`` or ``mps:N`` from eq 8's prediction, the
actions a change of share or kind takes, and the prediction kept through the store."""

from __future__ import annotations

import math

import pytest

from icefrog_slurm.commands.preflight import Failed, check_sharing
from icefrog_slurm.controller.snapshot import build_snapshot, current_of
from icefrog_slurm.controller.tick import action_for, matches, shared_gres, target_of, tick
from icefrog_slurm.domain.cluster import Gres, NodeCapacity, PartitionCapacity, SlurmJobState
from icefrog_slurm.domain.plan import PolicyResult, SlurmRequest
from icefrog_slurm.domain.records import (
    Allocation,
    JobRecord,
    JobView,
    Progress,
    StoreSnapshot,
)
from icefrog_slurm.domain.snapshot import JobSnapshot, Snapshot
from icefrog_slurm.protocol import JobSpec
from icefrog_slurm.settings import Settings, settings_from_mapping

SPEC = JobSpec(1, 2, 32, 64, 0.9, "acc", ">=", 0.9, 10, 1000, (1.0, 1.0), (1.0, 1.0))


def _mps(**slurm: int) -> Settings:
    return settings_from_mapping({"sharing": {"gres": "mps"}, "slurm": dict(slurm)})


def _shared(util: float | None) -> Allocation:
    return Allocation(1, 1, 32, 0, shared=True, nodes=("node2",), predicted_util=util)


def _state(gres: Gres | None, state: str = "RUNNING", why: str = "None") -> SlurmJobState:
    return SlurmJobState("7", state, gres, 1, "node2", why, 1, 0, "gpu", "", None)


def _job(state: SlurmJobState) -> JobSnapshot:
    rec = JobRecord(1, "j", 0, "root", "running", 0.0, None, None, SPEC, ("7",), Progress())
    return JobSnapshot(view=JobView(job=rec), slurm=state, current=current_of(state))


def test_shard_is_the_default_and_ignores_the_prediction() -> None:
    settings = settings_from_mapping({"slurm": {"shards_per_gpu": 6}, "sharing": {}})
    assert settings.sharing.gres == "shard"
    for util in (None, 0.1, 0.9):
        assert shared_gres(_shared(util), settings) == Gres("shard", 3)


@pytest.mark.parametrize(
    ("util", "count", "expected"),
    [
        (0.37, 100, 37),  # the predicted utilisation's share of the GPU
        (0.5, 100, 50),
        (0.999, 100, 99),  # rounded down: a GPU's shares never exceed its count
        (0.0, 100, 1),  # at least one
        (1.0, 100, 99),  # one left for the other job the GPU may take
        (0.25, 400, 100),  # another MPS count a GPU
        (None, 100, 50),  # not predicted: an equal part, as shards
        (math.nan, 100, 50),
        (1.5, 100, 50),  # not a utilisation
    ],
)
def test_mps_share_comes_from_the_predicted_utilisation(
    util: float | None, count: int, expected: int
) -> None:
    target = target_of(_shared(util), _mps(mps_per_gpu=count))
    assert target == SlurmRequest(gres=Gres("mps", expected), num_nodes=1, nodes=("node2",))


def test_an_admitted_pair_fits_the_gpus_mps_count() -> None:
    """eq 8 admits a pair whose utilisations sum to at most 1: their mps:N fit the GPU."""
    settings = _mps()
    for a in range(0, 101):
        pair = (a / 100, (100 - a) / 100)
        total = sum(shared_gres(_shared(u), settings).count for u in pair)
        assert total <= settings.slurm.mps_per_gpu, pair


def test_whole_gpus_are_gpu_whatever_the_kind() -> None:
    alloc = Allocation(1, 8, 32, 0, nodes=("node1", "node2"), predicted_util=0.4)
    assert target_of(alloc, _mps()).gres == Gres("gpu", 4)


def test_a_running_mps_job_keeps_its_share_when_the_prediction_moves() -> None:
    settings = _mps()
    running = _job(_state(Gres("mps", 40)))
    moved = target_of(_shared(0.45), settings)
    assert matches(running.slurm, moved) and action_for(running, moved) == "none"  # type: ignore[arg-type]
    # but a kind change (exclusive again, or the other GRES) is a change
    exclusive = target_of(Allocation(1, 1, 32, 0, nodes=("node2",)), settings)
    assert action_for(running, exclusive) == "change"
    shard = target_of(_shared(0.45), settings_from_mapping({}))
    assert action_for(running, shard) == "change"
    # a held job is updated to the round's share before its release
    held = _job(_state(Gres("mps", 40), "PENDING", "JobHeldUser"))
    assert not matches(held.slurm, moved) and action_for(held, moved) == "start"  # type: ignore[arg-type]


def test_a_shard_job_still_changes_with_its_count() -> None:
    running = _job(_state(Gres("shard", 1)))
    assert action_for(running, SlurmRequest(Gres("shard", 2), 1, ("node2",))) == "change"


def test_an_mps_job_holds_one_shared_gpu() -> None:
    current = current_of(_state(Gres("mps", 30)))
    assert (current.gpus, current.shared, current.nodes) == (1, True, ("node2",))


def test_a_stored_target_reads_back_every_kind() -> None:
    for gres in (Gres("gpu", 2), Gres("shard", 1), Gres("mps", 37)):
        request = SlurmRequest(gres=gres, num_nodes=1, nodes=("node2",))
        assert SlurmRequest.from_params(request.params()) == request
    with pytest.raises(ValueError, match="gpu, shard or mps"):
        SlurmRequest.from_params({"gres": "mig:1"})


def _capacity(*nodes: tuple[str, int, int]) -> PartitionCapacity:
    """Nodes of 4 GPUs with (name, shards, mps)."""
    return PartitionCapacity(
        "gpu", tuple(NodeCapacity(n, 4, 0, shards=s, mps=m) for n, s, m in nodes), ()
    )


def test_the_check_wants_every_node_to_offer_the_configured_kind() -> None:
    mps_nodes = _capacity(("n1", 0, 400), ("n2", 0, 400))
    assert check_sharing(_mps(), mps_nodes) == "GPUs shared by mps, 100 a GPU"
    with pytest.raises(Failed, match=r'sharing.gres = "shard" but node n1 .* offers gres/mps'):
        check_sharing(settings_from_mapping({}), mps_nodes)
    with pytest.raises(Failed, match="node n2 of partition gpu offers no shared GRES"):
        check_sharing(_mps(), _capacity(("n1", 0, 400), ("n2", 0, 0)))
    with pytest.raises(Failed, match=r"slurm.mps_per_gpu = 50 but node n1 has mps:400 for 4"):
        check_sharing(_mps(mps_per_gpu=50), mps_nodes)
    shard_nodes = _capacity(("n1", 8, 0))
    assert check_sharing(settings_from_mapping({}), shard_nodes) == "GPUs shared by shard, 2 a GPU"
    off = settings_from_mapping({"sharing": {"max_jobs_per_gpu": 1, "gres": "mps"}})
    assert check_sharing(off, shard_nodes).startswith("sharing off")


class _Pair:
    """Shares node2 between jobs 1 and 2, predicting 0.45 and 0.5 of the GPU."""

    name = "pair"

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        utils = {1: 0.45, 2: 0.5}
        return PolicyResult(
            {
                j.id: Allocation(j.id, 1, 32, 0, True, ("node2",), predicted_util=utils[j.id])
                for j in snapshot.jobs
            }
        )


def _plan(states: dict[str, SlurmJobState]) -> dict[int, SlurmRequest]:
    views = []
    for i in (1, 2):
        rec = JobRecord(
            i, f"j{i}", 0, "root", "running", 0.0, None, None, SPEC, (str(i),), Progress()
        )
        views.append(JobView(job=rec))
    cap = PartitionCapacity("gpu", (NodeCapacity("node2", 4, 0, mps=400),), ())
    snap = build_snapshot(
        store=StoreSnapshot(jobs=tuple(views), last_round=None), states=states, capacity=cap,
        now=1000.0,
    )  # fmt: skip
    return {j.job_id: j.target for j in tick(snap, _Pair(), _mps()).jobs}


def _running(i: int, gres: Gres) -> SlurmJobState:
    return SlurmJobState(str(i), "RUNNING", gres, 1, "node2", "None", 1, 0, "gpu", "", None)


def _held(i: int, gres: Gres) -> SlurmJobState:
    return SlurmJobState(str(i), "PENDING", gres, 1, "", "JobHeldUser", 1, 0, "gpu", "", None)


def test_a_job_joining_a_running_mps_job_fits_beside_its_kept_share() -> None:
    # both start: each asks for its own prediction
    both = _plan({"1": _held(1, Gres("gpu", 1)), "2": _held(2, Gres("gpu", 1))})
    assert (both[1].gres, both[2].gres) == (Gres("mps", 45), Gres("mps", 50))
    # job 1 runs with the 60 an earlier round gave it, and keeps it (no requeue for drift):
    # job 2 asks for the 40 left of the GPU, not its 50, else Slurm could not pair them
    joined = _plan({"1": _running(1, Gres("mps", 60)), "2": _held(2, Gres("gpu", 1))})
    assert (joined[1].gres, joined[2].gres) == (Gres("mps", 45), Gres("mps", 40))
    # a share that leaves enough room is asked for as predicted
    room = _plan({"1": _running(1, Gres("mps", 30)), "2": _held(2, Gres("gpu", 1))})
    assert room[2].gres == Gres("mps", 50)
