"""Layer-aware iteration time of large-model jobs: SDP, PP and HP (spec section 7, eq 9-13).

Owns the split of a layer table into pipeline stages and the two model families of
section 7:

- :class:`SdpModel`: sharded data parallelism, whose backward overlaps gradient compute
  with the parameter all-gather (eq 9) and scales each branch with freezing (eq 10);
- :class:`PipelineModel`: pipeline parallelism, the sum over stages (eq 11) with frozen
  stages' backward and the gradient transfers into them removed (eq 12); with d > 1
  pipeline replicas (HP) the per-stage gradient sync (eq 13) overlaps the backward as in
  eq 5. Pure PP is the case d = 1 (GPUs = stages), where the sync is 0.

The declaration itself, ``Parallelism`` (kind, stages, unit, legal GPU counts), lives in
``parallelism.py`` (the wire protocol carries it) and is re-exported here.

Freezing the first l layers is the variable (``frozen``); theta_l and omega_l come from
:class:`~icefrog_slurm.core.layers.LayerTable`. The freezing branches and the overlap are
the DDP model's own (``throughput.py``: eq 6's ``backward_time`` for compute, eq 7's
``sync_time`` for communication, both with beta tied so that l = 0 returns the unfrozen
profile, and eq 5's ``overlap``); only what the spec adds for SDP/PP/HP lives here. Which
model a job uses is a plain value (its ``Parallelism``, see ``parallel_fit.fitter_for``),
so a caller (the simulator's ablation) can hand a LLaMA job the DDP model instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

import numpy as np
import numpy.typing as npt

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallelism import Kind as Kind
from icefrog_slurm.core.parallelism import Parallelism as Parallelism
from icefrog_slurm.core.throughput import (
    FreezeParams,
    backward_time,
    overlap,
    samples_per_second,
    sync_time,
)
from icefrog_slurm.errors import InputError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class IterationModel(Protocol):
    """What the Layer Tuner and the solver's options ask of a large-model throughput model."""

    @property
    def parallelism(self) -> Parallelism: ...

    def iteration_time(self, *, gpus: int, batch: int, frozen: int) -> float: ...

    def iteration_times(self, gpus: IntArray, batch: FloatArray, frozen: IntArray) -> FloatArray:
        """The same for arrays of configurations (one fit evaluates hundreds at once)."""
        ...


def throughput(
    model: IterationModel, *, gpus: int, batch: int, frozen: int, lam: float = 1.0
) -> float:
    """Samples a second, eq 4: M(a, m) / T_iter(a, m, l) · lambda, M = replicas x m."""
    t_iter = model.iteration_time(gpus=gpus, batch=batch, frozen=frozen)
    replicas = model.parallelism.replicas(gpus)
    return float(samples_per_second(float(replicas), float(batch), t_iter, lam))


class _WithTable(IterationModel, Protocol):
    @property
    def table(self) -> LayerTable: ...


class _ModelBase:
    """Mixin: the scalar calls of a model that evaluates arrays (``iteration_times``)."""

    def iteration_time(self: _WithTable, *, gpus: int, batch: int, frozen: int) -> float:
        """One configuration of :meth:`iteration_times`."""
        _check_run(gpus, batch)
        out = self.iteration_times(np.array([gpus]), np.array([float(batch)]), np.array([frozen]))
        return float(out[0])

    def throughput(
        self: _WithTable,
        *,
        gpus: int,
        batch: int,
        frozen: int,
        layers: LayerTable,
        lam: float = 1.0,
    ) -> float:
        """Eq 4 (see :func:`throughput`) as the Layer Tuner calls it (``tuner.ThroughputModel``);
        ``layers`` must be the model's own table."""
        _check_table(self, layers)
        return throughput(self, gpus=gpus, batch=batch, frozen=frozen, lam=lam)

    def throughputs(
        self: _WithTable,
        *,
        gpus: int | IntArray,
        batch: FloatArray,
        frozen: IntArray,
        layers: LayerTable,
        lam: float = 1.0,
    ) -> FloatArray:
        """:meth:`throughput` for arrays of GPU counts, per-GPU batches and frozen counts
        (broadcast together) in one :meth:`iteration_times` call (the tuner's grids)."""
        _check_table(self, layers)
        shape = np.broadcast_shapes(np.shape(gpus), np.shape(batch), np.shape(frozen))
        a = np.broadcast_to(np.asarray(gpus, dtype=np.int64), shape).ravel()
        m = np.broadcast_to(np.asarray(batch, dtype=float), shape)
        _check_run(int(np.min(a)) if a.size else 1, int(np.min(m)) if m.size else 1)
        t_iter = self.iteration_times(
            a, m.ravel(), np.broadcast_to(np.asarray(frozen, dtype=np.int64), shape).ravel()
        ).reshape(shape)
        replicas = _replicas(self.parallelism, a).reshape(shape)
        return samples_per_second(replicas, m, t_iter, lam)


def _check_table(model: _WithTable, layers: LayerTable) -> None:
    if layers is not model.table and layers != model.table:
        raise InputError("layers: not the layer table this model was built on")


def _replicas(parallelism: Parallelism, gpus: IntArray) -> FloatArray:
    """Parallelism.replicas of each GPU count (validated once per distinct count)."""
    values, inverse = np.unique(gpus, return_inverse=True)
    per = np.array([parallelism.replicas(int(g)) for g in values], dtype=float)
    return np.asarray(per[inverse.reshape(-1)])


# ----------------------------------------------------------------------------- SDP


@dataclass(frozen=True)
class SdpParams:
    """Parameters of the SDP model (eq 9, 10), each beside its formula."""

    alpha_fwd: float  # forward compute: T_fwd^comp(m) = alpha_fwd + beta_fwd·m
    beta_fwd: float
    alpha_bwd: float  # gradient compute: T_bwd^grad(m, 0) = alpha_bwd + beta_bwd·m
    beta_bwd: float
    alpha_ag: float  # parameter all-gather: T_bwd^para(a, 0) = alpha_ag + beta_ag·(a - 1)
    beta_ag: float
    alpha_flop: float  # T_grad(m, l) = alpha_flop + (T_grad(m,0) - alpha_flop)·theta_l^gamma_flop
    gamma_flop: float
    alpha_para: float  # T_para(a, l) = alpha_para + (T_para(a,0) - alpha_para)·omega_l
    gamma_lm: float  # overlap of the two branches, >= 1 (eq 9, 10)

    @property
    def freeze(self) -> FreezeParams:
        """Eq 10's branches in the DDP model's terms: compute as eq 6, all-gather as eq 7."""
        return FreezeParams(self.alpha_flop, self.gamma_flop, self.alpha_para, self.gamma_lm)


@dataclass(frozen=True)
class SdpModel(_ModelBase):
    """Sharded data parallelism on ``table`` (eq 9, 10)."""

    params: SdpParams
    table: LayerTable
    parallelism: Parallelism = Parallelism(Kind.SDP, unit=4)  # noqa: RUF009 (frozen value)

    def __post_init__(self) -> None:
        if self.parallelism.kind is not Kind.SDP:
            raise InputError(f"parallelism: the SDP model needs SDP, got {self.parallelism.kind}")

    def gather_time(self, gpus: FloatArray) -> FloatArray:
        """T_bwd^para(a, 0) = alpha_ag + beta_ag·(a - 1): all-gathering the full parameters."""
        return self.params.alpha_ag + self.params.beta_ag * (gpus - 1.0)

    def forward_times(self, gpus: FloatArray, batch: FloatArray) -> FloatArray:
        """T_fwd(a, m) = ((alpha_fwd + beta_fwd·m)^g_lm + T_bwd^para(a,0)^g_lm)^(1/g_lm).

        The forward all-gather overlaps forward compute; freezing barely changes it (only
        activation allocations, tens of ms), so it does not depend on l (section 7).
        """
        p = self.params
        return overlap(p.alpha_fwd + p.beta_fwd * batch, self.gather_time(gpus), p.gamma_lm)

    def backward_times(self, gpus: FloatArray, batch: FloatArray, frozen: IntArray) -> FloatArray:
        """Eq 10 (eq 9 at l = 0): T_bwd(a,m,l) = (T_grad(m,l)^g_lm + T_para(a,l)^g_lm)^(1/g_lm).

        T_grad(m, l) = alpha_flop + (T_bwd^grad(m,0) - alpha_flop)·theta_l^gamma_flop (eq 6's
        form) and T_para(a, l) = alpha_para + (T_bwd^para(a,0) - alpha_para)·omega_l (eq 7's),
        with T_bwd^grad(m, 0) = alpha_bwd + beta_bwd·m.
        """
        p, freeze = self.params, self.params.freeze
        theta, omega = self.table.fractions
        grad = backward_time(freeze, p.alpha_bwd + p.beta_bwd * batch, theta[frozen])
        para = sync_time(freeze, self.gather_time(gpus), omega[frozen])
        return overlap(grad, para, p.gamma_lm)

    def iteration_times(self, gpus: IntArray, batch: FloatArray, frozen: IntArray) -> FloatArray:
        """T_iter(a, m, l) = T_fwd(a, m) + T_bwd(a, m, l) (eq 9, 10)."""
        _replicas(self.parallelism, gpus)  # legal counts only
        a = np.asarray(gpus, dtype=float)
        return self.forward_times(a, batch) + self.backward_times(a, batch, frozen)


# ----------------------------------------------------------------------- PP and HP


EXACT_STAGE_STEPS = 200_000
"""p·L² up to which :func:`balanced_stages` runs its exact dynamic programme (a fraction of
a second); beyond, a declaration of thousands of layers and stages would cost a round
minutes to hours, so the least largest stage is found by bisection instead."""


@functools.lru_cache(maxsize=256)
def balanced_stages(table: LayerTable, stages: int) -> tuple[int, ...]:
    """Layers per stage: the contiguous split into ``stages`` minimising the largest
    stage's FLOPs (exact dynamic programme, O(p·L²), ties to the earliest cut; past
    :data:`EXACT_STAGE_STEPS`, :func:`_bisected_stages`). Remembered for the last tables."""
    n = table.num_layers
    if not 1 <= stages <= n:
        raise InputError(f"stages: need 1 <= p <= {n} layers, got {stages}")
    if stages * n * n > EXACT_STAGE_STEPS:
        return _bisected_stages(table.flops, stages)
    prefix = [0.0]
    for f in table.flops:
        prefix.append(prefix[-1] + f)
    # best[k][i]: least max-stage FLOPs splitting the first i layers into k stages
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i] - 1e-12 * prefix[n]:
                    best[k][i], cut[k][i] = cost, j
    sizes, i = [], n
    for k in range(stages, 0, -1):
        sizes.append(i - cut[k][i])
        i = cut[k][i]
    return tuple(reversed(sizes))


def _bisected_stages(flops: Sequence[float], stages: int) -> tuple[int, ...]:
    """The split of :func:`balanced_stages` in O(L log): the least cap on a stage's FLOPs
    that a greedy left-to-right packing fits in ``stages`` stages, by bisection to a
    relative 1e-12 of the total; the packing at that cap, its stages split further (the
    last layer of the first stage of several layers made a stage of its own) until there
    are ``stages``, which never raises the largest."""
    total = math.fsum(flops)

    def pack(cap: float) -> list[int]:
        sizes, load = [0], 0.0
        for f in flops:
            if sizes[-1] and load + f > cap:
                sizes.append(0)
                load = 0.0
            sizes[-1] += 1
            load += f
        return sizes

    lo, hi = max(flops), total * (1 + 1e-9)  # one stage of everything fits under hi
    while hi - lo > 1e-12 * total and len(pack(lo)) > stages:
        mid = (lo + hi) / 2
        if len(pack(mid)) <= stages:
            hi = mid
        else:
            lo = mid
    sizes = pack(lo if len(pack(lo)) <= stages else hi)
    while len(sizes) < stages:
        at = next(i for i, size in enumerate(sizes) if size > 1)
        sizes[at : at + 1] = [sizes[at] - 1, 1]
    return tuple(sizes)


@dataclass(frozen=True)
class PipelineParams:
    """Parameters of the PP/HP model (eq 11-13), each beside its formula.

    Phi_j, Psi_j: stage j's share of the model's FLOPs and parameter bytes.
    """

    alpha_fwd: float  # T_fwd^j(m) = alpha_fwd + beta_fwd·m·Phi_j
    beta_fwd: float
    alpha_bwd: float  # T_bwd^j(m, 0) = alpha_bwd + beta_bwd·m·Phi_j
    beta_bwd: float
    alpha_p2p: float  # T_act^j(m) = T_grad^j(m) = alpha_p2p + beta_p2p·m (one boundary tensor)
    beta_p2p: float
    alpha_flop: float  # eq 12: T_bwd^j(m,l) = alpha_flop + (T_bwd^j(m,0) - alpha_flop)·theta^g
    gamma_flop: float  #   with theta the unfrozen FLOPs share inside stage j
    alpha_sync: float = 0.0  # eq 13: T_sync^j(d, F) = alpha_sync + beta_sync·Psi_j·omega_j·(d-1)
    beta_sync: float = 0.0  #   (0 for d = 1 or a frozen stage; omega_j: unfrozen bytes share)
    gamma: float = 1.0  # overlap of backward and sync, eq 5 form (HP only)

    @property
    def freeze(self) -> FreezeParams:
        """Eq 12's backward as eq 6 and eq 13's sync as eq 7, in the DDP model's terms."""
        return FreezeParams(self.alpha_flop, self.gamma_flop, self.alpha_sync, self.gamma)


@dataclass(frozen=True)
class StageTerms:
    """One stage's four terms of eq 11/12 (seconds), for inspection and tests."""

    forward: float  # T_fwd^j
    activation: float  # T_act^j, 0 for the last stage
    backward: float  # T_bwd^j(m, l), 0 when the stage is frozen
    gradient: float  # T_grad^j, sent to stage j-1; 0 for stage 0 or a frozen stage j-1
    sync: float  # T_sync^j(d, F(l, j)) across replicas (HP), 0 for d = 1


@dataclass(frozen=True)
class PipelineModel(_ModelBase):
    """PP (d = 1) and HP (d = a/p replicas) on ``table`` split into ``stage_sizes``.

    ``stage_sizes``: layers per stage, contiguous, input side first; empty means
    :func:`balanced_stages` for ``parallelism.stages``.
    """

    params: PipelineParams
    table: LayerTable
    parallelism: Parallelism
    stage_sizes: tuple[int, ...] = ()
    _shares: _StageShares = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self.parallelism.stages
        if self.parallelism.kind not in (Kind.PP, Kind.HP):
            raise InputError(
                f"parallelism: a pipeline model needs PP or HP, got {self.parallelism.kind}"
            )
        sizes = self.stage_sizes or balanced_stages(self.table, p)
        if len(sizes) != p or min(sizes) < 1 or sum(sizes) != self.table.num_layers:
            raise InputError(
                f"stage_sizes: need {p} positive sizes summing to {self.table.num_layers}, "
                f"got {list(sizes)}"
            )
        object.__setattr__(self, "stage_sizes", tuple(sizes))
        object.__setattr__(self, "_shares", _StageShares.of(self.table, tuple(sizes)))

    def frozen_in_stage(self, frozen: int, stage: int) -> int:
        """F(l, j): how many of the first l frozen layers lie in stage j."""
        return int(self._shares.frozen_count[frozen, stage])

    def stage_arrays(self, gpus: IntArray, batch: FloatArray, frozen: IntArray) -> StageArrays:
        """The per-stage terms of eq 11 (l = 0) and eq 12 (l > 0), and eq 13's sync; each
        array has one row a configuration and one column a stage."""
        prm, sh, freeze = self.params, self._shares, self.params.freeze
        p = self.parallelism.stages
        m = np.asarray(batch, dtype=float)[:, None]
        replicas = _replicas(self.parallelism, gpus)[:, None]
        dead = sh.dead[frozen]  # stage j wholly frozen (so are all before it)
        hop = prm.alpha_p2p + prm.beta_p2p * m
        not_last = (np.arange(p) < p - 1)[None, :]
        # stage j sends a gradient to j - 1 unless j = 0 or stage j - 1 is frozen
        sends_back = np.concatenate([np.zeros_like(dead[:, :1]), ~dead[:, :-1]], axis=1)
        bwd = backward_time(freeze, prm.alpha_bwd + prm.beta_bwd * m * sh.phi, sh.theta[frozen])
        # alpha_sync + omega_j·(T_sync^j(d,0) - alpha_sync), T_sync^j(d,0) below
        t_sync0 = prm.alpha_sync + prm.beta_sync * sh.psi * (replicas - 1.0)
        sync = sync_time(freeze, t_sync0 + 0.0 * m, sh.omega[frozen])
        return StageArrays(
            forward=prm.alpha_fwd + prm.beta_fwd * m * sh.phi,
            activation=np.where(not_last, hop, 0.0),
            backward=np.where(dead, 0.0, bwd),
            gradient=np.where(sends_back, hop, 0.0),
            sync=np.where(dead | (replicas < 2), 0.0, sync),
        )

    def stage_terms(self, *, gpus: int, batch: int, frozen: int) -> tuple[StageTerms, ...]:
        """One configuration's :meth:`stage_arrays` as a tuple of :class:`StageTerms`."""
        _check_run(gpus, batch)
        arr = self.stage_arrays(np.array([gpus]), np.array([float(batch)]), np.array([frozen]))
        return tuple(
            StageTerms(*(float(getattr(arr, f.name)[0, j]) for f in fields(StageTerms)))
            for j in range(self.parallelism.stages)
        )

    def sync_time(self, *, gpus: int, batch: int, frozen: int) -> float:
        """T_sync(p, d, l) = sum_j T_sync^j(d, F(l, j)) (eq 13)."""
        return math.fsum(t.sync for t in self.stage_terms(gpus=gpus, batch=batch, frozen=frozen))

    def iteration_times(self, gpus: IntArray, batch: FloatArray, frozen: IntArray) -> FloatArray:
        """Eq 11-13: T_iter = sum_j (T_fwd^j + T_act^j)
        + ((sum_j T_bwd^j + T_grad^j)^gamma + T_sync(p, d, l)^gamma)^(1/gamma).

        For pure PP (d = 1) the sync is 0 and this is the plain sum over stages of eq 11/12.
        """
        t = self.stage_arrays(gpus, batch, frozen)
        forward = (t.forward + t.activation).sum(axis=1)
        backward = (t.backward + t.gradient).sum(axis=1)
        return np.asarray(forward + overlap(backward, t.sync.sum(axis=1), self.params.gamma))


@dataclass(frozen=True)
class StageArrays:
    """:class:`StageTerms` for many configurations: arrays (configurations x stages)."""

    forward: FloatArray
    activation: FloatArray
    backward: FloatArray
    gradient: FloatArray
    sync: FloatArray


@dataclass(frozen=True)
class _StageShares:
    """What the stage split fixes: Phi_j, Psi_j (stage shares of FLOPs and bytes), and by
    l (rows) and stage (columns): F(l, j), theta_{l,j}, omega_{l,j}, and "wholly frozen"."""

    phi: FloatArray
    psi: FloatArray
    frozen_count: IntArray
    theta: FloatArray
    omega: FloatArray
    dead: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, table: LayerTable, sizes: tuple[int, ...]) -> _StageShares:
        starts = np.concatenate([[0], np.cumsum(sizes)])
        ls = np.arange(table.num_layers + 1)[:, None]
        count = np.clip(ls - starts[None, :-1], 0, np.array(sizes)[None, :])
        parts = []
        for values in (table.flops, table.param_bytes):
            suffix = np.concatenate([np.cumsum(np.array(values)[::-1])[::-1], [0.0]])
            stage = suffix[starts[:-1]] - suffix[starts[1:]]
            live = suffix[starts[:-1] + count] - suffix[starts[1:]]
            inside = np.divide(live, stage, out=np.zeros_like(live), where=stage > 0)
            parts.append((stage / suffix[0], np.clip(inside, 0.0, 1.0)))
        (phi, theta), (psi, omega) = parts
        return cls(phi, psi, count, theta, omega, count == np.array(sizes)[None, :])


def _check_run(gpus: int, batch: int) -> None:
    if gpus < 1:
        raise InputError(f"gpus: must be >= 1, got {gpus}")
    if batch < 1:
        raise InputError(f"batch: must be >= 1, got {batch}")
