"""The throughput models and the Layer Tuner evaluated over a whole (batch, frozen) grid in one
call equal the scalar formulas, configuration by configuration (random models and inputs)."""

import math
import random

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
)
from icefrog_slurm.core.penalty import PenaltyTable
from icefrog_slurm.core.throughput import DdpThroughputModel, FreezeParams, LinearCurve, SyncCurve
from icefrog_slurm.core.tuner import (
    ThroughputModel,
    TuneRow,
    measured_or_predicted,
    measured_or_predicted_grid,
    measured_or_predicted_grids,
    tune,
    tune_grid,
    tune_rows,
)
from icefrog_slurm.errors import InputError

SEEDS = range(12)
BATCHES = (1, 2, 8, 32, 64, 256)


def _table(rng: random.Random) -> LayerTable:
    n = rng.randint(4, 30)
    return LayerTable(
        flops=tuple(rng.uniform(0.1, 10) for _ in range(n)),
        param_bytes=tuple(rng.uniform(0.0, 10) for _ in range(n)),
    )


def _ddp(rng: random.Random) -> DdpThroughputModel:
    u = rng.uniform
    return DdpThroughputModel(
        forward=LinearCurve(u(0, 0.02), u(1e-5, 1e-3)),
        backward=LinearCurve(u(0, 0.04), u(1e-5, 2e-3)),
        sync=SyncCurve(u(0, 0.05), u(0, 0.01), u(0, 0.2), u(0, 0.02)),
        freeze=FreezeParams(u(0, 0.05), u(0.05, 5.0), u(0, 0.05), u(1.0, 10.0)),
        gpus_per_node=rng.choice((2, 4, 8)),
    )


def _sdp(rng: random.Random, table: LayerTable) -> SdpModel:
    u = rng.uniform
    params = SdpParams(
        u(0, 0.05), u(0, 0.05), u(0, 0.05), u(0, 0.1), u(0, 0.5), u(0, 0.1),
        u(0, 0.05), u(0.05, 3.0), u(0, 0.1), u(1.0, 6.0),
    )  # fmt: skip
    return SdpModel(params, table)


def _pipeline(rng: random.Random, table: LayerTable, kind: Kind) -> PipelineModel:
    u = rng.uniform
    params = PipelineParams(
        u(0, 0.02), u(0, 0.05), u(0, 0.02), u(0, 0.1), u(0, 0.01), u(0, 0.003),
        u(0, 0.02), u(0.05, 3.0), u(0, 0.05), u(0, 0.1), u(1.0, 6.0),
    )  # fmt: skip
    stages = rng.randint(2, min(4, table.num_layers))
    return PipelineModel(params, table, Parallelism(kind, stages=stages))


def _models(seed: int) -> list[tuple[ThroughputModel, LayerTable, list[int]]]:
    """(model, its table, GPU counts legal for it) of every kind, drawn from ``seed``."""
    rng = random.Random(seed)
    table = _table(rng)
    pp, hp = _pipeline(rng, table, Kind.PP), _pipeline(rng, table, Kind.HP)
    return [
        (_ddp(rng), table, [1, 2, 3, 4, 8, 16, 64]),
        (_sdp(rng, table), table, [4, 8, 16]),
        (pp, table, [pp.parallelism.stages]),
        (hp, table, [hp.parallelism.stages * d for d in (1, 2, 3)]),
    ]


@pytest.mark.parametrize("seed", SEEDS)
def test_grid_throughput_equals_the_scalar_formula(seed: int) -> None:
    for model, table, counts in _models(seed):
        frozen = list(range(table.num_layers + 1))
        for gpus in counts:
            grid = model.throughputs(
                gpus=gpus,
                batch=np.array(BATCHES, dtype=float)[:, None],
                frozen=np.array(frozen)[None, :],
                layers=table,
            )
            assert grid.shape == (len(BATCHES), len(frozen))
            for i, m in enumerate(BATCHES):
                for j, k in enumerate(frozen):
                    one = model.throughput(gpus=gpus, batch=m, frozen=k, layers=table)
                    assert grid[i, j] == pytest.approx(one, rel=1e-12), (type(model), gpus, m, k)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_grids_of_several_gpu_counts_at_once_equal_each_counts_own_grid(seed: int) -> None:
    """One model evaluation for a job's GPU counts (each with its own batch sizes, padded
    inside) gives each count's grid exactly, the measured cells and freeze caps included,
    with and without the unfrozen column among the candidates."""
    rng = random.Random(2000 + seed)
    for model, table, counts in _models(seed):
        for frozen in (sorted({0, *rng.sample(range(1, table.num_layers + 1), k=2)}),
                       sorted(rng.sample(range(1, table.num_layers + 1), k=2))):  # fmt: skip
            configs = [(g, tuple(BATCHES[rng.randint(0, 2) :])) for g in counts]
            measured = {
                (g, rng.choice(b), rng.choice([0, *frozen])): rng.uniform(1, 5000)
                for g, b in configs
            }
            together = measured_or_predicted_grids(
                configs=configs, frozen_candidates=frozen, measured=measured, model=model,
                layers=table,
            )  # fmt: skip
            for (g, batches), grid in zip(configs, together, strict=True):
                alone = measured_or_predicted_grid(
                    gpus=g, batch_sizes=batches, frozen_candidates=frozen, measured=measured,
                    model=model, layers=table,
                )  # fmt: skip
                np.testing.assert_array_equal(grid, alone)
                for i, m in enumerate(batches):
                    for j, k in enumerate(frozen):
                        if (g, m, k) in measured:
                            assert grid[i, j] == measured[g, m, k]
                        elif k == 0:
                            one = model.throughput(gpus=g, batch=m, frozen=0, layers=table)
                            assert grid[i, j] == pytest.approx(one, rel=1e-12)


def test_grid_rejects_a_frozen_count_outside_the_table() -> None:
    rng = random.Random(0)
    table = _table(rng)
    with pytest.raises(Exception, match="frozen"):
        _ddp(rng).throughputs(
            gpus=2, batch=np.array([8.0]), frozen=np.array([table.num_layers + 1]), layers=table
        )


@pytest.mark.parametrize("seed", SEEDS)
def test_tune_grid_makes_the_scalar_tuners_choice(seed: int) -> None:
    """measured_or_predicted_grid + tune_grid pick what measured_or_predicted + tune pick,
    measured configurations, sharing lambda and the current depth (ties) included."""
    rng = random.Random(1000 + seed)
    for model, table, counts in _models(seed):
        frozen = sorted(rng.sample(range(table.num_layers + 1), k=min(6, table.num_layers)))
        frozen = sorted({0, *frozen})
        penalty = PenaltyTable(tuple(rng.uniform(0, 1) for _ in range(table.num_layers)))
        batches = BATCHES[rng.randint(0, 2) :]
        gpus = rng.choice(counts)
        measured = {
            (gpus, rng.choice(batches), rng.choice(frozen)): rng.uniform(1, 5000) for _ in range(3)
        }
        measured[(gpus + 1, batches[0], 0)] = 1e9  # another GPU count: must be ignored
        for lam, current in ((1.0, None), (0.9, rng.choice(frozen)), (0.0, 0)):
            scalar = tune(
                batch_sizes=batches,
                frozen_candidates=frozen,
                psi=penalty.psi,
                throughput=measured_or_predicted(
                    gpus=gpus, measured=measured, model=model, layers=table
                ),
                lam=lam,
                current_frozen=current,
            )
            grid = tune_grid(
                batch_sizes=batches,
                frozen_candidates=frozen,
                psi=np.array([penalty.psi(k) for k in frozen]),
                throughput=measured_or_predicted_grid(
                    gpus=gpus,
                    batch_sizes=batches,
                    frozen_candidates=frozen,
                    measured=measured,
                    model=model,
                    layers=table,
                ),
                lam=lam,
                current_frozen=current,
            )
            if lam == 0.0:
                assert scalar is None and grid is None
                continue
            assert scalar is not None and grid is not None
            assert (grid.batch, grid.frozen) == (scalar.batch, scalar.frozen)
            assert grid.effective_progress == pytest.approx(scalar.effective_progress, rel=1e-12)
            assert grid.throughput == pytest.approx(scalar.throughput, rel=1e-12)


def test_tune_grid_breaks_ties_as_the_tuner_does() -> None:
    """Equal E everywhere: the current depth, then fewer frozen layers, then smaller batch."""
    flat = np.ones((3, 3))
    psi = np.ones(3)
    pick = tune_grid(batch_sizes=(8, 16, 32), frozen_candidates=(0, 2, 4), psi=psi, throughput=flat)
    assert pick is not None and (pick.batch, pick.frozen) == (8, 0)
    pick = tune_grid(
        batch_sizes=(8, 16, 32),
        frozen_candidates=(0, 2, 4),
        psi=psi,
        throughput=flat,
        current_frozen=4,
    )
    assert pick is not None and (pick.batch, pick.frozen) == (8, 4)


def _tuned_by_hand(
    batches: tuple[int, ...],
    frozen: list[int],
    psi: np.ndarray,
    grid: np.ndarray,
    lam: float,
    current: int | None,
    eff: np.ndarray | None,
) -> tuple[int, int, float] | None:
    """The tuner's rule cell by cell: the largest E = psi x T x lam (x efficiency), NaN
    never chosen; cells within 1e-9 of it tie and go to the current depth, then the
    shallower depth, then the smaller batch."""
    cells = {}
    for i, m in enumerate(batches):
        for j, k in enumerate(frozen):
            e = psi[j] * (grid[i, j] * lam)
            if eff is not None:
                e = e * eff[i, j]
            if not math.isnan(e):
                cells[m, k] = e
    best = max(cells.values(), default=-math.inf)
    if not best > 0:
        return None
    near = [mk for mk, e in cells.items() if e >= best * (1 - 1e-9)]
    m, k = min(near, key=lambda mk: (mk[1] != current, mk[1], mk[0]))
    return m, k, cells[m, k]


@pytest.mark.parametrize("seed", SEEDS)
def test_tune_rows_tunes_each_configuration_of_one_job_by_the_rule(seed: int) -> None:
    """Several configurations of one job tuned at once (grids of different heights, ties,
    NaN cells, an empty and an all-zero configuration, with and without efficiencies)
    choose what the rule chooses for each alone."""
    rng = np.random.default_rng(seed)
    frozen = sorted({0, *rng.choice(20, size=5, replace=False).tolist()})
    psi = rng.uniform(0.2, 1.0, size=len(frozen))
    configs = [BATCHES[int(rng.integers(0, 4)) :] for _ in range(4)] + [(), (8, 16)]
    grids = [rng.choice([100.0, 200.0, 300.0], size=(len(b), len(frozen))) for b in configs]
    grids[0][0, 0] = math.nan
    grids[-1][:] = 0.0
    effs = [None if c % 2 else rng.uniform(0.5, 1.0, size=g.shape) for c, g in enumerate(grids)]
    for lam, current in ((1.0, None), (0.9, frozen[-1]), (1.0, frozen[1])):
        got = tune_rows([
            TuneRow(b, frozen, psi, grid, eff, lam, current)
            for b, grid, eff in zip(configs, grids, effs, strict=True)
        ])  # fmt: skip
        for b, grid, eff, choice in zip(configs, grids, effs, got, strict=True):
            want = _tuned_by_hand(b, frozen, psi, grid, lam, current, eff)
            have = (
                None if choice is None else (choice.batch, choice.frozen, choice.effective_progress)
            )
            assert have == want
        assert got[-2] is None and got[-1] is None


@pytest.mark.parametrize("seed", SEEDS)
def test_tune_rows_tunes_the_configurations_of_many_jobs_by_the_rule(seed: int) -> None:
    """Rows of different jobs in one pass (each its own frozen depths, psi, lambda, current
    depth and efficiency; grids of different sizes, ties, NaN cells, lambda 0) choose what
    the rule chooses for each alone, with the floats of one tune_grid call a row."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(12):
        frozen = sorted({0, *rng.choice(20, size=int(rng.integers(0, 6)), replace=False).tolist()})
        batches = BATCHES[int(rng.integers(0, 5)) :]
        grid = rng.choice([100.0, 200.0, 300.0], size=(len(batches), len(frozen)))
        if rng.random() < 0.3:
            grid[0, -1] = math.nan
        eff = None if rng.random() < 0.5 else rng.uniform(0.5, 1.0, size=grid.shape)
        current = [None, *frozen][int(rng.integers(0, len(frozen) + 1))]
        lam = float(rng.choice([1.0, 0.9, 0.0]))
        psi = rng.uniform(0.2, 1.0, size=len(frozen))
        rows.append(TuneRow(batches, frozen, psi, grid, eff, lam, current))
    got = tune_rows(rows)
    assert len(got) == len(rows)
    for row, choice in zip(rows, got, strict=True):
        want = _tuned_by_hand(row.batch_sizes, row.frozen_candidates, row.psi, row.throughput,
                              row.lam, row.current_frozen, row.efficiency)  # fmt: skip
        have = None if choice is None else (choice.batch, choice.frozen, choice.effective_progress)
        assert have == want
        alone = tune_grid(batch_sizes=row.batch_sizes, frozen_candidates=row.frozen_candidates,
                          psi=row.psi, throughput=row.throughput, lam=row.lam,
                          current_frozen=row.current_frozen, efficiency=row.efficiency)  # fmt: skip
        assert choice == alone
    assert any(c is None for c in got) and any(c is not None for c in got)
    with pytest.raises(InputError):
        tune_rows([rows[0]._replace(lam=1.5)])
