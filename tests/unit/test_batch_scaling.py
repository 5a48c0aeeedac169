"""Batch scaling (``[policy] batch_scaling``, spec section 15): Pollux's statistical
efficiency (core/goodput.py) weighs the Layer Tuner's E, for ICEFROG only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from icefrog_slurm.commands.simulate import adapts_batch
from icefrog_slurm.core.goodput import (
    efficiency,
    efficiency_grid,
    efficiency_of_sums,
    trainable_sums,
)
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.tuner import tune_grid
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot
from icefrog_slurm.policies.baseline import JobOptions
from icefrog_slurm.policies.estimate import Estimator
from icefrog_slurm.policies.pollux_plus import PolluxPlusPolicy, goodput
from icefrog_slurm.protocol import GradStats, JobSpec
from icefrog_slurm.settings import Settings, settings_from_mapping

L = 4
SPEC = JobSpec(1, 4, 32, 64, 0.9, "acc", ">=", 0.9, 10, 10000, (1.0,) * L, (1.0,) * L)
ON = settings_from_mapping({"policy": {"batch_scaling": True}})  # batch and layer elasticity
OFF = settings_from_mapping({"policy": {"batch_scaling": False}})  # the paper's protocol
# the squared norm dominates the variance: a doubled batch is worth little more than one
LOW_NOISE = GradStats(epoch=3, frozen=0, grad_var=(0.01,) * L, grad_sqr=(1.0,) * L)


def test_efficiency_grid_is_the_scalar_over_the_layers_that_train() -> None:
    var, sqr = (4.0, 2.0, 1.0), (0.5, 0.25, 0.25)
    grid = efficiency_grid(grad_var=var, grad_sqr=sqr, frozen_candidates=(0, 2),
                           global_batches=(64, 256), base_batch=64)  # fmt: skip
    for i, batch in enumerate((64, 256)):
        for j, k in enumerate((0, 2)):
            want = efficiency(var=sum(var[k:]), sqr=sum(sqr[k:]), batch=batch, base_batch=64)
            assert grid[i, j] == pytest.approx(want)
    assert grid[0].tolist() == pytest.approx([1.0, 1.0])  # the base batch is worth 1
    assert 0 < grid[1, 0] < 1 and grid[1, 0] != pytest.approx(grid[1, 1])
    # no statistics to judge by: 1, never nan
    zero = efficiency_grid(grad_var=(0.0,), grad_sqr=(0.0,), frozen_candidates=(0,),
                           global_batches=(0, 512), base_batch=64)  # fmt: skip
    assert zero.tolist() == [[1.0], [1.0]]


def test_many_jobs_summed_and_judged_at_once_get_each_job_s_own_floats() -> None:
    """Jobs of different depths padded into one array: the trainable layers' sums equal a
    loop over each job's layers in order, and the efficiency grids equal one job at a time,
    to the last bit."""
    rng = np.random.default_rng(7)
    jobs = []
    for layers in (3, 7, 1, 12, 5):
        var = tuple((rng.uniform(0, 2, layers) * 10.0 ** rng.integers(-9, 9, layers)).tolist())
        sqr = tuple(rng.uniform(0, 1, layers).tolist())
        frozen = tuple(sorted({0, *rng.integers(0, layers + 1, 3).tolist()}))
        batches = tuple(int(b) for b in rng.choice([16, 64, 256, 1024], 3))
        jobs.append((var, sqr, frozen, batches, 32 if not jobs else int(rng.choice([0, 32]))))
    n, width = len(jobs), max(len(j[0]) for j in jobs)
    depth = max(len(j[2]) for j in jobs)
    grad_var, grad_sqr = np.zeros((n, width)), np.zeros((n, width))
    frozen_at = np.full((n, depth), width)
    batch, base = np.zeros((n, 3)), np.zeros(n)
    for r, (var, sqr, frozen, batches, base_batch) in enumerate(jobs):
        grad_var[r, : len(var)], grad_sqr[r, : len(sqr)] = var, sqr
        frozen_at[r, : len(frozen)], batch[r], base[r] = frozen, batches, base_batch
    var_sums, sqr_sums = trainable_sums(grad_var, grad_sqr, frozen_at)
    every = efficiency_of_sums(var=var_sums, sqr=sqr_sums, global_batches=batch, base_batch=base)
    for r, (var, sqr, frozen, batches, base_batch) in enumerate(jobs):
        k = len(frozen)
        looped = [0.0] * k
        for j, first in enumerate(frozen):
            for x in var[first:]:
                looped[j] += x
        assert var_sums[r, :k].tolist() == looped
        assert var_sums[r, k:].tolist() == [0.0] * (depth - k)
        alone = trainable_sums(var, sqr, frozen)
        assert alone[0].tolist() == looped and alone[1].tolist() == sqr_sums[r, :k].tolist()
        one = efficiency_of_sums(var=alone[0], sqr=alone[1], global_batches=batches,
                                 base_batch=base_batch)  # fmt: skip
        assert every[r, :, :k].tolist() == one.tolist()
    assert (every < 1.0).any()  # batches above the base are worth less: not all ones


def test_the_sums_of_a_job_with_thousands_of_layers_stay_within_their_working_memory() -> None:
    """A declaration may carry 4096 layers and thousands of depths (15 million (depth, layer)
    cells): the sums are taken a block of depths at a time, so the working arrays stay
    within ``SUM_CELLS`` (about 40 MB; all at once would be about 500 MB), each column the
    loop's float."""
    import tracemalloc

    layers = 4096
    var = [0.5 + (i % 13) * 1e-3 for i in range(layers)]
    sqr = [1e-6 * (i % 5) for i in range(layers)]
    frozen = list(range(0, 3687))
    tracemalloc.start()
    try:
        got_var, got_sqr = trainable_sums(var, sqr, frozen)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 60e6, peak
    assert got_var.tolist() == [sum(var[k:]) for k in frozen]
    assert got_sqr.tolist() == [sum(sqr[k:]) for k in frozen]


def test_the_tuner_maximises_goodput_when_given_an_efficiency() -> None:
    args = {"batch_sizes": (32, 64), "frozen_candidates": (0,), "psi": np.array([1.0]),
            "throughput": np.array([[400.0], [700.0]])}  # fmt: skip
    plain = tune_grid(**args)  # type: ignore[arg-type]
    assert plain is not None and plain.batch == 64 and plain.effective_progress == 700.0
    scaled = tune_grid(**args, efficiency=np.array([[1.0], [0.5]]))  # type: ignore[arg-type]
    assert scaled is not None and scaled.batch == 32
    assert scaled.effective_progress == pytest.approx(400.0)
    mild = tune_grid(**args, efficiency=np.array([[1.0], [0.9]]))  # type: ignore[arg-type]
    assert mild is not None and mild.batch == 64
    assert mild.effective_progress == pytest.approx(630.0) and mild.throughput == 700.0


def _job(spec: JobSpec = SPEC) -> JobSnapshot:
    samples = tuple(
        ProfileSample(1, m, 0, False, 0.0, 0.0, 0.0, m / rate, rate, 20e9, 0.4)
        for m, rate in ((32, 400.0), (64, 700.0))
    )
    rec = JobRecord(1, "j", 0, "root", "pending", 0.0, None, None, spec, ("7",), Progress())
    return JobSnapshot(JobView(rec, samples, LOW_NOISE), None, Current())


def _choice(
    est: Estimator, settings: Settings, job: JobSnapshot | None = None, gpus: int = 1
) -> tuple[int, float]:
    """The tuner's batch at ``gpus`` exclusive GPUs and its E / (psi x T): the efficiency."""
    got = est.candidates(job or _job(), now=100.0, gpus_per_node=4, capacity=4,
                         settings=settings)  # fmt: skip
    c = next(c.choice for c in got if (c.gpus, c.shared) == (gpus, False))
    return c.batch, c.effective_progress / (c.psi * c.throughput)


def test_batch_and_layer_elasticity_together_are_the_default() -> None:
    assert Settings().policy.batch_scaling
    assert _choice(Estimator(), Settings()) == _choice(Estimator(), ON)


def test_icefrog_with_batch_scaling_keeps_the_batch_whose_samples_are_worth_more() -> None:
    assert _choice(Estimator(), OFF) == (64, 1.0)
    assert _choice(Estimator(), ON) == (32, pytest.approx(1.0))
    # at 2 GPUs even the smallest per-GPU batch doubles the global batch: efficiency < 1
    batch, eff = _choice(Estimator(), ON, gpus=2)
    assert batch == 32 and eff < 0.6
    assert _choice(Estimator(), OFF, gpus=2)[1] == 1.0


def test_baselines_and_fixed_global_batches_ignore_batch_scaling() -> None:
    assert _choice(Estimator(freezing="freezeout", batch_scaling=False), ON) == (64, 1.0)
    assert _choice(Estimator(), ON, _job(replace(SPEC, global_batch=64))) == (64, 1.0)


def test_under_the_paper_protocol_icefrog_adapts_the_batch_only_with_batch_scaling() -> None:
    assert adapts_batch("pollux+", OFF) and adapts_batch("pollux+", ON)
    assert not adapts_batch("icefrog", OFF) and adapts_batch("icefrog", ON)
    assert not adapts_batch("optimus+", ON) and not adapts_batch("lucid+", ON)


def test_pollux_plus_picks_the_batch_of_the_best_goodput_at_each_allocation() -> None:
    """As AdaptDL re-optimises the batch for every allocation: the larger batch's higher
    throughput does not pay for its lower efficiency here, whatever the settings say."""
    est = PolluxPlusPolicy().estimator
    for settings in (ON, OFF):
        assert _choice(est, settings) == _choice(Estimator(), ON) == (32, pytest.approx(1.0))
    job = _job()
    got = est.candidates(job, now=100.0, gpus_per_node=4, capacity=4, settings=OFF)
    exclusive = {c.gpus: c for c in got if not c.shared}
    # goodput is the tuner's E x efficiency, the value Pollux+'s speedups are made of
    two = exclusive[2].choice
    assert goodput(JobOptions(job, exclusive, None), 2) == two.effective_progress
    assert two.effective_progress < 0.6 * two.psi * two.throughput
