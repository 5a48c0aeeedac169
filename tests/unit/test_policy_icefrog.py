"""IcefrogPolicy on small snapshots: one decision a job, capacity kept, shared pairs on one
node, a reason for each waiting job, foreign-held nodes left out, running jobs kept."""

from __future__ import annotations

import pytest

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.cluster import NodeCapacity, PartitionCapacity
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot, Snapshot
from icefrog_slurm.policies.icefrog import IcefrogPolicy
from icefrog_slurm.protocol import GradStats, JobSpec
from icefrog_slurm.settings import settings_from_mapping

SETTINGS = settings_from_mapping({})
L = 4


def _spec(min_gpus: int = 1, max_gpus: int = 4) -> JobSpec:
    return JobSpec(
        min_gpus, max_gpus, 32, 64, 0.9, "acc", ">=", 0.9, 5, 20000, (1.0,) * L, (1.0,) * L
    )


def _small(i: int, util: float = 0.3) -> tuple[ProfileSample, ...]:
    return tuple(
        ProfileSample(g, 64, 0, False, 0.0, 0.0, 0.0, g * 64 / r, r, 10e9, util)
        for g, r in ((1, 500.0 + i), (2, 560.0), (4, 600.0))
    )


def _job(
    i: int, spec: JobSpec, samples: tuple[ProfileSample, ...] = (), cur: Current | None = None
) -> JobSnapshot:
    cur = cur or Current()
    rec = JobRecord(
        i,
        f"j{i}",
        0,
        "root",
        "running" if cur.gpus else "pending",
        float(i),
        None,
        None,
        spec,
        (str(i),),
        Progress(),
    )
    grad = GradStats(1, 0, (1.0,) * L, (1.0,) * L)
    return JobSnapshot(JobView(rec, samples, grad), None, cur)


def _snap(jobs: list[JobSnapshot], foreign: int = 0) -> Snapshot:
    nodes = (NodeCapacity("node1", 4, foreign), NodeCapacity("node2", 4, 0))
    return Snapshot(
        time=1000.0, jobs=tuple(jobs), capacity=PartitionCapacity("gpu", nodes, ()), last_round=None
    )


def _check(snapshot: Snapshot) -> dict[int, object]:
    result = IcefrogPolicy().decide(snapshot, settings=SETTINGS)
    assert set(result.allocations) == {j.id for j in snapshot.jobs}
    used: dict[str, float] = {}
    for a in result.allocations.values():
        if a.gpus:
            assert a.nodes and a.batch in (32, 64)
            for n in a.nodes:
                used[n] = used.get(n, 0) + (0.5 if a.shared else a.gpus / len(a.nodes))
        else:
            assert a.job_id in result.reasons
    assert all(v <= 4 for v in used.values())
    return dict(result.allocations)


def test_every_job_decided_within_capacity() -> None:
    jobs = [_job(i, _spec(), _small(i)) for i in range(1, 7)]
    allocs = _check(_snap(jobs))
    assert sum(a.gpus for a in allocs.values() if not a.shared) <= 8  # type: ignore[attr-defined]


def test_a_node_partly_held_by_a_foreign_job_is_not_planned() -> None:
    jobs = [_job(i, _spec(), _small(i)) for i in range(1, 4)]
    allocs = _check(_snap(jobs, foreign=1))
    assert all("node1" not in a.nodes for a in allocs.values())  # type: ignore[attr-defined]


def test_a_node_whose_gpus_a_foreign_jobs_memory_blocks_is_not_planned() -> None:
    """A foreign job holding no GPU but the node's memory (or cores) leaves its GPUs
    unusable: the node is not whole, as if the job held GPUs."""
    jobs = [_job(i, _spec(), _small(i)) for i in range(1, 4)]
    nodes = (NodeCapacity("node1", 4, 0, blocked_gpus=4, blocked_by="memory"),)
    nodes += (NodeCapacity("node2", 4, 0),)
    snapshot = Snapshot(
        time=1000.0, jobs=tuple(jobs), capacity=PartitionCapacity("gpu", nodes, ()), last_round=None
    )
    allocs = _check(snapshot)
    assert all("node1" not in a.nodes for a in allocs.values())  # type: ignore[attr-defined]


def test_overload_packs_small_jobs_onto_shared_gpus_on_one_node() -> None:
    jobs = [_job(i, _spec(1, 1), _small(i, util=0.3)) for i in range(1, 13)]
    allocs = _check(_snap(jobs))
    shared = [a for a in allocs.values() if a.shared]  # type: ignore[attr-defined]
    assert shared and all(len(a.nodes) == 1 for a in shared)  # type: ignore[attr-defined]
    # each carries eq 8's prediction: an mps job's share and its MPS limits come from it
    for a in shared:
        assert 0 < a.predicted_util <= 1 and a.predicted_mem_bytes > 0  # type: ignore[attr-defined]


def test_a_job_without_samples_gets_the_prior_and_runs() -> None:
    allocs = _check(_snap([_job(1, _spec(2, 4))]))
    assert allocs[1].gpus >= 2  # type: ignore[attr-defined]


def _rounds(
    policy: IcefrogPolicy, jobs: list[JobSnapshot], settings: object, n: int
) -> list[set[int]]:
    """Run n rounds 300 s apart; each round the jobs hold what the last one gave them."""
    ran = []
    for r in range(n):
        snap = _snap(jobs)
        snap = Snapshot(snap.time + 300 * r, snap.jobs, snap.capacity, None)
        allocs = policy.decide(snap, settings=settings).allocations  # type: ignore[arg-type]
        jobs = [
            _job(j.id, j.job.spec, j.view.samples, Current(1, False, allocs[j.id].nodes))
            if allocs[j.id].gpus else _job(j.id, j.job.spec, j.view.samples)
            for j in jobs
        ]  # fmt: skip
        ran.append({i for i, a in allocs.items() if a.gpus})
    return ran


def test_a_full_cluster_keeps_its_running_jobs_round_after_round() -> None:
    jobs = [_job(i, _spec(1, 1), _small(0, util=0.9)) for i in range(1, 13)]
    ran = _rounds(IcefrogPolicy(), jobs, SETTINGS, 3)
    assert len(ran[0]) == 8 and ran[0] == ran[1] == ran[2]


def test_aging_lets_a_waiting_job_in_eventually() -> None:
    eager = settings_from_mapping(
        {"solver": {"starvation_grace_rounds": 0, "starvation_rounds": 1}}
    )
    jobs = [_job(i, _spec(1, 1), _small(0, util=0.9)) for i in range(1, 13)]
    ran = _rounds(IcefrogPolicy(), jobs, eager, 3)
    assert len(ran[0]) == 8 and ran[1] != ran[0]  # the waiting ones rotate in


def test_one_poisoned_job_waits_with_its_reason_and_the_others_are_decided() -> None:
    """An empty layer table and an invalid one each make only that job wait
    ("EstimateFailed: ..."); the round goes on for the good jobs."""
    empty = JobSpec(1, 4, 32, 64, 0.9, "acc", ">=", 0.9, 5, 20000, (), ())
    invalid = JobSpec(1, 4, 32, 64, 0.9, "acc", ">=", 0.9, 5, 20000, (1.0, -1.0), (1.0, 1.0))
    good = [_job(i, _spec(), _small(i)) for i in (1, 2, 3)]
    bad = [_job(4, empty), _job(5, invalid)]
    policy = IcefrogPolicy()
    result = policy.decide(_snap(good + bad), settings=SETTINGS)
    assert set(result.allocations) == {j.id for j in good + bad}
    for j in bad:
        assert result.allocations[j.id].gpus == 0
        assert result.reasons[j.id].startswith("EstimateFailed: "), result.reasons[j.id]
    assert "InputError" in result.reasons[4] and "InputError" in result.reasons[5]
    assert sum(result.allocations[j.id].gpus for j in good) > 0
    assert all(result.allocations[j.id].gpus > 0 for j in good)
    # the failed jobs' models are not cached: a fixed job is estimated afresh next round
    assert 4 not in policy.estimator._cache and 5 not in policy.estimator._cache


def test_a_fit_that_raises_fails_only_its_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from icefrog_slurm.core.fit import ProfileHistory

    real = ProfileHistory.model

    def model(self: ProfileHistory) -> object:
        if any(s.samples_per_s == 777.0 for s in self.samples):
            raise FloatingPointError("fit diverged")
        return real(self)

    monkeypatch.setattr(ProfileHistory, "model", model)
    poisoned = tuple(
        ProfileSample(g, 64, 0, False, 0.0, 0.0, 0.0, g * 64 / 777.0, 777.0, 10e9, 0.3)
        for g in (1, 2, 4)
    )
    good = [_job(i, _spec(), _small(i)) for i in (1, 2)]
    result = IcefrogPolicy().decide(_snap([*good, _job(3, _spec(), poisoned)]), settings=SETTINGS)
    assert result.reasons[3] == "EstimateFailed: FloatingPointError: fit diverged"
    assert result.allocations[3].gpus == 0
    assert all(result.allocations[j.id].gpus > 0 for j in good)


def test_a_move_that_saves_less_than_its_share_of_the_remaining_time_is_forbidden() -> None:
    from icefrog_slurm.core.solver import Holding, JobRequest, Option
    from icefrog_slurm.policies.icefrog import unpaid_moves

    # Running on 2 GPUs: TTA 1000 s at age 400 s, so 600 s remain there.
    options = (
        Option(1, 1300.0),  # slower: a move to give GPUs to others, the solver's to decide
        Option(2, 1000.0),  # what it holds
        Option(4, 950.0),  # 50 s sooner after its restart: < 10 % of 600 s
        Option(8, 900.0),  # 100 s sooner: >= 60 s, pays
    )
    req = JobRequest("7", options, current=Holding(gpus=2, nodes=(("n1", 2),)))
    assert unpaid_moves(req, age_s=400.0, min_gain=0.1) == {("7", 2)}
    assert unpaid_moves(req, age_s=400.0, min_gain=0.2) == {("7", 2), ("7", 3)}
    assert unpaid_moves(req, age_s=400.0, min_gain=0.0) == set()
    waiting = JobRequest("8", options)  # nothing held: nothing to keep
    assert unpaid_moves(waiting, age_s=400.0, min_gain=0.5) == set()


def test_hysteresis_keeps_a_running_job_whose_move_would_save_little(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from icefrog_slurm.core.tuner import TunerChoice
    from icefrog_slurm.policies.estimate import Candidate, Estimator

    # One job on 2 GPUs of an otherwise empty cluster, submitted at 1 s, decided at 1000 s:
    # 4 GPUs would finish it 100 s sooner of the 3000 s it has left on 2 (3.3 %).
    def fixed(
        self: Estimator, jobs: list[JobSnapshot], **_: object
    ) -> list[tuple[tuple[Candidate, ...], str]]:
        choice = TunerChoice(64, 0, 1.0, 100.0, 100.0)
        return [((Candidate(2, False, choice, 3999.0), Candidate(4, False, choice, 3899.0)), "")]

    monkeypatch.setattr(Estimator, "candidates_for", fixed)
    job = _job(1, _spec(1, 8), _small(0), Current(2, False, ("node1",)))
    kept = IcefrogPolicy().decide(_snap([job]), settings=settings_from_mapping({}))
    loose = settings_from_mapping({"solver": {"move_min_gain": 0.03}})
    moved = IcefrogPolicy().decide(_snap([job]), settings=loose)
    assert kept.allocations[1].gpus == 2  # the default 10 % is not reached: it stays
    assert moved.allocations[1].gpus == 4  # 3 % is: it moves
