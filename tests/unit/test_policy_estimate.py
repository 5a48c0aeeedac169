"""The ICEFROG policy's per-job estimates: priors, measured models, psi, sharing (eq 3-16)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.sharing import PRIOR_UTIL
from icefrog_slurm.core.tuner import TunerChoice, TuneRow
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot
from icefrog_slurm.policies.estimate import Candidate, Estimator
from icefrog_slurm.protocol import GradStats, JobSpec, MetricReport
from icefrog_slurm.settings import Settings, settings_from_mapping

SETTINGS = settings_from_mapping({})
BEFORE_SAMPLES = settings_from_mapping({"sharing": {"before_samples": True}})
L = 4
SPEC = JobSpec(1, 8, 32, 64, 0.9, "acc", ">=", 0.9, 10, 10000, (1.0,) * L, (1.0,) * L)


def _sample(gpus: int, frozen: int, rate: float, shared: bool = False) -> ProfileSample:
    return ProfileSample(gpus, 64, frozen, shared, 0.0, 0.0, 0.0, gpus * 64 / rate, rate, 20e9, 0.4)


def _job(samples: tuple[ProfileSample, ...] = (), grad: GradStats | None = None) -> JobSnapshot:
    rec = JobRecord(1, "j", 0, "root", "pending", 0.0, None, None, SPEC, ("7",), Progress())
    return JobSnapshot(JobView(rec, samples, grad), None, Current())


def _cands(
    job: JobSnapshot, est: Estimator | None = None, settings: Settings = SETTINGS
) -> dict[tuple[int, bool], object]:
    est = est or Estimator()
    got = est.candidates(job, now=100.0, gpus_per_node=4, capacity=16, settings=settings)
    return {(c.gpus, c.shared): c for c in got}


def test_a_job_without_samples_gets_prior_options_without_freezing_or_sharing() -> None:
    cands = _cands(_job())  # sharing.before_samples is off by default
    assert set(cands) == {(1, False), (2, False), (3, False), (4, False), (8, False)}
    assert all(c.choice.frozen == 0 and c.tta_s > 100.0 for c in cands.values())  # type: ignore[attr-defined]


def test_a_job_that_never_ran_is_offered_a_shared_gpu_from_its_declared_tables() -> None:
    shared = _cands(_job(), settings=BEFORE_SAMPLES)[(1, True)]
    assert shared.load is not None and shared.load.util == PRIOR_UTIL  # type: ignore[attr-defined]
    # Its memory comes from the tables: too large a model for half a GPU gets no shared option.
    huge = replace(SPEC, layer_param_bytes=(6e9,) * L)  # 24 GB of weights, x4 with Adam
    rec = JobRecord(1, "j", 0, "root", "pending", 0.0, None, None, huge, ("7",), Progress())
    got = _cands(JobSnapshot(JobView(rec, (), None), None, Current()), settings=BEFORE_SAMPLES)
    assert (1, True) not in got and (1, False) in got


def test_a_job_with_samples_but_no_load_measured_is_not_offered_sharing() -> None:
    unmeasured = replace(_sample(1, 0, 400.0), peak_mem_bytes=0.0, gpu_util=-1.0)
    assert (1, True) not in _cands(_job((unmeasured,)))


def test_the_shared_option_picks_its_own_batch_within_its_part_of_the_gpu() -> None:
    # Measured: batch 64 is faster but uses 80 % of the GPU; batch 32 uses 40 %.
    samples = (
        ProfileSample(1, 64, 0, False, 0.0, 0.0, 0.0, 64 / 500, 500.0, 20e9, 0.8),
        ProfileSample(1, 32, 0, False, 0.0, 0.0, 0.0, 32 / 400, 400.0, 10e9, 0.4),
    )
    cands = _cands(_job(samples))
    assert cands[(1, False)].choice.batch == 64  # type: ignore[attr-defined]
    shared = cands[(1, True)]
    assert shared.choice.batch == 32 and abs(shared.load.util - 0.4) < 1e-6  # type: ignore[attr-defined]


def test_measured_freezing_with_low_penalty_is_chosen_and_sharing_offered() -> None:
    samples = (_sample(1, 0, 400.0), _sample(1, 2, 700.0), _sample(2, 0, 750.0))
    grad = GradStats(epoch=3, frozen=0, grad_var=(0.01, 0.01, 5.0, 5.0), grad_sqr=(1.0,) * L)
    cands = _cands(_job(samples, grad))
    one = cands[(1, False)]
    assert one.choice.frozen == 2 and one.choice.psi > 0.99  # type: ignore[attr-defined]
    shared = cands[(1, True)]
    assert shared.load is not None and shared.tta_s > one.tta_s  # type: ignore[attr-defined]


def test_high_penalty_keeps_layers_trainable() -> None:
    samples = (_sample(1, 0, 400.0), _sample(1, 2, 440.0))
    grad = GradStats(epoch=3, frozen=0, grad_var=(5.0, 5.0, 1.0, 1.0), grad_sqr=(1.0,) * L)
    assert _cands(_job(samples, grad))[(1, False)].choice.frozen == 0  # type: ignore[attr-defined]


def test_the_prior_is_dropped_once_the_job_measures_itself() -> None:
    est = Estimator()
    prior = _cands(_job(), est)[(1, False)].tta_s  # type: ignore[attr-defined]
    measured = _cands(_job((_sample(1, 0, 1000.0),)), est)[(1, False)].tta_s  # type: ignore[attr-defined]
    # P = 100,000 samples: 100 s at the measured 1000 samples/s (the tables' 4 FLOPs a
    # sample made the prior far faster: a few ms a step)
    assert abs(measured - 200.0) < 5.0 and prior < 150.0


def test_a_round_refits_at_most_its_budget_and_the_rest_keep_their_model() -> None:
    """A round fits at most its budget of models: first those of jobs that measured
    themselves but have none yet (oldest first), then the changed ones in the order asked."""
    est = Estimator()

    def jobs(extra: tuple[ProfileSample, ...]) -> list[JobSnapshot]:
        out = [_job((_sample(1, 0, 400.0 + i), _sample(2, 0, 700.0), *extra)) for i in range(3)]
        return [
            JobSnapshot(replace(j.view, job=replace(j.job, id=i)), None, Current())
            for i, j in enumerate(out)
        ]

    def round_(budget: int, snaps: list[JobSnapshot]) -> list[tuple[bool, bool]]:
        est.new_round(fit_budget=budget, jobs=snaps)
        for j in snaps:
            est.candidates(j, now=100.0, gpus_per_node=4, capacity=16, settings=SETTINGS)
        return [(est._cache[j.id].model is not None, est._cache[j.id].stale) for j in snaps]

    # (fitted, stale): the oldest new job gets the one fit, the others wait on the prior
    assert round_(1, jobs(())) == [(True, False), (False, True), (False, True)]
    changed = jobs((_sample(4, 0, 900.0),))  # each measured a new configuration
    # the next new job goes before the changed one that has a model
    assert round_(1, changed) == [(True, True), (True, False), (False, True)]
    assert round_(5, changed) == [(True, False)] * 3


def _stalling(frozen: int, epochs: int = 20) -> JobSnapshot:
    """A job that measured freezing 2 layers as much faster at a low penalty, holds
    ``frozen`` layers frozen, and whose accuracy peaked at epoch 5 and never beat it."""
    samples = (_sample(1, 0, 400.0), _sample(1, 2, 700.0), _sample(2, 0, 750.0))
    grad = GradStats(epoch=epochs, frozen=frozen, grad_var=(0.01, 0.01, 5.0, 5.0),
                     grad_sqr=(1.0,) * L)  # fmt: skip
    metrics = tuple(MetricReport(e, "acc", 0.8 if e == 5 else 0.7) for e in range(1, epochs + 1))
    job = _job(samples, grad)
    return replace(job, view=replace(job.view, metrics=metrics))


def test_a_job_whose_metric_stalls_while_frozen_trains_unfrozen_from_then_on() -> None:
    est = Estimator()
    # unfrozen, a stall is not freezing's doing: freezing is still offered and chosen
    assert _cands(_stalling(frozen=0), est)[(1, False)].choice.frozen == 2  # type: ignore[attr-defined]
    stuck = _cands(_stalling(frozen=2), est)
    assert all(c.choice.frozen == 0 for c in stuck.values())  # type: ignore[attr-defined]
    # it stays unfrozen when the metric moves again (the stall is remembered) ...
    moving = _stalling(frozen=0, epochs=22)
    moving = replace(moving, view=replace(moving.view, metrics=(
        *moving.view.metrics, MetricReport(23, "acc", 0.9))))  # fmt: skip
    assert all(c.choice.frozen == 0 for c in _cands(moving, est).values())  # type: ignore[attr-defined]
    # ... until the job is gone; the setting at 0 turns the net off
    est.forget(set())
    assert _cands(moving, est)[(1, False)].choice.frozen == 2  # type: ignore[attr-defined]
    off = settings_from_mapping({"policy": {"freeze_patience_epochs": 0}})
    assert _cands(_stalling(frozen=2), Estimator(), off)[(1, False)].choice.frozen == 2  # type: ignore[attr-defined]


def test_hostile_metric_reports_neither_break_the_estimate_nor_unfreeze_a_job() -> None:
    # A user's reports: epochs far out or negative, infinities and NaN; only finite values
    # of epochs >= 1 count, so nothing here amounts to a stall and freezing stays offered.
    job = _stalling(frozen=2, epochs=0)
    hostile = (MetricReport(10**18, "acc", math.inf), MetricReport(-5, "acc", -math.inf),
               *(MetricReport(e, "acc", math.nan) for e in range(1, 40)))  # fmt: skip
    job = replace(job, view=replace(job.view, metrics=hostile))
    est = Estimator()
    [(cands, reason)] = est.candidates_for([job], now=100.0, gpus_per_node=4, capacity=16,
                                           settings=SETTINGS)  # fmt: skip
    assert reason == "" and cands[0].choice.frozen == 2
    # the same job's later, honest stall still unfreezes it
    assert all(c.choice.frozen == 0 for c in _cands(_stalling(frozen=2), est).values())  # type: ignore[attr-defined]


def test_a_progress_report_near_the_float_limit_does_not_fail_the_estimate() -> None:
    """effective_samples_done = 1e308 after one sample makes the learning-curve fit's
    sample axis infinite (it raised LinAlgError, and the job was fitted again from nothing
    every round); those points are dropped and P falls back on the declared budget."""
    job = _stalling(frozen=0, epochs=6)
    record = replace(job.job, progress=Progress(samples_done=1, effective_samples_done=1e308))
    job = replace(job, view=replace(job.view, job=record))
    [(cands, reason)] = Estimator().candidates_for(
        [job], now=100.0, gpus_per_node=4, capacity=16, settings=SETTINGS
    )
    assert reason == "" and cands


def test_jobs_whose_estimate_fails_every_round_neither_refit_nor_take_the_fit_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight of one user's jobs, submitted first, whose estimates fail after their fits
    (any error nothing foresaw): each is fitted once, not again every round, and with the
    budget at 8 another user's job that measured itself still gets its model in the first
    round after theirs failed."""
    from icefrog_slurm.policies import estimate

    def snap(i: int) -> JobSnapshot:
        j = _job((_sample(1, 0, 400.0 + i), _sample(2, 0, 700.0)))
        return JobSnapshot(
            replace(j.view, job=replace(j.job, id=i, submit_time=i)), None, Current()
        )

    attackers, victim = [snap(i) for i in range(8)], snap(8)
    honest = estimate.remaining_samples

    def fails_for_attackers(job: JobSnapshot) -> float:
        if job.id < 8:
            raise RuntimeError("an error nothing foresaw")
        return honest(job)

    monkeypatch.setattr(estimate, "remaining_samples", fails_for_attackers)
    est = Estimator()
    fits = []
    for _ in range(3):
        est.new_round(fit_budget=8, jobs=[*attackers, victim])
        before = {i: est._cache[i].version if i in est._cache else 0 for i in range(9)}
        got = est.candidates_for([*attackers, victim], now=100.0, gpus_per_node=4, capacity=16,
                                 settings=SETTINGS)  # fmt: skip
        assert [r for _, r in got[:8]] == [
            "EstimateFailed: RuntimeError: an error nothing foresaw"
        ] * 8
        fits.append([est._cache[i].version - before[i] for i in range(9)])
    assert fits[0][:8] == [1] * 8  # the first round fits them (they are oldest)
    assert fits[1][:8] == fits[2][:8] == [0] * 8  # and never again: the models were kept
    assert [f[8] for f in fits] == [0, 1, 0]  # the victim: no budget left, then its fit
    assert est._cache[8].model is not None and not est._cache[8].prior
    assert got[8][1] == "" and got[8][0]


def test_a_flood_of_profile_configurations_is_bounded_and_off_spec_ones_ignored() -> None:
    """One user's reports of every configuration their declaration allows (825 of them,
    batch 32-64 one by one) and of configurations it does not (9 or 4096 GPUs of at most
    8, a batch of a million, 99 frozen of 4 layers): the job's history keeps the first
    MAX_CONFIGURATIONS in-spec ones, so each of its fits reads at most that many, and none
    of the others."""
    from icefrog_slurm.core.fit import MAX_CONFIGURATIONS

    def sample(gpus: int, batch: int, frozen: int) -> ProfileSample:
        return ProfileSample(gpus, batch, frozen, False, 0.0, 0.0, 0.0, 0.1, 0.0, 20e9, 0.4)

    off_spec = (sample(4096, 64, 0), sample(1, 10**6, 0), sample(2, 64, 99), sample(9, 64, 0))
    flood = tuple(
        sample(g, b, k) for g in (1, 2, 3, 4, 8) for b in range(32, 65) for k in range(L + 1)
    )
    assert len(flood) == 825 > MAX_CONFIGURATIONS
    est = Estimator()
    [(cands, reason)] = est.candidates_for(
        [_job((*off_spec, *flood))], now=100.0, gpus_per_node=4, capacity=16, settings=SETTINGS
    )
    kept = est._cache[1].history.samples
    assert len(kept) == MAX_CONFIGURATIONS and set(kept) <= set(flood)
    assert reason == "" and cands


def _varied_jobs() -> list[JobSnapshot]:
    """Jobs of every kind an estimate meets: on the prior, measured, with statistics that
    make freezing pay, with batch scaling's statistics, with a global batch, shared."""
    grad = GradStats(epoch=3, frozen=1, grad_var=(0.01, 0.02, 5.0, 4.0), grad_sqr=(0.5,) * L)
    measured = (_sample(1, 0, 400.0), _sample(1, 2, 650.0), _sample(2, 0, 700.0))
    fixed = replace(SPEC, global_batch=96)
    out = [_job(), _job(measured), _job(measured, grad), _job(measured[:1], grad)]
    rec = JobRecord(1, "g", 0, "root", "pending", 0.0, None, None, fixed, ("7",), Progress())
    out.append(JobSnapshot(JobView(rec, measured, grad), None, Current(2, False, ("n1",))))
    return [
        JobSnapshot(
            replace(j.view, job=replace(j.job, id=i, submit_time=float(i))), None, j.current
        )
        for i, j in enumerate(out)
    ]


Estimates = list[tuple[tuple[Candidate, ...], str]]


def _together(jobs: list[JobSnapshot], settings: Settings = SETTINGS) -> Estimates:
    """The jobs' candidates and reasons from one round's estimate of all of them."""
    est = Estimator()
    return est.candidates_for(jobs, now=100.0, gpus_per_node=4, capacity=16, settings=settings)


def _alone(jobs: list[JobSnapshot], settings: Settings = SETTINGS) -> Estimates:
    """Each job's candidates from an estimator of its own, with no reason (it did not fail)."""
    return [
        (Estimator().candidates(j, now=100.0, gpus_per_node=4, capacity=16, settings=settings), "")
        for j in jobs
    ]


def test_a_round_s_jobs_tuned_together_get_what_each_gets_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import icefrog_slurm.policies.estimate as estimate

    passes: list[int] = []
    real = estimate._tune

    def counted(prepared: list[object]) -> None:
        passes.append(len(prepared))
        real(prepared)  # type: ignore[arg-type]

    monkeypatch.setattr(estimate, "_tune", counted)
    jobs = _varied_jobs()
    paper = settings_from_mapping({"policy": {"batch_scaling": False}})
    for settings in (SETTINGS, BEFORE_SAMPLES, paper):
        together = _together(jobs, settings)
        assert together == _alone(jobs, settings) and all(cands for cands, _ in together)
        assert len({c[0][0].choice for c in together}) > 1  # the jobs differ
        assert passes[-len(jobs) - 1] == len(jobs)  # one pass for the round, then each alone


def test_a_job_whose_tuning_fails_waits_alone_while_the_others_are_tuned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job whose options break the round's one tuning pass (here: any row of the job that
    holds 1 frozen layer) gets its reason; every other job is tuned as it would be alone."""
    import icefrog_slurm.policies.estimate as estimate

    real = estimate.tune_rows

    def breaks_on_one_job(rows: list[TuneRow]) -> list[TunerChoice | None]:
        if any(r.current_frozen == 1 and len(r.batch_sizes) > 1 for r in rows):
            raise ValueError("a hostile grid")
        return real(rows)

    monkeypatch.setattr(estimate, "tune_rows", breaks_on_one_job)
    jobs = _varied_jobs()
    got = _together(jobs)
    failed = [i for i, (cands, reason) in enumerate(got) if reason]
    assert failed == [2, 3]  # the two free-batch jobs holding 1 frozen layer
    assert all(got[i][1] == "EstimateFailed: ValueError: a hostile grid" for i in failed)
    assert all(got[i][0] == () for i in failed)
    monkeypatch.setattr(estimate, "tune_rows", real)
    assert [got[i] for i in (0, 1, 4)] == _alone([jobs[i] for i in (0, 1, 4)])


def test_a_job_declaring_a_thousand_layers_does_not_swell_the_round_s_arrays() -> None:
    """A hostile declaration (1000 layers, every depth up to 90 % legal, 31 batch sizes)
    is tuned in the round with the other jobs: the round's working memory is that of the
    jobs themselves, about 40 MB (no job's arrays padded to its size: that would take over
    150 MB here) and every other job gets what it gets alone."""
    import tracemalloc

    layers = 1000
    big = replace(SPEC, min_batch=1, max_batch=2**30, layer_flops=(1.0,) * layers,
                  layer_param_bytes=(1.0,) * layers)  # fmt: skip
    grad = GradStats(epoch=3, frozen=0, grad_var=tuple(0.01 * (i % 7 + 1) for i in range(layers)),
                     grad_sqr=(0.5,) * layers)  # fmt: skip
    rec = JobRecord(99, "big", 0, "root", "pending", 0.0, None, None, big, ("9",), Progress())
    hostile = JobSnapshot(JobView(rec, (_sample(1, 0, 400.0),), grad), None, Current())
    template = _varied_jobs()[2]
    jobs = [
        JobSnapshot(replace(template.view, job=replace(template.job, id=i)), None, Current())
        for i in range(20)
    ]
    tracemalloc.start()
    try:
        got = _together([*jobs, hostile])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 80e6, peak
    assert got[-1][1] == "" and got[-1][0]  # the big job is estimated too
    assert got[:-1] == _alone(jobs)


def test_a_job_declaring_the_most_layers_is_tuned_over_a_bounded_set_of_depths() -> None:
    """4096 layers, every depth up to 90 % legal (3687 depths), 31 batch sizes, on 64 GPUs:
    the job is tuned over MAX_DEPTHS depths spread from 0 to its deepest and the one it
    trains at now, so the round's peak memory for it is about 23 MB, not the 142 MB its
    every depth took (1.9 GB and 10 s on 1024 GPUs, 68 MB and 0.4 s now)."""
    import tracemalloc

    from icefrog_slurm.core.tuner import MAX_DEPTHS

    layers, now_at = 4096, 1001
    big = replace(SPEC, min_batch=1, max_batch=2**30, layer_flops=(1.0,) * layers,
                  layer_param_bytes=(1.0,) * layers, max_gpus=64)  # fmt: skip
    grad = GradStats(epoch=3, frozen=now_at, grad_var=(1e-6,) * layers, grad_sqr=(0.5,) * layers)
    rec = JobRecord(99, "big", 0, "root", "running", 0.0, None, None, big, ("9",), Progress())
    job = JobSnapshot(JobView(rec, (_sample(1, 0, 400.0),), grad), None, Current())
    est = Estimator()
    tracemalloc.start()
    try:
        got = est.candidates(job, now=100.0, gpus_per_node=4, capacity=64, settings=SETTINGS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50e6, peak
    depths = {c.choice.frozen for c in got}
    assert got and all(c.choice.frozen <= 0.9 * layers for c in got)
    assert len(depths) <= MAX_DEPTHS


def test_spread_depths_keeps_the_ends_and_the_current_depth() -> None:
    from icefrog_slurm.core.tuner import spread_depths

    depths = tuple(range(0, 3687))
    got = spread_depths(depths, keep=1001, most=128)
    assert got[0] == 0 and got[-1] == 3686 and 1001 in got
    assert len(got) == 129 and got == tuple(sorted(set(got)))
    gaps = [b - a for a, b in itertools.pairwise(got)]
    assert max(gaps) <= 30  # evenly spread: about 3686 / 127 apart
    assert spread_depths(depths[:100], keep=5, most=128) == depths[:100]  # fewer: all kept
    assert spread_depths(depths, keep=7, most=128) != spread_depths(depths, most=128)
    assert 7 not in spread_depths(depths, most=128)


def test_huge_reported_statistics_neither_warn_nor_break_the_round_s_pass() -> None:
    """A job's report may hold any finite numbers: squared norms near the float limit make
    its sums overflow to inf (as a loop over its layers would) without a warning, and the
    round's one pass still tunes it and every other job as each would be alone."""
    huge = GradStats(epoch=3, frozen=0, grad_var=(0.01, 0.02, 5.0, 4.0), grad_sqr=(1e308,) * L)
    jobs = _varied_jobs()
    jobs[1] = replace(jobs[1], view=replace(jobs[1].view, grad_stats=huge))
    got = _together(jobs)
    assert got == _alone(jobs) and all(cands for cands, _ in got)


def test_a_job_registered_again_every_round_with_new_layers_leaves_nothing_behind() -> None:
    """A user's job registers again each round with another layer table (a register is
    taken at any time): its prior model follows the new table, and the estimator keeps the
    prior models and tables of the live jobs' current specs only (it kept one more a round,
    about 0.8 MB each at 4096 layers, until the daemon ran out of memory)."""
    from icefrog_slurm.core.parallelism import DDP, Kind, Parallelism

    est = Estimator()
    models = []
    for r in range(30):
        flops = tuple(1.0 + r + i % 3 for i in range(L))
        kind = DDP if r % 2 else Parallelism(Kind.SDP)  # the model it fits changes too
        spec = replace(SPEC, layer_flops=flops, parallelism=kind)
        rec = JobRecord(1, "j", 0, "root", "pending", 0.0, None, None, spec, ("7",), Progress())
        job = JobSnapshot(JobView(rec, (), None), None, Current())
        est.forget({1})  # each round starts so (IcefrogPolicy.decide)
        assert est.candidates(job, now=100.0, gpus_per_node=4, capacity=16, settings=SETTINGS)
        models.append(est._cache[1].model)
        assert len(est._priors) <= 2 and len(est._tables) <= 2  # this round's and the last
    assert len({id(m) for m in models}) == 30  # each table's own prior model
