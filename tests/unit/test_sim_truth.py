"""The simulator's hidden ground truth: its stated properties and its noisy observations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from icefrog_slurm.core.fit import ape, fit_ddp_model
from icefrog_slurm.core.goodput import efficiency
from icefrog_slurm.sim.calibration import shipped_calibration, sync_group
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.truth import (
    GPU_MEMORY_BYTES,
    GRAD_VAR_NOISE,
    PROFILE_TIME_NOISE,
    TaskTruth,
    build_truths,
)

TASKS = shipped_catalog().available()


def truth(name: str, seed: int = 0) -> TaskTruth:
    catalog = shipped_catalog()
    return TaskTruth(
        catalog.get(name), catalog.layers(name), shipped_calibration()[name], seed=seed
    )


@pytest.mark.parametrize("name", TASKS)
def test_unfrozen_is_the_calibrated_profile(name: str) -> None:
    """Unfrozen, the truth is the calibrated model, its all-reduce over the data-parallel
    replicas (all GPUs but under a pipeline)."""
    t, cal = truth(name), shipped_calibration()[name]
    for gpus in (1, 2, 4, 8, 16):
        for batch in shipped_catalog().get(name).batch_sizes():
            group = sync_group(t.task, gpus)
            assert t.throughput(gpus=gpus, batch=batch, frozen=0) == pytest.approx(
                cal.throughput(gpus=gpus, batch=batch, sync_gpus=group), rel=1e-12
            )


@pytest.mark.parametrize("name", TASKS)
def test_freezing_speeds_up_and_saves_memory(name: str) -> None:
    t = truth(name)
    layers, m = t.layers, t.task.default_batch
    speeds = [t.throughput(gpus=8, batch=m, frozen=k) for k in range(layers.num_layers)]
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(speeds))
    assert speeds[-1] > speeds[0]
    mems = [t.memory(batch=m, frozen=k) for k in range(layers.num_layers + 1)]
    assert all(b <= a for a, b in itertools.pairwise(mems))
    assert (
        0
        < t.utilisation(batch=m, frozen=layers.num_layers // 2)
        <= t.utilisation(batch=m, frozen=0)
        < 1
    )


@pytest.mark.parametrize("name", TASKS)
def test_front_layers_settle_earlier(name: str) -> None:
    t = truth(name)
    v0, later = t.grad_var(0.0), [t.grad_var(p) for p in (0.25, 0.5, 1.0)]
    for v in later:
        assert np.all(v < v0)
    quarter = max(1, t.layers.num_layers // 4)
    ratio = later[0] / v0  # how much is left at 25 % of the work
    assert ratio[:quarter].mean() < ratio[-quarter:].mean()


def _samples_needed(t: TaskTruth, *, freeze_at: float | None, frozen: int, seed: int = 1) -> float:
    run, step, used = t.start_run(seed=seed), 20_000.0, 0.0
    batch = t.task.default_batch
    while not run.reached:
        if freeze_at is not None and run.frozen == 0 and run.progress >= freeze_at:
            run.set_frozen(frozen)
        run.advance(samples=step, global_batch=batch)
        used += step
    return used


def test_unfrozen_progress_is_exact_and_linear() -> None:
    t = truth("resnet18-cifar10")
    run = t.start_run(seed=3)
    gains = [run.advance(samples=1000, global_batch=128) for _ in range(3)]
    assert gains[0] == gains[1] == gains[2] > 0
    assert run.true_psi() == 1.0
    needed = _samples_needed(t, freeze_at=None, frozen=0)
    assert needed / t.samples_to_target(128) == pytest.approx(1.0, abs=0.25)  # job factor


@pytest.mark.parametrize("name", ["resnet18-cifar10", "yolov3-voc", "bert-squad"])
def test_freezing_too_early_inflates_work(name: str) -> None:
    t = truth(name)
    half = t.layers.num_layers // 2
    unfrozen = _samples_needed(t, freeze_at=None, frozen=0)
    early = _samples_needed(t, freeze_at=0.02, frozen=half)
    late = _samples_needed(t, freeze_at=0.7, frozen=half)
    assert early > 1.2 * unfrozen
    assert early > late >= 0.95 * unfrozen


def test_penalty_follows_eq3_in_expectation() -> None:
    """The progress rate is 1 / (1 + rho (1/psi - 1)) with 0.75 <= rho <= 1: never better than
    unfrozen, never worse than eq 3's psi."""
    t = truth("resnet50-imagenet")
    for psi in (0.2, 0.5, 0.8, 1.0):
        assert psi <= t.progress_rate(psi) <= 1.0
    assert t.progress_rate(1.0) == 1.0


def test_profile_noise_has_the_stated_spread() -> None:
    t = truth("resnet18-cifar10")
    rng = np.random.default_rng(0)
    fwd, bwd, _, it = t.times(gpus=4, batch=128, frozen=3)
    obs = [t.observe_profile(rng, gpus=4, batch=128, frozen=3) for _ in range(4000)]
    for true, measured in ((fwd, [o.t_fwd_s for o in obs]), (bwd, [o.t_bwd_s for o in obs]),
                           (it, [o.t_iter_s for o in obs])):  # fmt: skip
        logs = np.log(np.array(measured) / true)
        assert logs.std() == pytest.approx(PROFILE_TIME_NOISE, rel=0.1)
        assert np.mean(np.array(measured) / true) == pytest.approx(1.0, abs=0.003)  # mean one
    assert all(o.gpus == 4 and o.frozen == 3 and not o.shared for o in obs[:5])


def test_grad_stats_noise_and_frozen_layers_keep_their_freeze_value() -> None:
    t = truth("resnet18-cifar10")
    run = t.start_run(seed=5)
    run.advance(samples=1e5, global_batch=128)
    run.set_frozen(4)
    stats = [run.observe_grad_stats(epoch=e, base_batch=128) for e in range(2000)]
    assert len({s.grad_var[:4] for s in stats}) == 1  # frozen: the value observed at freeze
    true = t.grad_var(run.progress)
    logs = np.log(np.array([s.grad_var[4:] for s in stats]) / true[4:])
    assert logs.std(axis=0) == pytest.approx(np.full(6, GRAD_VAR_NOISE), rel=0.1)
    assert stats[0].frozen == 4 and len(stats[0].grad_sqr) == t.layers.num_layers


@pytest.mark.parametrize("name", TASKS)
def test_reported_statistics_value_a_larger_batch_as_the_convergence_curve_does(
    name: str,
) -> None:
    """Pollux's efficiency on the mean reported statistics is that of the curve's noise scale
    at every calibrated batch, unfrozen and with half the layers frozen, and within 15 % of
    the truth's S(M0) / S(M) at the largest batch (each curve's loss there, if any)."""
    t, cal = truth(name), shipped_calibration()[name]
    base, scale = min(cal.batches), cal.noise_scale
    run = t.start_run(seed=2)
    for frozen in (0, t.layers.num_layers // 2):
        run.set_frozen(frozen)
        reports = [run.observe_grad_stats(epoch=0, base_batch=base) for _ in range(400)]
        var = float(np.mean([sum(r.grad_var[frozen:]) for r in reports]))
        sqr = float(np.mean([sum(r.grad_sqr[frozen:]) for r in reports]))
        for batch in cal.batches:
            reported = efficiency(var=var, sqr=sqr, batch=batch, base_batch=base)
            assert reported == pytest.approx((scale + base) / (scale + batch), rel=0.05)
    largest = max(cal.batches)
    reported = efficiency(var=var, sqr=sqr, batch=largest, base_batch=base)
    assert reported == pytest.approx(
        t.samples_to_target(base) / t.samples_to_target(largest), rel=0.15
    )


def test_the_core_model_learns_the_truth_from_noisy_samples() -> None:
    """Profiles observed from the truth, fitted by the core's DDP model (eq 5-7): held-out
    configurations predicted within the spec's reported error band (max APE <= ~18 %)."""
    t, rng = truth("yolov3-voc"), np.random.default_rng(1)
    configs = [(g, m, k) for g in (1, 2, 4, 8) for m in (4, 8, 16) for k in (0, 8, 16, 24, 28)]
    order = rng.permutation(len(configs))
    train = [configs[i] for i in order[:45]]
    test = [configs[i] for i in order[45:]]
    model = fit_ddp_model(
        [t.observe_profile(rng, gpus=g, batch=m, frozen=k) for g, m, k in train], t.layers
    )
    pred = [model.throughput(gpus=g, batch=m, frozen=k, layers=t.layers) for g, m, k in test]
    true = [t.throughput(gpus=g, batch=m, frozen=k) for g, m, k in test]
    errors = ape(pred, true)
    assert errors.mean() < 8.0 and errors.max() < 20.0


def test_sharing_speed_and_oom() -> None:
    small = truth("resnet18-cifar10")
    lam = small.shared_speed(batch=64, frozen=5, partners=[(small, 64, 5)])
    assert 0.4 < lam < 1.0
    big = truth("ddpm-cifar10")
    huge = 256
    while big.memory(batch=huge, frozen=0) < GPU_MEMORY_BYTES:
        huge *= 2
    assert big.shared_speed(batch=huge, frozen=0, partners=[(small, 64, 0)]) == 0.0


def test_build_truths_covers_the_calibrated_tasks() -> None:
    built = build_truths(shipped_catalog(), shipped_calibration(), seed=0)
    assert set(built) == set(TASKS)
    assert built["yolov3-voc"].throughput(gpus=2, batch=8, frozen=4) == truth(
        "yolov3-voc"
    ).throughput(gpus=2, batch=8, frozen=4)


def test_hidden_parameters_differ_by_seed_and_stay_private() -> None:
    a, b = truth("resnet18-cifar10", seed=0), truth("resnet18-cifar10", seed=1)
    assert a.throughput(gpus=4, batch=128, frozen=5) != b.throughput(gpus=4, batch=128, frozen=5)
    assert a.throughput(gpus=4, batch=128, frozen=5) == truth("resnet18-cifar10").throughput(
        gpus=4, batch=128, frozen=5
    )
    public = {n for n in dir(a) if not n.startswith("_")}
    assert public.isdisjoint({"hidden", "rho", "decay", "var0", "layer_bwd"})


def test_frozen_progress_does_not_depend_on_how_time_is_sliced() -> None:
    """The simulator's steps follow its ticks: one long step and many short ones over the
    same samples must reach the same progress (the rate drifts with progress, and its noise
    is drawn per progress quantum, not per call)."""
    t = truth("resnet18-cifar10")
    batch, total = 128, 0.6 * t.samples_to_target(128)

    def run_in(pieces: int, seed: int) -> float:
        run = t.start_run(seed=seed)
        run.advance(samples=0.2 * t.samples_to_target(128), global_batch=batch)
        run.set_frozen(t.layers.num_layers // 2)
        start = run.progress
        for _ in range(pieces):
            run.advance(samples=total / pieces, global_batch=batch)
        return run.progress - start

    for seed in (1, 2, 3):
        one, many = run_in(1, seed), run_in(500, seed)
        assert one == pytest.approx(many, rel=0.02)
        assert one < 0.6 * 1.3  # frozen: progress no faster than unfrozen (job factor aside)


def test_a_brief_thaw_does_not_forgive_what_a_frozen_layer_missed() -> None:
    """A layer's variance follows its own training: frozen from 0.2 to 0.6 of the work, then
    thawed for 0.01 and frozen again, it is recorded at 0.21 of its own progress (not at the
    job's 0.61), and the job's psi after the refreeze is no better than had it stayed frozen
    (up to what that 0.01 trained). Never frozen, every layer's progress is the job's."""
    t = truth("resnet18-cifar10")
    needed = t.samples_to_target(128)

    def run_to(run: object, progress: float) -> None:
        while run.progress < progress:  # type: ignore[attr-defined]
            run.advance(samples=needed * 0.002, global_batch=128)  # type: ignore[attr-defined]

    stayed, thawed = t.start_run(seed=9), t.start_run(seed=9)
    for run in (stayed, thawed):
        run_to(run, 0.2)
        run.set_frozen(4)
        run_to(run, 0.6)
    frozen_at = stayed.layer_variances()[:4].copy()
    thawed.set_frozen(0)
    before = thawed.progress
    run_to(thawed, before + 0.01)
    thawed.set_frozen(4)
    own = 0.2 + (thawed.progress - before)  # about 0.21, give or take one step past 0.2
    recorded = thawed.layer_variances()[:4]
    assert recorded == pytest.approx(t.grad_var(np.full(10, own))[:4], rel=0.05)
    assert np.all(recorded > t.grad_var(thawed.progress)[:4] * 1.01)  # not the job's 0.61
    assert np.all(recorded <= frozen_at)
    assert thawed.true_psi() <= stayed.true_psi() * 1.05
    never = t.start_run(seed=9)
    run_to(never, 0.5)
    assert np.array_equal(never.layer_variances(), t.grad_var(never.progress))
