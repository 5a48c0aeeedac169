"""Layer-aware iteration time of large-model jobs: SDP, PP and HP (spec section 7, eq 9-13).

Owns the ``Parallelism`` a job declares (DDP, SDP, PP with p stages, HP with d replicas of
p stages) with its allocation unit and legal GPU counts, the split of a layer table into
pipeline stages, and the two model families of section 7:

- :class:`SdpModel`: sharded data parallelism, whose backward overlaps gradient compute
  with the parameter all-gather (eq 9) and scales each branch with freezing (eq 10);
- :class:`PipelineModel`: pipeline parallelism, the sum over stages (eq 11) with frozen
  stages' backward and the gradient transfers into them removed (eq 12); with d > 1
  pipeline replicas (HP) the per-stage gradient sync (eq 13) overlaps the backward as in
  eq 5. Pure PP is the case d = 1 (GPUs = stages), where the sync is 0.

Freezing the first l layers is the variable (``frozen``); theta_l and omega_l come from
:class:`~icefrog_slurm.core.layers.LayerTable`. Each freezing branch keeps the form
alpha + beta·fraction^gamma·T(0) of eq 6/7/10 with beta tied to 1 - alpha/T(0), so that
l = 0 returns the unfrozen profile T(0) exactly (eq 6 read at l = 0): alpha is the fixed
launch cost that freezing cannot remove. The DDP model (eq 4-7) lives beside this module;
which model a job uses is a plain value (its ``Parallelism``), so a caller (the simulator's
ablation) can hand a LLaMA job the DDP model instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import expect_object, get_int, get_str, reject_unknown


class Kind(StrEnum):
    """How a job spreads over its GPUs."""

    DDP = "ddp"
    SDP = "sdp"
    PP = "pp"
    HP = "hp"


@dataclass(frozen=True)
class Parallelism:
    """A job's declared parallelism.

    ``stages``: p, the pipeline stages (PP, HP; 1 otherwise). ``unit``: the allocation unit,
    every GPU count a multiple of it (4 for the paper's LLaMA jobs). For HP the number of
    replicas is not declared but follows from the allocation: d = a / p.
    """

    kind: Kind
    stages: int = 1
    unit: int = 1

    def __post_init__(self) -> None:
        if self.unit < 1:
            raise InputError(f"parallelism.unit: must be >= 1, got {self.unit}")
        pipelined = self.kind in (Kind.PP, Kind.HP)
        if pipelined and self.stages < 2:
            raise InputError(f"parallelism.stages: {self.kind} needs >= 2, got {self.stages}")
        if not pipelined and self.stages != 1:
            raise InputError(f"parallelism.stages: {self.kind} has no stages, got {self.stages}")
        if self.kind is Kind.PP and self.stages % self.unit:
            raise InputError(
                f"parallelism: pure PP uses {self.stages} GPUs, not a multiple of the unit "
                f"{self.unit}"
            )

    @property
    def step(self) -> int:
        """The spacing of legal GPU counts: the unit, or lcm(unit, p) for HP."""
        return math.lcm(self.unit, self.stages) if self.kind is Kind.HP else self.unit

    def legal_gpu_counts(self, min_gpus: int, max_gpus: int) -> tuple[int, ...]:
        """The GPU counts a in [min_gpus, max_gpus] this job can run on (0, waiting, excluded).

        DDP, SDP: multiples of the unit; PP: exactly p; HP: multiples of lcm(unit, p).
        """
        if min_gpus < 1 or max_gpus < min_gpus:
            raise InputError(f"gpus: need 1 <= min <= max, got [{min_gpus}, {max_gpus}]")
        if self.kind is Kind.PP:
            return (self.stages,) if min_gpus <= self.stages <= max_gpus else ()
        first = -(-min_gpus // self.step) * self.step
        return tuple(range(first, max_gpus + 1, self.step))

    def replicas(self, gpus: int) -> int:
        """Data-parallel replicas on ``gpus``: a (DDP, SDP), 1 (PP), d = a / p (HP)."""
        if gpus < 1 or gpus % self.step or (self.kind is Kind.PP and gpus != self.stages):
            raise InputError(f"gpus: {gpus} is not a legal count for {self.describe()}")
        if self.kind is Kind.PP:
            return 1
        return gpus // self.stages

    def global_batch(self, gpus: int, batch: int) -> int:
        """M(a, m) of eq 4: replicas x m, with m the batch of one replica (GPU or pipeline)."""
        return self.replicas(gpus) * batch

    def describe(self) -> str:
        stages = f"(p={self.stages})" if self.stages > 1 else ""
        return f"{self.kind.value.upper()}{stages} in units of {self.unit} GPUs"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "stages": self.stages, "unit": self.unit}

    @classmethod
    def from_json(cls, doc: Any, where: str = "parallelism") -> Parallelism:
        obj = expect_object(doc, where)
        reject_unknown(obj, ("kind", "stages", "unit"), where)
        kind = get_str(obj, "kind", where)
        if kind not in {k.value for k in Kind}:
            raise InputError(f"{where}.kind: must be one of ddp, sdp, pp, hp; got {kind!r}")
        return cls(
            kind=Kind(kind),
            stages=get_int(obj, "stages", where, default=1, minimum=1),
            unit=get_int(obj, "unit", where, default=1, minimum=1),
        )


class IterationModel(Protocol):
    """What the Layer Tuner and the solver's options ask of a throughput model."""

    @property
    def parallelism(self) -> Parallelism: ...

    def iteration_time(self, *, gpus: int, batch: int, frozen: int) -> float: ...


def throughput(
    model: IterationModel, *, gpus: int, batch: int, frozen: int, speed: float = 1.0
) -> float:
    """Samples a second, eq 4: T = M(a, m) / T_iter(a, m, l) · lambda (lambda = ``speed``)."""
    samples = model.parallelism.global_batch(gpus, batch)
    return samples / model.iteration_time(gpus=gpus, batch=batch, frozen=frozen) * speed


def overlap(x: float, y: float, gamma: float) -> float:
    """(x^gamma + y^gamma)^(1/gamma): two overlapping phases (eq 5, 9, 10, 13).

    gamma = 1 is no overlap (a plain sum); gamma -> inf is perfect overlap (the max).
    """
    big = max(x, y)
    if big <= 0.0:
        return 0.0
    return big * float(((x / big) ** gamma + (y / big) ** gamma) ** (1.0 / gamma))


def freeze_scaled(unfrozen: float, *, fixed: float, fraction: float, curvature: float) -> float:
    """alpha + beta·fraction^gamma·T(0) with beta = 1 - alpha/T(0) (eq 6, 7, 10, 12).

    ``unfrozen``: T(0); ``fixed``: alpha, the launch cost freezing leaves (capped at T(0));
    ``fraction``: theta_l (compute, curvature gamma_flop) or omega_l (communication,
    curvature 1). Returns T(0) at fraction 1.
    """
    alpha = min(fixed, unfrozen)
    return alpha + (unfrozen - alpha) * float(fraction**curvature)


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


@dataclass(frozen=True)
class SdpModel:
    """Sharded data parallelism on ``table`` (eq 9, 10)."""

    params: SdpParams
    table: LayerTable
    parallelism: Parallelism = Parallelism(Kind.SDP, unit=4)

    def gather_time(self, gpus: int) -> float:
        """T_bwd^para(a, 0) = alpha_ag + beta_ag·(a - 1): all-gathering the full parameters."""
        return self.params.alpha_ag + self.params.beta_ag * (gpus - 1)

    def forward_time(self, *, gpus: int, batch: int) -> float:
        """T_fwd(a, m) = ((alpha_fwd + beta_fwd·m)^g_lm + T^para(a,0)^g_lm)^(1/g_lm).

        The forward all-gather overlaps forward compute; freezing barely changes it (only
        activation allocations, tens of ms), so it does not depend on l (section 7).
        """
        p = self.params
        return overlap(p.alpha_fwd + p.beta_fwd * batch, self.gather_time(gpus), p.gamma_lm)

    def backward_time(self, *, gpus: int, batch: int, frozen: int) -> float:
        """Eq 10 (eq 9 at l = 0): T_bwd(a,m,l) = (T_grad(m,l)^g_lm + T_para(a,l)^g_lm)^(1/g_lm).

        T_grad(m, l) = alpha_flop + (T_bwd^grad(m,0) - alpha_flop)·theta_l^gamma_flop and
        T_para(a, l) = alpha_para + (T_bwd^para(a,0) - alpha_para)·omega_l.
        """
        p = self.params
        grad = freeze_scaled(
            p.alpha_bwd + p.beta_bwd * batch,
            fixed=p.alpha_flop,
            fraction=self.table.theta(frozen),
            curvature=p.gamma_flop,
        )
        para = freeze_scaled(
            self.gather_time(gpus),
            fixed=p.alpha_para,
            fraction=self.table.omega(frozen),
            curvature=1.0,
        )
        return overlap(grad, para, p.gamma_lm)

    def iteration_time(self, *, gpus: int, batch: int, frozen: int) -> float:
        """T_iter(a, m, l) = T_fwd(a, m) + T_bwd(a, m, l) (eq 9, 10)."""
        _check_run(gpus, batch)
        return self.forward_time(gpus=gpus, batch=batch) + self.backward_time(
            gpus=gpus, batch=batch, frozen=frozen
        )


# ----------------------------------------------------------------------- PP and HP


def balanced_stages(table: LayerTable, stages: int) -> tuple[int, ...]:
    """Layers per stage: the contiguous split into ``stages`` minimising the largest
    stage's FLOPs (exact dynamic programme, O(p·L²)); ties go to the earliest cut."""
    n = table.num_layers
    if not 1 <= stages <= n:
        raise InputError(f"stages: need 1 <= p <= {n} layers, got {stages}")
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


@dataclass(frozen=True)
class StageTerms:
    """One stage's four terms of eq 11/12 (seconds), for inspection and tests."""

    forward: float  # T_fwd^j
    activation: float  # T_act^j, 0 for the last stage
    backward: float  # T_bwd^j(m, l), 0 when the stage is frozen
    gradient: float  # T_grad^j, sent to stage j-1; 0 for stage 0 or a frozen stage j-1
    sync: float  # T_sync^j(d, F(l, j)) across replicas (HP), 0 for d = 1


@dataclass(frozen=True)
class PipelineModel:
    """PP (d = 1) and HP (d = a/p replicas) on ``table`` split into ``stage_sizes``.

    ``stage_sizes``: layers per stage, contiguous, input side first; empty means
    :func:`balanced_stages` for ``parallelism.stages``.
    """

    params: PipelineParams
    table: LayerTable
    parallelism: Parallelism
    stage_sizes: tuple[int, ...] = ()
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

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
        starts = [0]
        for size in sizes:
            starts.append(starts[-1] + size)
        object.__setattr__(self, "_starts", tuple(starts))

    def frozen_in_stage(self, frozen: int, stage: int) -> int:
        """F(l, j): how many of the first l frozen layers lie in stage j."""
        start, end = self._starts[stage], self._starts[stage + 1]
        return min(max(frozen - start, 0), end - start)

    def stage_frozen(self, frozen: int, stage: int) -> bool:
        """Every layer of stage j (hence of every earlier stage) is frozen."""
        return self.frozen_in_stage(frozen, stage) == self.stage_sizes[stage]

    def _share(self, values: tuple[float, ...], stage: int, frozen: int) -> tuple[float, float]:
        """(stage share of the model total, unfrozen share within the stage)."""
        start, end = self._starts[stage], self._starts[stage + 1]
        stage_sum = math.fsum(values[start:end])
        live = math.fsum(values[start + self.frozen_in_stage(frozen, stage) : end])
        return stage_sum / math.fsum(values), (live / stage_sum if stage_sum > 0 else 0.0)

    def stage_terms(self, *, gpus: int, batch: int, frozen: int) -> tuple[StageTerms, ...]:
        """The per-stage terms of eq 11 (l = 0) and eq 12 (l > 0), and eq 13's sync."""
        _check_run(gpus, batch)
        prm, p = self.params, self.parallelism.stages
        replicas = self.parallelism.replicas(gpus)
        hop = prm.alpha_p2p + prm.beta_p2p * batch
        terms = []
        for j in range(p):
            phi, theta_j = self._share(self.table.flops, j, frozen)
            psi, omega_j = self._share(self.table.param_bytes, j, frozen)
            live = not self.stage_frozen(frozen, j)
            backward = freeze_scaled(
                prm.alpha_bwd + prm.beta_bwd * batch * phi,
                fixed=prm.alpha_flop,
                fraction=theta_j,
                curvature=prm.gamma_flop,
            )
            sync = prm.alpha_sync + prm.beta_sync * psi * omega_j * (replicas - 1)
            terms.append(
                StageTerms(
                    forward=prm.alpha_fwd + prm.beta_fwd * batch * phi,
                    activation=hop if j < p - 1 else 0.0,
                    backward=backward if live else 0.0,
                    gradient=hop if j > 0 and not self.stage_frozen(frozen, j - 1) else 0.0,
                    sync=sync if live and replicas > 1 else 0.0,
                )
            )
        return tuple(terms)

    def sync_time(self, *, gpus: int, batch: int, frozen: int) -> float:
        """T_sync(p, d, l) = sum_j T_sync^j(d, F(l, j)) (eq 13)."""
        return math.fsum(t.sync for t in self.stage_terms(gpus=gpus, batch=batch, frozen=frozen))

    def iteration_time(self, *, gpus: int, batch: int, frozen: int) -> float:
        """Eq 11-13: T_iter = sum_j (T_fwd^j + T_act^j)
        + ((sum_j T_bwd^j + T_grad^j)^gamma + T_sync(p, d, l)^gamma)^(1/gamma).

        For pure PP (d = 1) the sync is 0 and this is the plain sum over stages of eq 11/12.
        """
        terms = self.stage_terms(gpus=gpus, batch=batch, frozen=frozen)
        forward = math.fsum(t.forward + t.activation for t in terms)
        backward = math.fsum(t.backward + t.gradient for t in terms)
        sync = math.fsum(t.sync for t in terms)
        return forward + overlap(backward, sync, self.params.gamma)


def _check_run(gpus: int, batch: int) -> None:
    if gpus < 1:
        raise InputError(f"gpus: must be >= 1, got {gpus}")
    if batch < 1:
        raise InputError(f"batch: must be >= 1, got {batch}")
