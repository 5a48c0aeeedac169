"""Remaining work P (eq 1, 16): the declared budget, then a learning curve fitted to the
job's validation reports, never 0 before the target; done work in P's units; the catalog's
budgets large enough for every task's own truth; the simulated jobs' learning curves; when
a metric has stalled."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from icefrog_slurm.core.tta import (
    FIT_AFTER_BUDGET_FRACTION,
    MIN_METRIC_POINTS,
    MIN_REMAINING_FRACTION,
    fit_learning_curve,
    remaining_work,
    stalled,
)
from icefrog_slurm.errors import InputError
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.jobs import Config, MetricShape, SimJob, metric_curve
from icefrog_slurm.sim.truth import JOB_WORK_NOISE, TaskTruth
from icefrog_slurm.sim.workload import TraceJob

SPE = 50_000
BUDGET = 100.0 * SPE


def _hyperbola(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return np.asarray(a - 1.0 / (b * x + c), dtype=float)


def test_the_fit_finds_where_a_curve_of_its_form_reaches_the_target() -> None:
    a, b, c = 0.97, 2e-5, 1.2
    x = np.arange(1, 31, dtype=float) * SPE
    target = 0.95  # reached at x = (1/(a - t) - c) / b
    expected = (1 / (a - target) - c) / b
    got = fit_learning_curve(x, _hyperbola(x, a, b, c), target=target, higher_is_better=True)
    assert got == pytest.approx(expected, rel=0.02)
    # the same curve mirrored (a loss falling toward its floor)
    lower = fit_learning_curve(x, -_hyperbola(x, a, b, c), target=-target, higher_is_better=False)
    assert lower == pytest.approx(expected, rel=0.02)


def test_a_curve_that_flattens_below_the_target_never_reaches_it() -> None:
    x = np.arange(1, 31, dtype=float) * SPE
    y = _hyperbola(x, 0.90, 2e-5, 1.2)  # asymptote 0.90
    assert fit_learning_curve(x, y, target=0.95, higher_is_better=True) is None


def test_p_is_the_declared_budget_until_half_of_it_is_done() -> None:
    metrics = [(e, 0.5 + 0.004 * e) for e in range(1, 40)]
    done = (FIT_AFTER_BUDGET_FRACTION * BUDGET) - 1.0
    p = remaining_work(budget=BUDGET, done=done, samples_done=done, samples_per_epoch=SPE,
                       metrics=metrics, target=0.94, higher_is_better=True)  # fmt: skip
    assert p == BUDGET - done


def test_p_never_reaches_zero_before_the_target() -> None:
    """Budget spent, the metric short of the target and still rising: P is what the fitted
    curve says is left, and at least a fraction of the work done."""
    a, b, c = 0.97, 1e-6, 1.0
    epochs = range(1, 121)  # 120 epochs done of a 100-epoch budget
    metrics = [(e, float(_hyperbola(np.array([e * SPE]), a, b, c)[0])) for e in epochs]
    done = 120.0 * SPE
    target = 0.96  # (1/0.01 - 1) / 1e-6 = 99M samples: far beyond
    p = remaining_work(budget=BUDGET, done=done, samples_done=done, samples_per_epoch=SPE,
                       metrics=metrics, target=target, higher_is_better=True)  # fmt: skip
    assert p > 0
    assert p >= MIN_REMAINING_FRACTION * done
    assert p <= 2 * BUDGET  # capped
    # a curve that has (nearly) reached the target: the floor, never 0
    near = [(e, 0.94 + 0.0001 * e) for e in epochs]
    p = remaining_work(budget=BUDGET, done=done, samples_done=done, samples_per_epoch=SPE,
                       metrics=near, target=0.94, higher_is_better=True)  # fmt: skip
    assert p == pytest.approx(MIN_REMAINING_FRACTION * done)


def test_too_few_reports_keep_the_declared_budget_and_bad_input_is_refused() -> None:
    done = 0.8 * BUDGET
    few = [(e, 0.5 + 0.01 * e) for e in range(1, MIN_METRIC_POINTS)]  # one too few
    nan = [(e, math.nan) for e in range(1, 50)]
    for metrics in (few, nan, []):
        p = remaining_work(budget=BUDGET, done=done, samples_done=done, samples_per_epoch=SPE,
                           metrics=metrics, target=0.94, higher_is_better=True)  # fmt: skip
        assert p == BUDGET - done
    with pytest.raises(InputError, match="done"):
        remaining_work(budget=BUDGET, done=-1.0, samples_done=0.0, samples_per_epoch=SPE,
                       metrics=[], target=0.94, higher_is_better=True)  # fmt: skip


def test_the_reports_are_placed_at_effective_samples() -> None:
    """Epoch e's report sits at e x samples/epoch x (effective / physical so far): the same
    physical history counted at half the effective rate reaches the target at half the
    effective samples."""
    a, b, c = 0.97, 1e-6, 1.0
    metrics = [(e, float(_hyperbola(np.array([e * SPE]), a, b, c)[0])) for e in range(1, 80)]
    phys = 79.0 * SPE
    full = remaining_work(budget=BUDGET, done=phys, samples_done=phys, samples_per_epoch=SPE,
                          metrics=metrics, target=0.955, higher_is_better=True)  # fmt: skip
    half = remaining_work(budget=BUDGET / 2, done=phys / 2, samples_done=phys,
                          samples_per_epoch=SPE, metrics=metrics, target=0.955,
                          higher_is_better=True)  # fmt: skip
    assert half == pytest.approx(full / 2, rel=1e-6)


@pytest.mark.parametrize("name", shipped_catalog().available())
def test_every_budget_covers_what_its_truth_needs(name: str) -> None:
    """max_epochs x samples/epoch is at least the true samples to the target at every global
    batch a workload gives the task (GPUs x default batch) and at its base batch, for a job
    two standard deviations of the per-job factor slower than the task's."""
    task = shipped_catalog().get(name)
    cal = shipped_calibration()[name]
    batches = [g * task.default_batch for g in task.gpu_counts()]
    batches.append(task.min_gpus * task.min_batch)
    need = max(cal.samples_to_target(b) for b in batches) * math.exp(2 * JOB_WORK_NOISE)
    assert task.base_samples >= need


def test_the_simulated_metric_is_a_saturating_curve_that_meets_the_target() -> None:
    for higher, target, start in ((True, 0.94, 0.0), (False, 10.0, 5.0)):
        for alpha in (0.5, 1.0, 2.0):
            shape = MetricShape(margin=0.04, start=start, alpha=alpha)
            ps = np.linspace(0.0, 1.0, 51)
            v = [metric_curve(p, target=target, higher_is_better=higher, shape=shape) for p in ps]
            assert v[-1] == pytest.approx(target)
            sign = 1 if higher else -1
            steps = np.diff(sign * np.array(v))
            assert np.all(steps > 0)  # improving
            assert np.all(np.diff(steps) < 0)  # ever more slowly (saturating, not linear)


def _job(global_batch: int) -> SimJob:
    catalog = shipped_catalog()
    name = "resnet18-cifar10"
    truth = TaskTruth(catalog.get(name), catalog.layers(name), shipped_calibration()[name], seed=1)
    spec = replace(catalog.get(name).job_spec(catalog.layers(name)), global_batch=global_batch)
    return SimJob(TraceJob("j", 0.0, name, 4, 512), truth, spec, seed=1, overhead_s=0.0)


def test_done_work_of_a_free_batch_job_is_counted_in_base_batch_samples() -> None:
    """With its global batch free a job counts a sample at a large global batch as the
    efficiency of that batch (< 1) base-batch samples, from its own gradient statistics; a
    job that keeps a declared global batch counts samples as they are (x psi)."""
    free, fixed = _job(0), _job(512)
    gpus = tuple(("n0", i) for i in range(4))
    for job in (free, fixed):
        job.set_config(Config(4, 1, 128, 0, False, gpus), 0.0)
        job.step(0.0, 60.0, 1.0)  # a few epochs: statistics arrive
        assert job.grad_sums is not None and job.run.frozen == 0
    assert fixed.effective_done == pytest.approx(fixed.samples_done)
    before_e, before_s = free.effective_done, free.samples_done
    free.step(60.0, 120.0, 1.0)
    assert not free.done
    rate = (free.effective_done - before_e) / (free.samples_done - before_s)
    assert 0 < rate < 0.99  # 512 against a base batch of 32: less than one base sample each


def test_a_metric_has_stalled_when_its_last_epochs_are_no_better_than_before() -> None:
    rising = [(e, 0.5 + 0.01 * e) for e in range(1, 21)]
    assert not stalled(rising, patience=5, higher_is_better=True)
    # a peak at epoch 8, then 12 epochs below it: stalled for a patience up to 12
    peaked = [(e, 0.6 if e == 8 else 0.55) for e in range(1, 21)]
    assert stalled(peaked, patience=5, higher_is_better=True)
    assert stalled(peaked, patience=10, higher_is_better=True)
    assert not stalled(peaked, patience=12, higher_is_better=True)  # the peak is in the window
    # equal to the best before is no improvement; lower is better for a loss
    assert stalled([(e, 1.0) for e in range(1, 11)], patience=5, higher_is_better=True)
    falling = [(e, 2.0 - 0.1 * e) for e in range(1, 11)]
    assert not stalled(falling, patience=5, higher_is_better=False)
    assert stalled(falling, patience=5, higher_is_better=True)


def test_a_short_history_or_no_patience_never_stalls() -> None:
    flat = [(e, 1.0) for e in range(1, 10)]  # 9 epochs: fewer than 2 x 5
    assert not stalled(flat, patience=5, higher_is_better=True)
    assert not stalled([*flat, (10, 1.0)], patience=0, higher_is_better=True)
    # epoch 0, non-finite values and repeated epochs (the latest counts) are not epochs
    noisy = [(0, 9.0), *((e, 1.0) for e in range(1, 10)), (5, math.nan), (9, 0.5)]
    assert not stalled(noisy, patience=5, higher_is_better=True)
    assert stalled([*noisy, (10, 1.0)], patience=5, higher_is_better=True)
