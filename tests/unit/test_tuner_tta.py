import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.penalty import PenaltyTable
from icefrog_slurm.core.throughput import DdpThroughputModel, FreezeParams, LinearCurve, SyncCurve
from icefrog_slurm.core.tta import iceshare, time_to_accuracy
from icefrog_slurm.core.tuner import (
    legal_frozen,
    max_freeze_speedup,
    measured_or_predicted,
    powers_of_two,
    tune,
)
from icefrog_slurm.errors import InputError

SECTION11 = {(2, 64, 0): 800.0, (2, 64, 10): 1200.0}


def _section11(suffix_var: float) -> PenaltyTable:
    return PenaltyTable((3.0,) * 10 + (suffix_var / 10,) * 10)


def test_section11_tuner_picks_freezing_then_thaws() -> None:
    table = LayerTable.uniform(20)
    fn = measured_or_predicted(gpus=2, measured=SECTION11, model=None, layers=table)
    first = tune(batch_sizes=[64], frozen_candidates=[0, 10], psi=_section11(70).psi, throughput=fn)
    assert first is not None
    assert (first.frozen, first.psi, first.effective_progress) == (
        10,
        pytest.approx(0.7),
        pytest.approx(840),
    )
    later = tune(batch_sizes=[64], frozen_candidates=[0, 10], psi=_section11(30).psi, throughput=fn)
    assert later is not None
    assert (later.frozen, later.effective_progress) == (0, pytest.approx(800))


def test_section11_tta_and_iceshare() -> None:
    age = 30 * 60.0
    full = time_to_accuracy(age_s=age, remaining=720_000, effective_progress=800)
    frozen = time_to_accuracy(age_s=age, remaining=720_000, effective_progress=840)
    assert full - age == pytest.approx(900) and frozen - age == pytest.approx(857.14, abs=0.01)
    four = time_to_accuracy(age_s=age, remaining=720_000, effective_progress=1000)
    share = iceshare({2: frozen, 4: four})
    assert share[2] == pytest.approx(0.948, abs=1e-3) and share[4] == 1.0


def test_section10_iceshare() -> None:
    share = iceshare({1: 100.0, 2: 60.0, 4: 50.0})
    assert [round(share[a], 2) for a in (1, 2, 4)] == [0.5, 0.83, 1.0]
    assert iceshare({1: math.inf, 2: 10.0})[1] == 0.0
    with pytest.raises(InputError, match="no option"):
        iceshare({1: math.inf})


@given(st.floats(1.0, 1e5), st.sampled_from([16, 32, 64]), st.integers(0, 18))
def test_psi_one_gives_e_equal_t(rate: float, batch: int, frozen: int) -> None:
    """Spec section 16: with psi = 1, effective progress is the layer-aware throughput."""
    choice = tune(
        batch_sizes=[batch], frozen_candidates=[frozen], psi=lambda _: 1.0,
        throughput=lambda m, k: rate,
    )  # fmt: skip
    assert choice is not None and choice.effective_progress == choice.throughput == rate


def test_predicted_entries_fill_the_gaps_and_measured_win() -> None:
    layers = LayerTable.uniform(20)
    model = DdpThroughputModel(
        LinearCurve(0.0, 0.0), LinearCurve(0.01, 0.001), SyncCurve(0.01, 0, 0.02, 0), FreezeParams()
    )
    fn = measured_or_predicted(gpus=2, measured={(2, 64, 0): 1.0}, model=model, layers=layers)
    assert fn(64, 0) == 1.0
    assert fn(32, 0) == pytest.approx(model.throughput(gpus=2, batch=32, frozen=0, layers=layers))


def test_shared_lambda_and_unselectable() -> None:
    fn = lambda m, k: 100.0 * m  # noqa: E731
    choice = tune(
        batch_sizes=[8, 16], frozen_candidates=[0], psi=lambda _: 1.0, throughput=fn, lam=0.9
    )
    assert choice is not None and choice.batch == 16 and choice.throughput == pytest.approx(1440)
    assert (
        tune(batch_sizes=[8], frozen_candidates=[0], psi=lambda _: 1.0, throughput=fn, lam=0.0)
        is None
    )


def test_ties_keep_the_current_depth() -> None:
    flat = lambda m, k: 500.0  # noqa: E731
    choice = tune(
        batch_sizes=[32], frozen_candidates=[0, 4, 8], psi=lambda _: 1.0, throughput=flat,
        current_frozen=4,
    )  # fmt: skip
    assert choice is not None and choice.frozen == 4


def test_candidates_and_batches() -> None:
    assert powers_of_two(10, 100) == (16, 32, 64)
    assert powers_of_two(1, 1) == (1,)
    with pytest.raises(InputError, match="no power of two"):
        powers_of_two(5, 7)
    table = LayerTable.uniform(8, boundaries=(2, 4, 8))
    assert legal_frozen(table, 7) == (0, 2, 4)
    assert legal_frozen(table, 8, restrict=[0, 3, 8]) == (0, 8)
    with pytest.raises(InputError, match="max_frozen"):
        legal_frozen(table, 9)


class _Wild:
    """A fitted model gone wrong at deep freezes: iteration time near zero."""

    def throughput(self, *, gpus: int, batch: int, frozen: int, layers: LayerTable) -> float:
        return 1000.0 if frozen == 0 else 1000.0 * 10**frozen

    def throughputs(
        self, *, gpus: int | np.ndarray, batch: np.ndarray, frozen: np.ndarray, layers: LayerTable
    ) -> np.ndarray:
        return np.broadcast_to(
            1000.0 * 10.0 ** frozen.astype(float), np.broadcast(gpus, batch, frozen).shape
        )


def test_a_predicted_freeze_speedup_is_capped_by_compute_but_a_measured_one_is_not() -> None:
    table = LayerTable.uniform(10)
    assert max_freeze_speedup(table, 0) == pytest.approx(1.0)
    assert max_freeze_speedup(table, 9) == pytest.approx(3.0 / 1.2)  # theta = 0.1
    caps = [max_freeze_speedup(table, k) for k in range(10)]
    assert caps == sorted(caps)
    t = measured_or_predicted(gpus=1, measured={(1, 64, 5): 9999.0}, model=_Wild(), layers=table)
    assert t(64, 9) == pytest.approx(1000.0 * 3.0 / 1.2)
    assert t(64, 1) == pytest.approx(1000.0 * 3.0 / 2.8)  # 10x predicted, capped
    assert t(64, 5) == 9999.0  # measured: as measured
    assert t(64, 0) == 1000.0
    # with the cap, a tiny psi no longer buys a deep freeze (eq 15)
    psi = PenaltyTable((1.0,) * 9 + (0.05,)).psi
    best = tune(batch_sizes=(64,), frozen_candidates=range(10), psi=psi, throughput=t)
    assert best is not None and best.frozen in (0, 5)
