"""Fitting the SDP and PP/HP models (eq 9-13) to profile samples, and choosing the model.

Owns the parameters of each large-model family as :class:`~icefrog_slurm.core.fit.Param`
(defaults scaled by the samples, bounds, which ones the samples cannot inform), their fit
through the shared bounded least squares with a prior (``fit.fit_params`` on log-ratios of
iteration times), :func:`fitter_for`, which picks the fit that matches a job's declared
``Parallelism`` (the DDP fit for DDP), and the synthetic profiles the tests and
``benchmarks/parallel_fit.py`` fit to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from typing import TypeVar

import numpy as np

from icefrog_slurm.core.fit import (
    DEFAULT_PRIOR_WEIGHT,
    Fitter,
    Param,
    ddp_fitter,
    fit_params,
    log_ratio,
)
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallel import (
    IterationModel,
    Kind,
    Parallelism,
    PipelineModel,
    PipelineParams,
    SdpModel,
    SdpParams,
)
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.throughput import DEFAULT_GPUS_PER_NODE
from icefrog_slurm.errors import InputError

M = TypeVar("M", SdpModel, PipelineModel)

# Exponent bounds: overlap exponents >= 1 (1 = no overlap); gamma_flop (eq 6) within
# [0.05, 3] (< 1: backward falls sub-linearly with theta, as section 6 measured).
_EXPONENTS = {
    "gamma_lm": (1.5, 1.0, 20.0),
    "gamma": (1.5, 1.0, 20.0),
    "gamma_flop": (1.0, 0.05, 3.0),
}
_PER_GPU = {"beta_ag", "beta_sync"}


def iteration_seconds(model: IterationModel, sample: ProfileSample) -> float:
    """A sample's measured T_iter: ``t_iter_s``, else M(a, m) / ``samples_per_s`` (eq 4)."""
    if sample.t_iter_s > 0:
        return sample.t_iter_s
    if sample.samples_per_s <= 0:
        raise InputError("samples: each needs t_iter_s or samples_per_s > 0")
    return model.parallelism.global_batch(sample.gpus, sample.batch) / sample.samples_per_s


def predict(model: IterationModel, samples: Sequence[ProfileSample]) -> np.ndarray:
    """Predicted T_iter of each sample's configuration (one array evaluation)."""
    gpus = np.array([s.gpus for s in samples], dtype=np.int64)
    batch = np.array([s.batch for s in samples], dtype=float)
    frozen = np.array([s.frozen for s in samples], dtype=np.int64)
    return model.iteration_times(gpus, batch, frozen)


def _params(template: M, samples: Sequence[ProfileSample]) -> tuple[list[Param], set[str]]:
    """Data-scaled defaults (the prior's centre) and the names the samples cannot inform."""
    typical = float(np.median([iteration_seconds(template, s) for s in samples]))
    batch = max(float(np.median([s.batch for s in samples])), 1.0)
    gpus = max(float(np.median([s.gpus for s in samples])), 1.0)
    out = []
    for f in fields(template.params):
        if f.name in _EXPONENTS:
            default, low, high = _EXPONENTS[f.name]
            out.append(Param(f.name, default, low, high, scale=1.0))
        elif f.name.startswith("alpha"):
            out.append(Param(f.name, 0.05 * typical, scale=typical))
        else:
            unit = gpus if f.name in _PER_GPU else batch
            out.append(Param(f.name, 0.2 * typical / unit, scale=typical / unit))
    return out, _unobserved(template, samples)


def _unobserved(template: M, samples: Sequence[ProfileSample]) -> set[str]:
    frozen = any(s.frozen > 0 for s in samples)
    counts = {s.gpus for s in samples}
    replicas = {template.parallelism.replicas(g) for g in counts}
    rules: dict[tuple[str, ...], bool] = {
        ("alpha_flop", "gamma_flop", "alpha_para"): not frozen,
        ("beta_ag",): len(counts) < 2,
        ("alpha_sync", "beta_sync", "gamma"): max(replicas) < 2,
        ("beta_sync",): len(replicas - {1}) < 2 and isinstance(template, PipelineModel),
    }
    names = {f.name for f in fields(template.params)}
    return {n for group, unseen in rules.items() if unseen for n in group if n in names}


def fit_large_model(
    template: M,
    samples: Sequence[ProfileSample],
    *,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    starts: int = 4,
    seed: int = 0,
    min_samples: int | None = None,
    warm: M | None = None,
) -> M:
    """``template`` (its table, parallelism and stages) with parameters fitted to the
    unshared ``samples`` by bounded least squares on log(T_pred / T_iter) plus the prior of
    ``fit.fit_params``; ``starts - 1`` extra starts drawn log-uniformly around the defaults
    from a seeded generator guard against a poor local minimum.

    ``min_samples``: fewer unshared samples are refused (default: one a parameter). The
    scheduler passes 1: its job's model starts from one assumed sample and the prior holds
    what the samples cannot yet inform, as the DDP fit does.

    ``warm``: the job's last fitted model of this kind; the refit then starts from its
    parameters alone (``fit.fit_params``)."""
    used = [s for s in samples if not s.shared]
    need = len(fields(template.params)) if min_samples is None else max(1, min_samples)
    if len(used) < need:
        raise InputError(
            f"samples: need >= {need} unshared samples to fit "
            f"{template.parallelism.describe()}, got {len(used)}"
        )
    measured = np.array([iteration_seconds(template, s) for s in used])
    params, fixed = _params(template, used)
    cls = type(template.params)

    def build(values: Mapping[str, float]) -> M:
        return replace(template, params=cls(**values))

    def residuals(values: Mapping[str, float]) -> np.ndarray:
        return log_ratio(predict(build(values), used), measured)

    rng = np.random.default_rng(seed)
    extra = [
        {p.name: p.default * float(np.exp(rng.uniform(-1.5, 1.5))) for p in params}
        for _ in range(starts - 1)
    ]
    last = None if warm is None else {f.name: getattr(warm.params, f.name) for f in fields(cls)}
    result = fit_params(
        residuals, params, fixed=fixed, prior_weight=prior_weight, starts=extra, warm=last
    )
    return build(result.values)


def fitter_for(
    parallelism: Parallelism,
    table: LayerTable,
    *,
    stage_sizes: tuple[int, ...] = (),
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    min_samples: int | None = None,
) -> Fitter:
    """The fit of the model matching a job's declared parallelism: eq 4-7 (DDP), eq 9-10
    (SDP), eq 11-13 (PP, HP). Handing a LLaMA job ``Parallelism(Kind.DDP, unit=4)`` instead
    of its own is the paper's ablation (section 7: DDP model for SDP/HP jobs).
    ``gpus_per_node``: the DDP model's node size; ``min_samples``: see :func:`fit_large_model`."""
    if parallelism.kind is Kind.DDP:
        return ddp_fitter(table, gpus_per_node, prior_weight)
    if parallelism.kind is Kind.SDP:
        sdp = SdpModel(SdpParams(*([1.0] * len(fields(SdpParams)))), table, parallelism)
        return lambda samples, warm=None, /: fit_large_model(
            sdp, samples, prior_weight=prior_weight, min_samples=min_samples,
            warm=warm if isinstance(warm, SdpModel) else None,
        )  # fmt: skip
    pipe = PipelineModel(PipelineParams(*([1.0] * 8)), table, parallelism, stage_sizes)
    return lambda samples, warm=None, /: fit_large_model(
        pipe, samples, prior_weight=prior_weight, min_samples=min_samples,
        warm=warm if isinstance(warm, PipelineModel) else None,
    )  # fmt: skip


def synthetic_samples(
    model: IterationModel,
    configs: Sequence[tuple[int, int, int]],
    *,
    noise: float,
    seed: int,
) -> list[ProfileSample]:
    """Profiles of ``model`` at (gpus, batch, frozen) ``configs``, each iteration time
    multiplied by 1 + u with u uniform in [-noise, noise] (seeded); only t_iter_s and
    samples_per_s are filled (the component times are not profiled separately)."""
    rng = np.random.default_rng(seed)
    out = []
    for gpus, batch, frozen in configs:
        t = model.iteration_time(gpus=gpus, batch=batch, frozen=frozen)
        t *= 1.0 + float(rng.uniform(-noise, noise))
        rate = model.parallelism.global_batch(gpus, batch) / t
        out.append(ProfileSample(gpus, batch, frozen, False, 0.0, 0.0, 0.0, t, rate))
    return out


def split_held_back(
    samples: Sequence[ProfileSample], *, fraction: float, seed: int
) -> tuple[list[ProfileSample], list[ProfileSample]]:
    """(fit set, held-back set): a seeded random ``fraction`` of the samples is held back."""
    order = np.random.default_rng(seed).permutation(len(samples))
    cut = len(samples) - max(1, int(fraction * len(samples)))
    return [samples[i] for i in order[:cut]], [samples[i] for i in order[cut:]]
