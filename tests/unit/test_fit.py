from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from icefrog_slurm.core import fit
from icefrog_slurm.core.fit import (
    Param,
    ProfileHistory,
    ape,
    ddp_model_from,
    fit_ddp_model,
    fit_params,
)
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.throughput import (
    PARAMETERS,
    DdpThroughputModel,
    FreezeParams,
    LinearCurve,
    SyncCurve,
)
from icefrog_slurm.errors import InputError

LAYERS = LayerTable(
    flops=tuple(float(x) for x in np.linspace(2.0, 1.0, 20)),
    param_bytes=tuple(float(x) for x in np.linspace(0.2, 3.0, 20)),
)
TRUE = DdpThroughputModel(
    forward=LinearCurve(0.004, 0.0002),
    backward=LinearCurve(0.008, 0.0004),
    sync=SyncCurve(0.02, 0.002, 0.06, 0.006),
    freeze=FreezeParams(alpha_flop=0.01, gamma_flop=0.7, alpha_sync=0.005, gamma=2.0),
)


def synthetic(
    model: DdpThroughputModel,
    gpus: int,
    batch: int,
    frozen: int,
    noise: float,
    rng: np.random.Generator,
) -> ProfileSample:
    """A profile of ``model`` with multiplicative Gaussian noise on each measured time."""
    factors = 1 + noise * rng.standard_normal(3)
    return model.profile_sample(
        gpus=gpus,
        batch=batch,
        frozen=frozen,
        layers=LAYERS,
        noise=(factors[0], factors[1], factors[2]),
    )


@dataclass(frozen=True)
class Solve:
    nfev: int
    screen: bool


def starts(calls: list[Solve]) -> int:
    """The starting points a fit solved from: its screens, or its one solve."""
    screens = sum(c.screen for c in calls)
    return screens if screens else len(calls)


@pytest.fixture
def solves(monkeypatch: pytest.MonkeyPatch) -> list[Solve]:
    """Each least-squares solve the fits make, in order: its evaluations (nfev) and whether
    it screened a start (solved to ``fit.SCREEN_TOLERANCE``)."""
    out: list[Solve] = []
    real = fit.least_squares

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        out.append(Solve(result.nfev, kwargs.get("ftol") == fit.SCREEN_TOLERANCE))
        return result

    monkeypatch.setattr(fit, "least_squares", counted)
    return out


def test_recovers_known_parameters_within_10pct_ape_on_held_back_configs() -> None:
    rng = np.random.default_rng(2024)
    configs = [
        (g, m, k)
        for g in (1, 2, 4, 8, 16)
        for m in (16, 32, 64, 128, 256)
        for k in (0, 4, 8, 12, 16)
    ]
    order = rng.permutation(len(configs))
    held = [configs[i] for i in order[:25]]
    train = [configs[i] for i in order[25:]]
    model = fit_ddp_model([synthetic(TRUE, *c, 0.05, rng) for c in train], LAYERS)
    predicted = [model.throughput(gpus=g, batch=m, frozen=k, layers=LAYERS) for g, m, k in held]
    truth = [TRUE.throughput(gpus=g, batch=m, frozen=k, layers=LAYERS) for g, m, k in held]
    observed = [synthetic(TRUE, *c, 0.05, rng).samples_per_s for c in held]
    assert ape(predicted, truth).max() <= 10.0
    assert ape(predicted, observed).mean() <= 10.0
    # The parameters themselves come back (not only the predictions).
    assert model.freeze.gamma == pytest.approx(2.0, rel=0.15)
    assert model.freeze.gamma_flop == pytest.approx(0.7, rel=0.15)
    assert model.backward.slope == pytest.approx(0.0004, rel=0.1)
    assert model.sync.alpha_inter == pytest.approx(0.06, rel=0.15)


def test_unobserved_parameters_stay_at_defaults() -> None:
    rng = np.random.default_rng(7)
    samples = [synthetic(TRUE, 1, m, 0, 0.0, rng) for m in (16, 64, 256)]
    model = fit_ddp_model(samples, LAYERS)
    assert model.freeze == FreezeParams()  # nothing frozen, one GPU: eq 5-7 params untouched
    assert model.forward.slope == pytest.approx(0.0002, rel=1e-3)
    assert model.backward.intercept == pytest.approx(0.008, rel=1e-2)


def test_prior_decides_when_samples_are_few() -> None:
    # One batch size only: intercept and slope cannot be told apart; the prior splits the
    # time half and half (Pollux's choice) instead of an arbitrary corner.
    sample = ProfileSample(
        gpus=1, batch=64, frozen=0, shared=False, t_fwd_s=0.0, t_bwd_s=0.0,
        t_sync_s=0.0, t_iter_s=0.1, samples_per_s=640.0,
    )  # fmt: skip
    model = fit_ddp_model([sample], LAYERS)
    assert model.backward.intercept == pytest.approx(0.05, rel=1e-3)
    assert model.backward.slope * 64 == pytest.approx(0.05, rel=1e-3)
    assert model.forward == LinearCurve(0.0, 0.0)  # never measured: folded into backward
    assert model.throughput(gpus=1, batch=64, frozen=0, layers=LAYERS) == pytest.approx(640.0)


def test_fit_params_generic_bounds_and_fixed() -> None:
    xs = np.linspace(0.0, 1.0, 20)
    ys = 2.0 + 3.0 * xs

    def residuals(v: Mapping[str, float]) -> np.ndarray:
        return np.asarray(v["a"] + v["b"] * xs - ys)

    free = fit_params(
        residuals, [Param("a", 0.0, -10, 10), Param("b", 0.0, -10, 10)], prior_weight=0.0
    )
    assert free["a"] == pytest.approx(2.0, abs=1e-3) and free["b"] == pytest.approx(3.0, abs=1e-3)
    bounded = fit_params(residuals, [Param("a", 0.0, -10, 10), Param("b", 0.0, -10, 1.0)])
    assert bounded["b"] <= 1.0 + 1e-9
    held = fit_params(residuals, [Param("a", 0.5, -10, 10), Param("b", 0.0, -10, 10)], fixed={"a"})
    assert held["a"] == 0.5 and held.free == ("b",)
    # A strong prior pulls toward the default; the data win as the prior fades.
    strong = fit_params(
        residuals, [Param("a", 0.0, -10, 10), Param("b", 0.0, -10, 10)], prior_weight=1e3
    )
    assert abs(strong["b"]) < 0.5
    with pytest.raises(InputError, match="fixed"):
        fit_params(residuals, [Param("a", 0.0)], fixed={"zz"})
    with pytest.raises(InputError, match="default"):
        Param("c", 5.0, 0.0, 1.0)


def test_ape() -> None:
    assert list(ape([110.0, 90.0], [100.0, 100.0])) == pytest.approx([10.0, 10.0])
    with pytest.raises(InputError):
        ape([1.0], [0.0])


def test_history_refits_only_on_new_configurations() -> None:
    rng = np.random.default_rng(3)
    history = ProfileHistory(LAYERS)
    assert history.add([synthetic(TRUE, 1, 64, 0, 0.0, rng)])
    first = history.model()
    assert not history.add([synthetic(TRUE, 1, 64, 0, 0.0, rng)])  # same config: averaged
    assert history.model() is first
    assert history.add([synthetic(TRUE, 4, 64, 8, 0.0, rng), synthetic(TRUE, 2, 128, 0, 0.0, rng)])
    second = history.model()
    assert second is not first
    assert len(history.samples) == 3
    assert history.measured(shared=True) == {}
    rate = history.measured()[(4, 64, 8)]
    assert rate == pytest.approx(TRUE.throughput(gpus=4, batch=64, frozen=8, layers=LAYERS))


def test_shared_samples_alone_cannot_fit() -> None:
    sample = ProfileSample(
        gpus=1, batch=8, frozen=0, shared=True, t_fwd_s=0.0, t_bwd_s=0.0,
        t_sync_s=0.0, t_iter_s=0.1, samples_per_s=80.0,
    )  # fmt: skip
    with pytest.raises(InputError, match="unshared"):
        fit_ddp_model([sample], LAYERS)


def _model_at(values: Mapping[str, float]) -> DdpThroughputModel:
    return ddp_model_from(values, 4)


@pytest.mark.parametrize("capped", [False, True])
def test_gradients_are_the_derivatives_of_the_components(capped: bool) -> None:
    """DdpThroughputModel.gradients (the fit's analytic Jacobian) against central
    differences of components, column by column, also where a fixed cost is capped."""
    rng = np.random.default_rng(11)
    gpus = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 3.0])
    nodes = np.array([1.0, 1.0, 1.0, 2.0, 4.0, 1.0])
    batch = np.array([16.0, 32.0, 64.0, 128.0, 8.0, 48.0])
    theta = np.array([1.0, 0.7, 0.4, 0.1, 0.0, 0.55])
    omega = np.array([1.0, 0.8, 0.3, 0.05, 0.0, 0.6])
    for _ in range(4):
        v = dict(zip(PARAMETERS, rng.uniform(0.001, 0.02, len(PARAMETERS)), strict=True))
        v["gamma_flop"], v["gamma"] = rng.uniform(0.3, 2.0), rng.uniform(1.0, 4.0)
        if capped:  # the fixed costs exceed the unfrozen times: eq 6-7 give T(0) back
            v["alpha_flop"] = v["alpha_sync"] = 10.0
        times, *grads = _model_at(v).gradients(gpus, nodes, batch, theta, omega)
        t_fwd, t_bwd, _, t_iter = _model_at(v).components(gpus, nodes, batch, theta, omega)
        for got, want in zip(times, (t_fwd, t_bwd, t_iter), strict=True):
            assert np.array_equal(got, want)
        for j, name in enumerate(PARAMETERS):
            h = 1e-5 * max(abs(v[name]), 1e-3)
            up, down = _model_at({**v, name: v[name] + h}), _model_at({**v, name: v[name] - h})
            t_up = up.components(gpus, nodes, batch, theta, omega)
            t_down = down.components(gpus, nodes, batch, theta, omega)
            for grad, k in zip(grads, (0, 1, 3), strict=True):
                numeric = (t_up[k] - t_down[k]) / (2 * h)
                assert grad[:, j] == pytest.approx(numeric, rel=1e-4, abs=1e-9), (name, k)


def test_analytic_jacobian_fit_equals_the_finite_difference_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fit_ddp_model with its analytic Jacobian ends where scipy's finite differences do
    (the same minimum; the numbers agree to the solver's tolerance)."""
    rng = np.random.default_rng(5)
    configs = [(1, 32, 0), (2, 64, 4), (4, 64, 8), (8, 128, 0), (16, 32, 12), (1, 128, 16)]
    samples = [synthetic(TRUE, *c, 0.05, rng) for c in configs]
    analytic = fit_ddp_model(samples, LAYERS)
    original = fit.fit_params

    def numeric(*args: Any, **kwargs: Any) -> fit.FitResult:
        return original(*args, **{**kwargs, "jacobian": None})

    monkeypatch.setattr(fit, "fit_params", numeric)
    finite = fit_ddp_model(samples, LAYERS)
    assert analytic != finite  # two computations, not one
    for g, m, k in [(1, 16, 0), (2, 64, 8), (4, 256, 4), (8, 32, 16), (32, 64, 0)]:
        one = analytic.throughput(gpus=g, batch=m, frozen=k, layers=LAYERS)
        assert one == pytest.approx(finite.throughput(gpus=g, batch=m, frozen=k, layers=LAYERS))


def test_a_start_at_the_same_point_is_solved_once(solves: list[Solve]) -> None:
    """The DDP fit's extra starts move gamma and gamma_flop; with both held (one GPU,
    nothing frozen) they are the default point again and are not solved again."""
    rng = np.random.default_rng(2)
    fit_ddp_model([synthetic(TRUE, 1, m, 0, 0.01, rng) for m in (16, 64)], LAYERS)
    assert solves == [Solve(solves[0].nfev, screen=False)]  # one point: solved, not screened
    solves.clear()
    fit_ddp_model([synthetic(TRUE, g, 64, k, 0.01, rng) for g, k in ((1, 0), (4, 8))], LAYERS)
    assert starts(solves) == 3


def test_a_refit_starts_from_the_last_fit_and_ends_where_a_cold_fit_does(
    solves: list[Solve],
) -> None:
    """A job's history refits from its last model: one solve (not the cold fit's three
    starts), fewer evaluations, and the same minimum of the same objective."""
    rng = np.random.default_rng(7)
    configs = [(1, 32, 0), (2, 64, 4), (4, 64, 8), (8, 128, 0), (16, 32, 12), (1, 128, 16)]
    samples = [synthetic(TRUE, *c, 0.05, rng) for c in configs]
    evaluations = solves
    history = ProfileHistory(LAYERS)
    history.add(samples[:-1])
    last = history.model()
    evaluations.clear()
    history.add(samples[-1:])
    warm = history.model()
    assert len(evaluations) == 1 and not evaluations[0].screen
    warm_cost = evaluations[0].nfev
    evaluations.clear()
    cold = fit_ddp_model(samples, LAYERS)
    assert starts(evaluations) == 3
    assert warm_cost < sum(e.nfev for e in evaluations)
    assert warm is not last and warm != cold  # two computations
    for g, m, k in [(1, 16, 0), (2, 64, 8), (4, 256, 4), (8, 32, 16), (32, 64, 0)]:
        one = warm.throughput(gpus=g, batch=m, frozen=k, layers=LAYERS)
        assert one == pytest.approx(cold.throughput(gpus=g, batch=m, frozen=k, layers=LAYERS))


def test_a_sample_that_frees_a_parameter_brings_the_cold_starts_back(
    solves: list[Solve],
) -> None:
    """The first frozen sample frees gamma_flop, which the cold fit's extra start guards:
    that refit solves from the defaults and that start, not from the last fit."""
    rng = np.random.default_rng(11)
    history = ProfileHistory(LAYERS)
    history.add([synthetic(TRUE, 1, m, 0, 0.01, rng) for m in (16, 64)])
    history.model()
    history.add([synthetic(TRUE, 1, 128, 0, 0.01, rng)])
    solves.clear()
    history.model()
    assert starts(solves) == 1  # nothing new freed: from the last fit
    history.add([synthetic(TRUE, 1, 64, 8, 0.01, rng)])
    solves.clear()
    history.model()
    assert starts(solves) == 2  # gamma_flop freed: the defaults and its start


def test_screened_starts_end_where_solving_every_start_fully_does(
    solves: list[Solve], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold fit solves its starts to a loose tolerance first and only those near the best
    on to full tolerance: the minimum of solving every start fully, in fewer evaluations."""
    rng = np.random.default_rng(5)
    configs = [(1, 32, 0), (2, 64, 4), (4, 64, 8), (8, 128, 0), (16, 32, 12), (1, 128, 16)]
    samples = [synthetic(TRUE, *c, 0.05, rng) for c in configs]
    screened = fit_ddp_model(samples, LAYERS)
    assert starts(solves) == 3 and len(solves) > 3  # three screens, then the best solved on
    screened_cost = sum(s.nfev for s in solves)
    solves.clear()
    monkeypatch.setattr(fit, "SCREEN_TOLERANCE", 1e-8)  # a "screen" is a full solve
    full = fit_ddp_model(samples, LAYERS)
    assert screened_cost < sum(s.nfev for s in solves)
    for g, m, k in [(1, 16, 0), (2, 64, 8), (4, 256, 4), (8, 32, 16), (32, 64, 0)]:
        one = screened.throughput(gpus=g, batch=m, frozen=k, layers=LAYERS)
        assert one == pytest.approx(full.throughput(gpus=g, batch=m, frozen=k, layers=LAYERS))
