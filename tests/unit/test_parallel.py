"""SDP, PP and HP iteration-time models (spec section 7, eq 9-13) and the Parallelism type."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallel import (
    Kind,
    Parallelism,
    PipelineModel,
    PipelineParams,
    SdpModel,
    SdpParams,
    balanced_stages,
    throughput,
)
from icefrog_slurm.core.throughput import (
    DdpThroughputModel,
    FreezeParams,
    LinearCurve,
    SyncCurve,
    overlap,
)
from icefrog_slurm.core.transformer_tables import load_shipped_table
from icefrog_slurm.errors import InputError

SDP = SdpParams(0.02, 0.03, 0.03, 0.06, 0.25, 0.04, 0.02, 0.8, 0.04, 2.0)
PIPE = PipelineParams(0.01, 0.03, 0.015, 0.06, 0.004, 0.0015, 0.01, 0.8, 0.03, 0.08, 2.0)
TABLE = LayerTable(flops=(1, 3, 2, 5, 4, 2, 6, 1), param_bytes=(5, 1, 2, 2, 3, 1, 1, 4))
SIZES = (2, 3, 2, 1)


def pipeline(kind: Kind, params: PipelineParams = PIPE) -> PipelineModel:
    return PipelineModel(params, TABLE, Parallelism(kind, stages=4, unit=4), SIZES)


def test_legal_gpu_counts_follow_unit_and_stages() -> None:
    assert Parallelism(Kind.SDP, unit=4).legal_gpu_counts(1, 18) == (4, 8, 12, 16)
    assert Parallelism(Kind.DDP).legal_gpu_counts(3, 5) == (3, 4, 5)
    assert Parallelism(Kind.PP, stages=4, unit=4).legal_gpu_counts(1, 32) == (4,)
    assert Parallelism(Kind.PP, stages=8, unit=4).legal_gpu_counts(1, 7) == ()
    assert Parallelism(Kind.HP, stages=8, unit=4).legal_gpu_counts(4, 32) == (8, 16, 24, 32)
    assert Parallelism(Kind.HP, stages=2, unit=4).replicas(12) == 6
    assert Parallelism(Kind.HP, stages=4, unit=4).global_batch(16, 8) == 32
    assert Parallelism(Kind.PP, stages=4, unit=4).global_batch(4, 8) == 8


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"kind": "tp"}, "parallelism.kind: must be one of"),
        ({"kind": "pp", "stages": 1}, "needs >= 2"),
        ({"kind": "sdp", "stages": 2}, "has no stages"),
        ({"kind": "pp", "stages": 6, "unit": 4}, "not a multiple of the unit"),
        ({"kind": "sdp", "gpus": 4}, "parallelism.gpus: unknown field"),
    ],
)
def test_bad_parallelism_is_named(doc: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        Parallelism.from_json(doc)


def test_parallelism_json_round_trip_and_illegal_count() -> None:
    hp = Parallelism(Kind.HP, stages=4, unit=4)
    assert Parallelism.from_json(hp.to_json()) == hp
    with pytest.raises(InputError, match="not a legal count"):
        hp.replicas(6)


def test_params_map_onto_the_ddp_freeze_terms() -> None:
    assert SDP.freeze == FreezeParams(alpha_flop=0.02, gamma_flop=0.8, alpha_sync=0.04, gamma=2.0)
    assert PIPE.freeze == FreezeParams(alpha_flop=0.01, gamma_flop=0.8, alpha_sync=0.03, gamma=2.0)
    with pytest.raises(InputError, match="gamma: must be >= 1"):
        SdpModel(replace(SDP, gamma_lm=0.5), TABLE).iteration_time(gpus=4, batch=1, frozen=0)


def test_sdp_at_zero_frozen_is_eq9_of_the_profile() -> None:
    model = SdpModel(SDP, TABLE)
    a, m = 8, 4
    grad = SDP.alpha_bwd + SDP.beta_bwd * m
    para = SDP.alpha_ag + SDP.beta_ag * (a - 1)
    eq9 = (grad**SDP.gamma_lm + para**SDP.gamma_lm) ** (1 / SDP.gamma_lm)
    fwd = overlap(SDP.alpha_fwd + SDP.beta_fwd * m, para, SDP.gamma_lm)
    assert model.iteration_time(gpus=a, batch=m, frozen=0) == pytest.approx(fwd + eq9)
    # freezing shrinks only the backward, each branch by its own fraction (eq 10)
    frozen = 3
    g = SDP.alpha_flop + (grad - SDP.alpha_flop) * TABLE.theta(frozen) ** SDP.gamma_flop
    q = SDP.alpha_para + (para - SDP.alpha_para) * TABLE.omega(frozen)
    expected = fwd + (g**SDP.gamma_lm + q**SDP.gamma_lm) ** (1 / SDP.gamma_lm)
    assert model.iteration_time(gpus=a, batch=m, frozen=frozen) == pytest.approx(expected)
    assert model.forward_times(np.array([8.0]), np.array([4.0]))[0] == pytest.approx(fwd)


def _eq11_by_hand(m: int, d: int) -> tuple[float, float, float]:
    """(forward part, backward part, sync) of the unfrozen pipeline, from the profile."""
    total_f, total_b = sum(TABLE.flops), sum(TABLE.param_bytes)
    starts = [0, 2, 5, 7, 8]
    phi = [sum(TABLE.flops[s:e]) / total_f for s, e in itertools.pairwise(starts)]
    psi = [sum(TABLE.param_bytes[s:e]) / total_b for s, e in itertools.pairwise(starts)]
    hop = PIPE.alpha_p2p + PIPE.beta_p2p * m
    fwd = sum(PIPE.alpha_fwd + PIPE.beta_fwd * m * f for f in phi) + 3 * hop
    bwd = sum(PIPE.alpha_bwd + PIPE.beta_bwd * m * f for f in phi) + 3 * hop
    sync = sum(PIPE.alpha_sync + PIPE.beta_sync * s * (d - 1) for s in psi) if d > 1 else 0.0
    return fwd, bwd, sync


def test_pipeline_at_zero_frozen_is_eq11_and_hp_adds_eq13_sync() -> None:
    fwd, bwd, _ = _eq11_by_hand(m=8, d=1)
    assert pipeline(Kind.PP).iteration_time(gpus=4, batch=8, frozen=0) == pytest.approx(fwd + bwd)
    fwd, bwd, sync = _eq11_by_hand(m=8, d=3)
    hp = pipeline(Kind.HP)
    assert hp.sync_time(gpus=12, batch=8, frozen=0) == pytest.approx(sync)
    assert hp.iteration_time(gpus=12, batch=8, frozen=0) == pytest.approx(
        fwd + overlap(bwd, sync, PIPE.gamma)
    )
    assert hp.iteration_time(gpus=4, batch=8, frozen=0) == pytest.approx(sum(_eq11_by_hand(8, 1)))


@pytest.mark.parametrize("kind", [Kind.PP, Kind.HP])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_freezing_first_k_stages_removes_exactly_their_backward(kind: Kind, k: int) -> None:
    model = pipeline(kind)
    gpus = 4 if kind is Kind.PP else 16
    frozen = sum(SIZES[:k])
    before = model.stage_terms(gpus=gpus, batch=8, frozen=0)
    after = model.stage_terms(gpus=gpus, batch=8, frozen=frozen)
    for j in range(4):
        assert after[j].forward == before[j].forward  # eq 12 keeps every forward
        assert after[j].activation == before[j].activation
        gone = j < k  # stage j frozen: no backward, no sync, nothing sent into it
        assert after[j].backward == (0.0 if gone else before[j].backward)
        assert after[j].sync == (0.0 if gone else before[j].sync)
        assert after[j].gradient == (0.0 if 0 < j <= k else before[j].gradient)
    removed = sum(before[j].backward for j in range(k)) + sum(
        before[j].gradient for j in range(1, k + 1)
    )
    backward = [sum(t.backward + t.gradient for t in ts) for ts in (before, after)]
    assert backward[0] - backward[1] == pytest.approx(removed)
    assert removed > 0
    if kind is Kind.PP:
        t0 = model.iteration_time(gpus=gpus, batch=8, frozen=0)
        tk = model.iteration_time(gpus=gpus, batch=8, frozen=frozen)
        assert t0 - tk == pytest.approx(removed)


def test_partly_frozen_stage_keeps_its_transfer_and_part_of_its_backward() -> None:
    model = pipeline(Kind.PP)
    assert [model.frozen_in_stage(3, j) for j in range(4)] == [2, 1, 0, 0]
    terms = model.stage_terms(gpus=4, batch=8, frozen=3)
    full = model.stage_terms(gpus=4, batch=8, frozen=0)
    assert 0 < terms[1].backward < full[1].backward
    assert terms[1].gradient == 0.0  # stage 0 is frozen: nothing to send it
    assert terms[2].gradient == full[2].gradient  # stage 1 still trains


def test_ddp_and_sdp_differ_in_the_direction_of_section_7() -> None:
    """DDP communicates only to sync gradients; SDP also all-gathers the parameters, in the
    forward (overlapped with compute, untouched by freezing) and in the backward (spec
    section 7, "SDP 连参数都要收集，所以不能套用 DDP 曲线"). For the same job, profile and
    collective cost C of one full-model collective:

    DDP (eq 5-7):  T = F + ((G·theta^g)^y + (C·omega)^y)^(1/y)
    SDP (eq 9-10): T = (F^y + C^y)^(1/y) + ((G·theta^g)^y + (C·omega)^y)^(1/y)

    so SDP's iteration is longer by k = (F^y + C^y)^(1/y) - F > 0 at every l, and freezing
    speeds SDP up by a smaller factor: T(0)/T(l) = (x + k)/(z + k) < x/z for x > z. The DDP
    curve overstates what freezing buys an SDP job. The DDP side is eq 5-7 from
    ``core.throughput`` with the same profile (forward, backward, C as its T_sync(a, 0)).
    """
    table = load_shipped_table("llama-3b")
    c = 0.25 + 0.04 * 7  # the collective at a = 8
    sdp = SdpModel(SdpParams(0.0, 0.03, 0.03, 0.06, c, 0.0, 0.02, 0.8, 0.0, 2.0), table)

    model = DdpThroughputModel(
        forward=LinearCurve(0.0, 0.03),
        backward=LinearCurve(0.03, 0.06),
        sync=SyncCurve(c, 0.0, c, 0.0),
        freeze=FreezeParams(alpha_flop=0.02, gamma_flop=0.8, alpha_sync=0.0, gamma=2.0),
    )

    def ddp(frozen: int) -> float:
        theta, omega = table.theta(frozen), table.omega(frozen)
        return model.times(gpus=8, batch=4, theta=theta, omega=omega)[3]

    for frozen in (0, 5, 10, 20):
        assert sdp.iteration_time(gpus=8, batch=4, frozen=frozen) > ddp(frozen) * 1.05
    for frozen in (5, 10, 20):
        speedup_sdp = sdp.iteration_time(gpus=8, batch=4, frozen=0) / sdp.iteration_time(
            gpus=8, batch=4, frozen=frozen
        )
        assert 1.0 < speedup_sdp < ddp(0) / ddp(frozen)


def test_throughput_is_global_batch_over_iteration_time() -> None:
    hp = pipeline(Kind.HP)
    t = hp.iteration_time(gpus=8, batch=16, frozen=2)
    assert throughput(hp, gpus=8, batch=16, frozen=2, lam=0.9) == pytest.approx(32 / t * 0.9)
    # the Layer Tuner's call: the model's own table only
    assert hp.throughput(gpus=8, batch=16, frozen=2, layers=TABLE) == pytest.approx(32 / t)
    with pytest.raises(InputError, match="not the layer table"):
        hp.throughput(gpus=8, batch=16, frozen=2, layers=LayerTable.uniform(8))


def test_balanced_stages_is_the_min_max_contiguous_split() -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        table = LayerTable(flops=tuple(rng.uniform(0.1, 5.0, 8)), param_bytes=(1.0,) * 8)
        sizes = balanced_stages(table, 3)
        assert sum(sizes) == 8 and len(sizes) == 3

        def worst(cuts: tuple[int, ...], t: LayerTable = table) -> float:
            edges = (0, *cuts, 8)
            return max(sum(t.flops[a:b]) for a, b in itertools.pairwise(edges))

        best = min(worst(c) for c in itertools.combinations(range(1, 8), 2))
        assert worst((sizes[0], sizes[0] + sizes[1])) == pytest.approx(best)
    assert balanced_stages(LayerTable.uniform(8), 4) == (2, 2, 2, 2)
    # LLaMA-7B at 128 tokens: the head is ~0.64 of a block and the embedding ~0, so the
    # best split is embed + 8 blocks | 8 | 8 | 8 + head (largest stage 8.64 blocks)
    assert balanced_stages(load_shipped_table("llama-7b"), 4) == (9, 8, 8, 9)


def test_the_bisected_split_has_the_exact_programme_s_largest_stage() -> None:
    """Past EXACT_STAGE_STEPS the split is found by bisection: on tables where both run, its
    largest stage equals the exact programme's (to 1e-9), every stage holds a layer."""
    from icefrog_slurm.core.parallel import _bisected_stages

    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        p = int(rng.integers(1, n + 1))
        flops = tuple(float(f) for f in rng.choice([1.0, 2.0, 0.01, 7.5], n) * rng.uniform(1, 2, n))
        table = LayerTable(flops=flops, param_bytes=(1.0,) * n)

        def largest(sizes: tuple[int, ...], f: tuple[float, ...] = flops) -> float:
            edges = np.cumsum((0, *sizes))
            return max(sum(f[a:b]) for a, b in itertools.pairwise(edges))

        split = _bisected_stages(flops, p)
        assert sum(split) == n and len(split) == p and min(split) >= 1
        assert largest(split) == pytest.approx(largest(balanced_stages(table, p)), rel=1e-9)


@pytest.mark.timeout(60)
def test_a_pipeline_of_thousands_of_layers_and_stages_is_split_at_once() -> None:
    """A declaration one user may send (4096 layers, 1365 stages: a 41 KB report) would
    cost the exact programme about 5e9 steps (over an hour a call, every round); the
    bisection splits it evenly at once."""
    table = LayerTable.uniform(4096)
    sizes = balanced_stages(table, 1365)
    assert len(sizes) == 1365 and sum(sizes) == 4096 and max(sizes) == 4


def test_bad_pipeline_inputs_are_named() -> None:
    with pytest.raises(InputError, match="stage_sizes"):
        PipelineModel(PIPE, TABLE, Parallelism(Kind.PP, stages=4, unit=4), (2, 2, 2, 1))
    with pytest.raises(InputError, match="needs PP or HP"):
        PipelineModel(PIPE, TABLE, Parallelism(Kind.SDP, unit=4))
    with pytest.raises(InputError, match="batch"):
        SdpModel(SDP, TABLE).iteration_time(gpus=4, batch=0, frozen=0)
    with pytest.raises(InputError, match="stages"):
        balanced_stages(TABLE, 9)
    assert math.isfinite(pipeline(Kind.HP).iteration_time(gpus=8, batch=1, frozen=8))
