import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.throughput import (
    DdpThroughputModel,
    FreezeParams,
    LinearCurve,
    SyncCurve,
    backward_time,
    iteration_time,
    nodes_for,
    overlap,
    sync_time,
)
from icefrog_slurm.errors import InputError

MODEL = DdpThroughputModel(
    forward=LinearCurve(0.004, 0.0002),
    backward=LinearCurve(0.008, 0.0004),
    sync=SyncCurve(0.02, 0.002, 0.06, 0.006),
    freeze=FreezeParams(alpha_flop=0.01, gamma_flop=0.7, alpha_sync=0.005, gamma=2.0),
)
LAYERS = LayerTable(flops=(4, 3, 2, 1), param_bytes=(1, 1, 4, 4))


def test_sync_curve_follows_pollux_links() -> None:
    sync = MODEL.sync
    assert sync(1.0, 1.0) == 0.0  # one GPU: no all-reduce
    assert sync(2.0, 1.0) == pytest.approx(0.02)
    assert sync(4.0, 1.0) == pytest.approx(0.02 + 0.002 * 2)
    assert sync(8.0, 2.0) == pytest.approx(0.06 + 0.006 * 6)
    assert nodes_for(8) == 2 and nodes_for(4) == 1 and nodes_for(5, 2) == 3


@given(
    st.sampled_from([1, 2, 4, 8, 16]),
    st.integers(1, 512),
    st.floats(0.0, 0.1),
    st.floats(0.2, 3.0),
    st.floats(0.0, 0.05),
    st.floats(1.0, 10.0),
)
def test_l0_gives_the_unfrozen_profile_back(
    gpus: int, batch: int, a_flop: float, g_flop: float, a_sync: float, gamma: float
) -> None:
    """Spec section 16: with l = 0 the model returns the unfrozen curves, whatever the
    freezing parameters."""
    freeze = FreezeParams(alpha_flop=a_flop, gamma_flop=g_flop, alpha_sync=a_sync, gamma=gamma)
    model = DdpThroughputModel(MODEL.forward, MODEL.backward, MODEL.sync, freeze)
    t_fwd, t_bwd, t_sync, t_iter = model.times(gpus=gpus, batch=batch, theta=1.0, omega=1.0)
    assert t_fwd == pytest.approx(model.forward(float(batch)))
    assert t_bwd == pytest.approx(model.backward(float(batch)))
    assert t_sync == pytest.approx(model.sync(float(gpus), float(nodes_for(gpus))))
    unfrozen = model.forward(float(batch)) + overlap(
        model.backward(float(batch)), model.sync(float(gpus), float(nodes_for(gpus))), gamma
    )
    assert t_iter == pytest.approx(unfrozen)
    assert model.throughput(gpus=gpus, batch=batch, frozen=0, layers=LAYERS) == pytest.approx(
        gpus * batch / unfrozen
    )


def test_eq6_eq7_shapes() -> None:
    p = FreezeParams(alpha_flop=0.01, gamma_flop=0.5, alpha_sync=0.002, gamma=1.0)
    # theta = 0.25 with gamma_flop 0.5: the variable part halves (sub-linear), the fixed stays.
    assert backward_time(p, 0.05, 0.25) == pytest.approx(0.01 + 0.5 * 0.04)
    assert backward_time(p, 0.05, 0.0) == pytest.approx(0.01)  # all frozen: launch cost only
    assert sync_time(p, 0.03, 0.5) == pytest.approx(0.002 + 0.5 * 0.028)
    assert sync_time(p, 0.0, 0.5) == 0.0  # one GPU stays without sync
    assert backward_time(p, 0.005, 0.5) <= 0.005  # a fixed cost never exceeds the whole
    assert p.beta_flop(0.05) == pytest.approx(0.8)  # tied so that l = 0 is the profile


def test_overlap_exponent() -> None:
    assert overlap(3.0, 4.0, 1.0) == pytest.approx(7.0)  # no overlap: add
    assert overlap(3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert overlap(3.0, 4.0, 10.0) == pytest.approx(4.0, rel=0.01)  # near max
    assert iteration_time(1.0, 3.0, 4.0, 2.0) == pytest.approx(6.0)


def test_freezing_speeds_up_and_throughput_formula() -> None:
    rates = [MODEL.throughput(gpus=4, batch=64, frozen=k, layers=LAYERS) for k in range(4)]
    assert all(a < b for a, b in itertools.pairwise(rates))
    *_, t_iter = MODEL.times(gpus=4, batch=64, theta=LAYERS.theta(2), omega=LAYERS.omega(2))
    assert MODEL.throughput(gpus=4, batch=64, frozen=2, layers=LAYERS, lam=0.9) == pytest.approx(
        4 * 64 / t_iter * 0.9
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"alpha_flop": -1.0}, "alpha_flop"),
        ({"gamma": 0.5}, "gamma"),
        ({"gamma_flop": 0.0}, "gamma_flop"),
        ({"alpha_sync": float("nan")}, "alpha_sync"),
    ],
)
def test_bad_freeze_params(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InputError, match=field):
        FreezeParams(**kwargs)
