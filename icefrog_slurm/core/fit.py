"""Generic bounded least-squares fitting with a prior, shared by every throughput model.

The system parameters of spec eq 14 are fitted from profile samples, starting from sensible
defaults and growing accurate as samples of more configurations arrive. This module owns
the machinery, not any model:

- :class:`Param`: one named parameter with its default, bounds and prior width;
- :func:`fit_params`: ``scipy.optimize.least_squares`` (trust-region reflective, bounded)
  on a model's residuals (with the model's analytic Jacobian when it has one, else
  finite differences) plus one prior residual per free parameter,
  ``sqrt(prior_weight) x (p - default) / scale``, which pulls an ill-determined parameter
  to its default when samples are few and fades as data residuals accumulate; parameters
  the samples cannot inform are held at their default (``fixed``);
- :func:`log_ratio` (the residual used for times: relative, scale-free) and :func:`ape`.

The DDP model (``throughput.py``) and the SDP/PP/HP models (``parallel.py``) build on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.throughput import (
    DEFAULT_GPUS_PER_NODE,
    PARAMETERS,
    DdpThroughputModel,
    FreezeParams,
    LinearCurve,
    SyncCurve,
    nodes_for,
)
from icefrog_slurm.core.tuner import ThroughputModel
from icefrog_slurm.errors import InputError

FloatArray = npt.NDArray[np.float64]
Residuals = Callable[[Mapping[str, Any]], FloatArray]
Jacobian = Callable[[Mapping[str, Any]], FloatArray]

DEFAULT_PRIOR_WEIGHT = 1e-3
"""Weight of one prior residual against one data residual (a log-ratio of a time)."""

SCREEN_TOLERANCE = 1e-3
"""With several starts, each is first solved to this relative tolerance (scipy's ``ftol``
and ``xtol``; the full solve uses scipy's defaults, 1e-8): enough to rank the minima they
lead to, a fraction of the iterations of a start that crawls to a poorer one."""

SCREEN_MARGIN = 0.01
"""Screened starts whose cost is within this fraction of the best one are then solved to
full tolerance, and the best of those wins: a near tie at screening is decided exactly."""


@dataclass(frozen=True)
class Param:
    """A fitted parameter: ``default`` (the prior's centre and the start), bounds, and
    ``scale``, the prior's width (a deviation of one ``scale`` costs ``prior_weight``)."""

    name: str
    default: float
    lower: float = 0.0
    upper: float = math.inf
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.lower <= self.default <= self.upper:
            raise InputError(
                f"{self.name}: default {self.default} outside [{self.lower}, {self.upper}]"
            )
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise InputError(f"{self.name}: prior scale must be a finite number > 0")


@dataclass(frozen=True)
class FitResult:
    """Fitted values by name (fixed ones at their default), the final cost
    (0.5 x sum of squared residuals, prior included), and which names were free."""

    values: Mapping[str, float]
    cost: float
    free: tuple[str, ...]
    success: bool

    def __getitem__(self, name: str) -> float:
        return self.values[name]


def fit_params(
    residuals: Residuals,
    params: Sequence[Param],
    *,
    fixed: Collection[str] = (),
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    starts: Sequence[Mapping[str, float]] = (),
    jacobian: Jacobian | None = None,
    warm: Mapping[str, float] | None = None,
) -> FitResult:
    """Minimise ``sum(residuals(p)^2) + prior_weight x sum(((p - default) / scale)^2)`` over
    the free parameters within their bounds (scipy ``least_squares``, method ``trf``).

    ``starts``: extra starting points (partial mappings over the defaults); the best end
    point wins, which guards a non-convex model against a poor local minimum; a start that
    is the same point as an earlier one (it moves only parameters held fixed) is not solved
    again. With more than one point, each is screened (solved to ``SCREEN_TOLERANCE``) and
    those within ``SCREEN_MARGIN`` of the best screened cost are solved on to full
    tolerance from where screening left them.
    ``jacobian``: the residuals' derivatives at a parameter point, one column a parameter
    in ``params`` order (fixed ones included); without it scipy's finite differences.
    ``warm``: a refit's start, the last fit's values (a partial mapping over the defaults):
    the only point solved from (the same objective, from where its minimum last was; the
    defaults and ``starts`` guarded the first fit).
    """
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise InputError("params: duplicate names")
    unknown = set(fixed) - set(names)
    if unknown:
        raise InputError(f"fixed: unknown parameter(s) {sorted(unknown)}")
    defaults = {p.name: p.default for p in params}
    free = [p for p in params if p.name not in fixed]
    if not free:
        return FitResult(defaults, _cost(residuals(defaults)), (), True)
    lower = np.array([p.lower for p in free])
    upper = np.array([p.upper for p in free])
    centre = np.array([p.default for p in free])
    scale = np.array([p.scale for p in free])
    weight = math.sqrt(prior_weight)

    def values_of(x: FloatArray) -> dict[str, float]:
        out = dict(defaults)
        out.update({p.name: float(v) for p, v in zip(free, x, strict=True)})
        return out

    def total(x: FloatArray) -> FloatArray:
        data = np.asarray(residuals(values_of(x)), dtype=float)
        return np.concatenate([data, weight * (x - centre) / scale], axis=-1)

    free_columns = [i for i, p in enumerate(params) if p.name not in fixed]
    prior_rows = np.diag(weight / scale)

    def total_jacobian(x: FloatArray) -> FloatArray:
        assert jacobian is not None
        data = np.asarray(jacobian(values_of(x)), dtype=float)[:, free_columns]
        return np.concatenate([data, prior_rows], axis=0)

    how: dict[str, Any] = {"jac": total_jacobian} if jacobian is not None else {}

    def solve(x0: FloatArray, **tolerances: float) -> Any:
        return least_squares(total, x0, bounds=(lower, upper), method="trf", **how, **tolerances)

    points: list[FloatArray] = []
    for start in [{}, *starts] if warm is None else [warm]:
        x0 = np.array([start.get(p.name, p.default) for p in free], dtype=float)
        x0 = _inside(x0, lower, upper)
        if not any(np.array_equal(x0, done) for done in points):
            points.append(x0)  # a start that is the same point ends at the same point
    if len(points) == 1:
        ends = [solve(points[0])]
    else:
        screened = [solve(x0, ftol=SCREEN_TOLERANCE, xtol=SCREEN_TOLERANCE) for x0 in points]
        bar = min(r.cost for r in screened) * (1 + SCREEN_MARGIN)
        ends = [solve(_inside(r.x, lower, upper)) for r in screened if r.cost <= bar]
    best = min(ends, key=lambda r: float(r.cost))  # the first of equal ends
    return FitResult(values_of(best.x), float(best.cost), tuple(p.name for p in free), best.success)


def log_ratio(predicted: FloatArray, observed: FloatArray) -> FloatArray:
    """log(predicted / observed): the relative error of a positive time, symmetric in scale.

    Predictions are floored at 1e-12 so a degenerate parameter point stays finite."""
    return np.asarray(np.log(np.maximum(predicted, 1e-12) / observed), dtype=float)


def d_log_ratio(predicted: FloatArray, d_predicted: FloatArray) -> FloatArray:
    """The derivatives of :func:`log_ratio` (rows of ``d_predicted``, one a prediction,
    divided by the prediction; 0 where the floor holds it)."""
    scale = np.where(predicted > 1e-12, 1.0 / np.maximum(predicted, 1e-12), 0.0)
    return np.asarray(scale[:, None] * d_predicted, dtype=float)


def ape(
    predicted: Sequence[float] | FloatArray, observed: Sequence[float] | FloatArray
) -> FloatArray:
    """Absolute percentage errors |predicted - observed| / observed x 100, one a sample."""
    pred = np.asarray(predicted, dtype=float)
    obs = np.asarray(observed, dtype=float)
    if pred.shape != obs.shape:
        raise InputError(f"ape: {pred.shape} predictions for {obs.shape} observations")
    if np.any(obs <= 0):
        raise InputError("ape: observations must be > 0")
    return np.asarray(np.abs(pred - obs) / obs * 100.0, dtype=float)


def _inside(x0: FloatArray, lower: FloatArray, upper: FloatArray) -> FloatArray:
    """Clip a start strictly inside the bounds (trf needs an interior point)."""
    span = np.where(np.isfinite(upper - lower), upper - lower, np.maximum(np.abs(x0), 1.0))
    eps = 1e-9 * np.maximum(span, 1e-12)
    return np.asarray(np.clip(x0, lower + eps, np.where(np.isfinite(upper), upper - eps, np.inf)))


def _cost(residuals: FloatArray) -> float:
    return 0.5 * float(np.sum(np.square(residuals)))


# --- The DDP model's fit (eq 5-7, 14) ------------------------------------------------------


@dataclass(frozen=True)
class _Observations:
    """Unshared profile samples as arrays; a component time of 0 means "not measured"."""

    gpus: FloatArray
    nodes: FloatArray
    batch: FloatArray
    theta: FloatArray
    omega: FloatArray
    frozen: FloatArray
    t_fwd: FloatArray
    t_bwd: FloatArray
    t_iter: FloatArray


def _observations(
    samples: Sequence[ProfileSample],
    layers: LayerTable,
    nodes: Sequence[int] | None,
    gpus_per_node: int,
) -> _Observations:
    if nodes is not None and len(nodes) != len(samples):
        raise InputError(f"nodes: {len(nodes)} values for {len(samples)} samples")
    rows: list[tuple[float, ...]] = []
    for i, s in enumerate(samples):
        if s.shared:
            continue  # lambda (eq 8) covers sharing; the DDP curves are fitted unshared
        t_iter = s.t_iter_s if s.t_iter_s > 0 else _iter_from_rate(s, i)
        n = nodes[i] if nodes is not None else nodes_for(s.gpus, gpus_per_node)
        theta, omega = layers.theta(s.frozen), layers.omega(s.frozen)
        rows.append((s.gpus, n, s.batch, theta, omega, s.frozen, s.t_fwd_s, s.t_bwd_s, t_iter))
    if not rows:
        raise InputError("samples: no unshared profile sample to fit the throughput model on")
    cols = np.array(rows, dtype=float).T
    return _Observations(*cols)


def _iter_from_rate(s: ProfileSample, i: int) -> float:
    if s.samples_per_s <= 0:
        raise InputError(f"samples[{i}]: needs t_iter_s or samples_per_s > 0")
    return s.gpus * s.batch / s.samples_per_s


def _ddp_params(obs: _Observations) -> tuple[list[Param], set[str]]:
    """Parameters of the DDP model with data-scaled defaults, and those the data cannot inform
    (held at their default, as Pollux does for configurations never observed)."""
    m_bar = float(np.mean(obs.batch))
    has_fwd, has_bwd = obs.t_fwd > 0, obs.t_bwd > 0
    f_bar = float(np.mean(obs.t_fwd[has_fwd])) if has_fwd.any() else 0.0
    if has_bwd.any():
        unfrozen = has_bwd & (obs.frozen == 0)
        b_bar = float(np.mean(obs.t_bwd[unfrozen if unfrozen.any() else has_bwd]))
    else:
        single = obs.gpus == 1
        b_bar = float(np.mean(obs.t_iter[single] if single.any() else obs.t_iter)) - f_bar
        b_bar = max(b_bar, 0.5 * float(np.mean(obs.t_iter)))
    f_scale, b_scale = max(f_bar, 1e-6), max(b_bar, 1e-6)
    params = [
        Param("fwd_intercept", f_bar / 2, scale=f_scale),
        Param("fwd_slope", f_bar / (2 * m_bar), scale=f_scale / m_bar),
        Param("bwd_intercept", b_bar / 2, scale=b_scale),
        Param("bwd_slope", b_bar / (2 * m_bar), lower=1e-12, scale=b_scale / m_bar),
        Param("alpha_intra", 0.1 * b_bar, scale=b_scale),
        Param("beta_intra", 0.0, scale=b_scale),
        Param("alpha_inter", 0.3 * b_bar, scale=b_scale),
        Param("beta_inter", 0.0, scale=b_scale),
        Param("alpha_flop", 0.0, scale=b_scale),
        Param("gamma_flop", 1.0, lower=0.05, upper=5.0),
        Param("alpha_sync", 0.0, scale=b_scale),
        Param("gamma", 1.0, lower=1.0, upper=10.0),
    ]
    multi, inter = obs.gpus > 1, obs.nodes > 1
    intra = multi & ~inter
    frozen = obs.frozen > 0
    fixed: set[str] = set()
    rules = {
        ("fwd_intercept", "fwd_slope"): not has_fwd.any(),
        ("alpha_intra",): not intra.any(),
        ("beta_intra",): not (intra & (obs.gpus > 2)).any(),
        ("alpha_inter",): not inter.any(),
        ("beta_inter",): not (inter & (obs.gpus > 2)).any(),
        ("alpha_flop", "gamma_flop"): not frozen.any(),
        ("alpha_sync",): not (frozen & multi).any(),
        ("gamma",): not multi.any(),
    }
    for names, unobserved in rules.items():
        if unobserved:
            fixed.update(names)
    return params, fixed


def ddp_model_from(values: Mapping[str, Any], gpus_per_node: int) -> DdpThroughputModel:
    """Assemble a :class:`DdpThroughputModel` from fitted parameter values by name."""
    return DdpThroughputModel(
        forward=LinearCurve(values["fwd_intercept"], values["fwd_slope"]),
        backward=LinearCurve(values["bwd_intercept"], values["bwd_slope"]),
        sync=SyncCurve(
            values["alpha_intra"], values["beta_intra"], values["alpha_inter"], values["beta_inter"]
        ),
        freeze=FreezeParams(
            alpha_flop=values["alpha_flop"],
            gamma_flop=values["gamma_flop"],
            alpha_sync=values["alpha_sync"],
            gamma=values["gamma"],
        ),
        gpus_per_node=gpus_per_node,
    )


def ddp_values(model: DdpThroughputModel) -> dict[str, float]:
    """The parameter values of a DDP model by name (the inverse of :func:`ddp_model_from`)."""
    fw, bw, sy, fr = model.forward, model.backward, model.sync, model.freeze
    values = (
        fw.intercept, fw.slope, bw.intercept, bw.slope, sy.alpha_intra, sy.beta_intra,
        sy.alpha_inter, sy.beta_inter, fr.alpha_flop, fr.gamma_flop, fr.alpha_sync, fr.gamma,
    )  # fmt: skip
    return {name: float(v) for name, v in zip(PARAMETERS, values, strict=True)}


def fit_ddp_model(
    samples: Sequence[ProfileSample],
    layers: LayerTable,
    *,
    nodes: Sequence[int] | None = None,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    warm: DdpThroughputModel | None = None,
    free_before: Collection[str] | None = None,
) -> DdpThroughputModel:
    """Fit every parameter of the DDP model (eq 5-7; the system parameters of eq 14) to
    profile samples by bounded least squares on log-ratios of the measured times:
    T_fwd (when measured, > 0), T_bwd (when measured) and T_iter (always; from
    ``samples_per_s`` when ``t_iter_s`` is 0). Shared samples are skipped. The solver is
    given the model's analytic Jacobian (``DdpThroughputModel.gradients``).

    ``nodes``: each sample's node count; by default ceil(gpus / gpus_per_node). When no
    forward time is measured the forward curve is held at 0 and the backward curve carries
    the whole compute time (as Pollux's single compute curve does).

    ``warm``: the job's last fitted model; a refit then starts from its values alone (see
    :func:`fit_params`), a few iterations when one new configuration arrived. Given
    ``free_before``, the parameters that last fit had free, a refit whose samples free
    another one (the first multi-GPU, multi-node or frozen sample) runs the cold fit's
    starts again: those starts guard exactly the parameters such samples free.
    """
    return _fit_ddp(
        samples, layers, nodes=nodes, gpus_per_node=gpus_per_node, prior_weight=prior_weight,
        warm=warm, free_before=free_before,
    )[0]  # fmt: skip


def _fit_ddp(
    samples: Sequence[ProfileSample],
    layers: LayerTable,
    *,
    nodes: Sequence[int] | None,
    gpus_per_node: int,
    prior_weight: float,
    warm: DdpThroughputModel | None,
    free_before: Collection[str] | None,
) -> tuple[DdpThroughputModel, frozenset[str]]:
    """:func:`fit_ddp_model`, and the names of the parameters the fit had free."""
    obs = _observations(samples, layers, nodes, gpus_per_node)
    params, fixed = _ddp_params(obs)
    has_fwd, has_bwd = obs.t_fwd > 0, obs.t_bwd > 0

    def residuals(v: Mapping[str, Any]) -> FloatArray:
        """One parameter point (floats), or k of them (k x 1 columns): k rows."""
        model = ddp_model_from(v, gpus_per_node)
        t_fwd, t_bwd, _, t_iter = model.components(
            obs.gpus, obs.nodes, obs.batch, obs.theta, obs.omega
        )
        shape = np.broadcast_shapes(np.shape(t_fwd), np.shape(t_bwd), np.shape(t_iter))
        t_fwd, t_bwd = np.broadcast_to(t_fwd, shape), np.broadcast_to(t_bwd, shape)
        return np.concatenate(
            [
                log_ratio(t_fwd[..., has_fwd], obs.t_fwd[has_fwd]),
                log_ratio(t_bwd[..., has_bwd], obs.t_bwd[has_bwd]),
                log_ratio(np.broadcast_to(t_iter, shape), obs.t_iter),
            ],
            axis=-1,
        )

    columns = [PARAMETERS.index(p.name) for p in params]

    def jacobian(v: Mapping[str, Any]) -> FloatArray:
        """d residuals / d parameters (eq 5-7 differentiated: the model's ``gradients``)."""
        model = ddp_model_from(v, gpus_per_node)
        (t_fwd, t_bwd, t_iter), d_fwd, d_bwd, d_iter = model.gradients(
            obs.gpus, obs.nodes, obs.batch, obs.theta, obs.omega
        )
        parts = [
            d_log_ratio(t_fwd[has_fwd], d_fwd[has_fwd]),
            d_log_ratio(t_bwd[has_bwd], d_bwd[has_bwd]),
            d_log_ratio(t_iter, d_iter),
        ]
        return np.concatenate(parts, axis=0)[:, columns]

    starts = [{"gamma": 3.0}, {"gamma_flop": 0.5}]
    free = frozenset(p.name for p in params) - fixed
    if free_before is not None and not free <= set(free_before):
        warm = None  # a parameter freed by a new kind of sample: the cold fit's starts
    result = fit_params(
        residuals, params, fixed=fixed, prior_weight=prior_weight, starts=starts,
        jacobian=jacobian, warm=None if warm is None else ddp_values(warm),
    )  # fmt: skip
    return ddp_model_from(result.values, gpus_per_node), free


class Fitter(Protocol):
    """Fits a job's throughput model to its samples; ``warm``, the job's last fitted model
    (None on its first fit), may be the start of the refit."""

    def __call__(
        self, samples: Sequence[ProfileSample], warm: ThroughputModel | None = None, /
    ) -> ThroughputModel: ...


def ddp_fitter(
    layers: LayerTable,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
) -> Fitter:
    """:func:`fit_ddp_model` as a :class:`Fitter` for one job's history: a refit starts from
    the last fit while the samples free no parameter that fit held (it remembers which)."""
    free_before: frozenset[str] | None = None

    def fit(
        samples: Sequence[ProfileSample], warm: ThroughputModel | None = None, /
    ) -> ThroughputModel:
        nonlocal free_before
        model, free_before = _fit_ddp(
            samples, layers, nodes=None, gpus_per_node=gpus_per_node, prior_weight=prior_weight,
            warm=warm if isinstance(warm, DdpThroughputModel) else None,
            free_before=free_before if warm is not None else None,
        )  # fmt: skip
        return model

    return fit


MAX_CONFIGURATIONS = 256
"""Configurations one job's history keeps (a simulated job visits at most a few dozen): a
job's samples of further ones are ignored, so one user cannot make every fit of their job
read thousands of them (a fit costs about 0.13 ms a configuration with the DDP model,
1.2 ms with HP's)."""


class ProfileHistory:
    """The profile samples of one job, by configuration, and its current fitted model (eq 14).

    A configuration is (gpus, batch, frozen, shared). Repeated samples of a configuration
    are averaged; the model is refitted only when a configuration not seen before arrives,
    so it grows accurate as the job visits more GPU counts and freezing depths. At most
    :data:`MAX_CONFIGURATIONS` configurations are kept (the first ones seen).

    ``fitter``: the fit of the job's model (``parallel_fit.fitter_for`` picks it by the
    job's parallelism); by default the DDP model's (:func:`fit_ddp_model`).
    """

    def __init__(
        self,
        layers: LayerTable,
        *,
        gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        fitter: Fitter | None = None,
    ) -> None:
        self._layers = layers
        self._fit = fitter or ddp_fitter(layers, gpus_per_node, prior_weight)
        self._samples: dict[tuple[int, int, int, bool], tuple[ProfileSample, int]] = {}
        self._model: ThroughputModel | None = None
        self._stale = True

    def add(self, samples: Sequence[ProfileSample]) -> bool:
        """Record samples; True when one of them is of a new configuration (refit due)."""
        new = False
        for s in samples:
            key = (s.gpus, s.batch, s.frozen, s.shared)
            old = self._samples.get(key)
            if old is None:
                if len(self._samples) >= MAX_CONFIGURATIONS:
                    continue
                self._samples[key] = (s, 1)
                new = True
            else:
                self._samples[key] = (_mean_sample(old[0], old[1], s), old[1] + 1)
        self._stale = self._stale or new
        return new

    @property
    def samples(self) -> tuple[ProfileSample, ...]:
        return tuple(s for s, _ in self._samples.values())

    def measured(self, *, shared: bool = False) -> dict[tuple[int, int, int], float]:
        """Measured samples a second by (gpus, batch, frozen), of the shared or the unshared
        runs (the Layer Tuner uses them as they are, see ``tuner.measured_or_predicted``)."""
        return {
            (g, m, k): _rate(s) for (g, m, k, sh), (s, _) in self._samples.items() if sh == shared
        }

    def model(self) -> ThroughputModel:
        """The model fitted to every configuration seen so far (refitted when stale, from
        the last fit when there is one)."""
        if self._model is None or self._stale:
            self._model = self._fit(self.samples, self._model)
            self._stale = False
        return self._model


def _rate(s: ProfileSample) -> float:
    return s.samples_per_s if s.samples_per_s > 0 else s.gpus * s.batch / s.t_iter_s


def _mean_sample(old: ProfileSample, count: int, new: ProfileSample) -> ProfileSample:
    """The running mean of ``count`` samples ``old`` and one more ``new`` (numeric fields)."""
    fields = ("t_fwd_s", "t_bwd_s", "t_sync_s", "t_iter_s", "samples_per_s", "peak_mem_bytes")
    merged = {f: (getattr(old, f) * count + getattr(new, f)) / (count + 1) for f in fields}
    if old.gpu_util >= 0 and new.gpu_util >= 0:
        merged["gpu_util"] = (old.gpu_util * count + new.gpu_util) / (count + 1)
    else:
        merged["gpu_util"] = max(old.gpu_util, new.gpu_util)
    return replace(old, **merged)
