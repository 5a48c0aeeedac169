import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icefrog_slurm.core.penalty import (
    PSI_FLOOR,
    PenaltyTable,
    RemainingWork,
    effective_progress,
    extra_iterations,
    frozen_penalty,
)
from icefrog_slurm.errors import InputError

variances = st.lists(
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=40
)


def test_spec_section5_worked_numbers() -> None:
    # prefix 20 at freeze time, suffix 80 now: psi 0.8, 1000 iterations -> 250 more.
    psi = frozen_penalty(20.0, 80.0)
    assert psi == pytest.approx(0.8)
    assert extra_iterations(psi, 1000) == pytest.approx(250.0)
    assert effective_progress(psi, 140.0) == pytest.approx(112.0)
    assert effective_progress(psi, 120.0) == pytest.approx(96.0)


def test_table_is_suffix_over_total() -> None:
    table = PenaltyTable((3.0,) * 10 + (7.0,) * 10)  # spec section 11: prefix 30, suffix 70
    assert table.psi(10) == pytest.approx(0.7)
    assert table.psi(0) == 1.0
    assert table.psi(5) == pytest.approx(85.0 / 100.0)


@given(variances, st.data())
def test_psi_is_in_floor_one_and_falls_with_depth(values: list[float], data: st.DataObject) -> None:
    table = PenaltyTable(tuple(values))
    psis = [table.psi(k) for k in range(len(values) + 1)]
    assert psis[0] == 1.0
    assert all(PSI_FLOOR <= p <= 1.0 for p in psis)
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(psis))
    k = data.draw(st.integers(0, len(values)))
    total = math.fsum(values)
    if total > 0 and math.fsum(values[k:]) > 0:
        assert table.psi(k) == pytest.approx(max(PSI_FLOOR, math.fsum(values[k:]) / total))
    # all at once (the Layer Tuner's candidates): the same floats as eq 3 term by term
    depths = data.draw(st.lists(st.integers(0, len(values)), max_size=10))
    assert table.psis(depths) == [
        frozen_penalty(math.fsum(values[:d]), math.fsum(values[d:])) for d in depths
    ]


def test_documented_limits() -> None:
    assert PenaltyTable((0.0, 0.0, 0.0)).psi(2) == 1.0  # no signal yet: nothing to lose
    assert PenaltyTable((5.0, 0.0)).psi(1) == PSI_FLOOR  # suffix silent: floored, not 0
    assert extra_iterations(PSI_FLOOR, 10) == pytest.approx(9990.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_variances_name_the_layer(bad: float) -> None:
    with pytest.raises(InputError, match=r"grad_var\[1\]"):
        PenaltyTable((1.0, bad, 1.0))


def test_empty_and_out_of_range() -> None:
    with pytest.raises(InputError, match="grad_var"):
        PenaltyTable(())
    with pytest.raises(InputError, match="frozen: 4"):
        PenaltyTable((1.0, 1.0)).psi(4)
    with pytest.raises(InputError, match="frozen: -1"):
        PenaltyTable((1.0, 1.0)).psis([0, 1, -1])
    with pytest.raises(InputError, match="psi"):
        extra_iterations(0.0, 10)


def test_progress_accounting() -> None:
    work = RemainingWork.start(max_epochs=3, samples_per_epoch=1000)
    assert work.samples == 3000
    work = work.advance(samples=1000, psi=0.5)  # 1000 frozen samples are worth 500
    assert work.samples == pytest.approx(2500)
    work = work.advance(samples=1000, psi=1.0)
    assert work.samples == pytest.approx(1500)
    assert not work.done
    assert work.advance(samples=10_000, psi=1.0).done  # never below zero
    with pytest.raises(InputError, match="max_epochs"):
        RemainingWork.start(max_epochs=0, samples_per_epoch=10)
    with pytest.raises(InputError, match="psi"):
        work.advance(samples=1, psi=1.5)
