import pytest

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.errors import InputError


def test_uniform_fractions_fall_linearly() -> None:
    table = LayerTable.uniform(20)
    assert table.theta(0) == 1.0
    assert table.theta(10) == pytest.approx(0.5)
    assert table.omega(20) == 0.0
    assert table.candidates(18) == tuple(range(19))


def test_flops_and_bytes_give_different_fractions() -> None:
    # A cheap-in-FLOPs but parameter-heavy front layer (spec section 6's caveat).
    table = LayerTable(flops=(1, 9), param_bytes=(9, 1))
    assert table.theta(1) == pytest.approx(0.9)
    assert table.omega(1) == pytest.approx(0.1)


def test_boundaries_restrict_candidates_and_include_zero() -> None:
    table = LayerTable.uniform(8, boundaries=(2, 4, 8))
    assert table.boundaries == (0, 2, 4, 8)
    assert table.candidates(7) == (0, 2, 4)


def test_max_frozen_fraction() -> None:
    assert LayerTable.uniform(20).max_frozen_from_fraction(0.9) == 18
    assert LayerTable.uniform(7).max_frozen_from_fraction(0.9) == 6


@pytest.mark.parametrize(
    ("flops", "params", "message"),
    [
        ((1, -1), (1, 1), "layer_flops[1]"),
        ((1, float("nan")), (1, 1), "layer_flops[1]"),
        ((0, 0), (1, 1), "layer_flops: the layers' total"),
        ((1, 1), (1,), "layer_param_bytes: has 1 layers"),
    ],
)
def test_bad_tables_name_the_field(
    flops: tuple[float, ...], params: tuple[float, ...], message: str
) -> None:
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        LayerTable(flops=flops, param_bytes=params)


def test_out_of_range_frozen_is_an_error() -> None:
    with pytest.raises(InputError, match="frozen: 21"):
        LayerTable.uniform(20).theta(21)
