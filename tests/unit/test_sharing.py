import pytest

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.sharing import (
    Load,
    admissible,
    fit_linear,
    fit_sharing,
    sharing_lambda,
)
from icefrog_slurm.errors import InputError

GB = 1e9


def test_spec_section11_pairs() -> None:
    frozen_job = Load(util=0.42, memory=30 * GB)
    small = Load(util=0.45, memory=35 * GB)
    big = Load(util=0.45, memory=45 * GB)
    assert admissible([frozen_job, small], gpu_memory=80 * GB)  # 71.5 GB, 87 %
    assert not admissible([frozen_job, big], gpu_memory=80 * GB)  # 82.5 GB > 80
    assert not admissible([Load(0.6, 1 * GB), Load(0.5, 1 * GB)], gpu_memory=80 * GB)  # 110 %
    # The safety factor is a setting: without it the 45 GB pair (75 GB) would fit.
    assert admissible([frozen_job, big], gpu_memory=80 * GB, memory_safety=1.0)


def test_eq8_lambda() -> None:
    assert sharing_lambda(shared=False, is_admissible=False) == 1.0
    assert sharing_lambda(shared=True, is_admissible=True) == 0.9
    assert sharing_lambda(shared=True, is_admissible=False) == 0.0  # not selectable
    assert sharing_lambda(shared=True, is_admissible=True, shared_lambda=0.7) == 0.7
    with pytest.raises(InputError, match="shared_lambda"):
        sharing_lambda(shared=True, is_admissible=True, shared_lambda=0.0)


def test_regressions_recover_a_linear_truth() -> None:
    layers = LayerTable.uniform(10)

    def sample(batch: int, frozen: int) -> ProfileSample:
        theta, omega = layers.theta(frozen), layers.omega(frozen)
        util = 0.1 + 0.002 * batch + 0.3 * theta
        mem = (2 + 0.05 * batch + 8 * theta + 4 * omega) * GB
        return ProfileSample(
            gpus=1, batch=batch, frozen=frozen, shared=False, t_fwd_s=0.0, t_bwd_s=0.0,
            t_sync_s=0.0, t_iter_s=0.1, samples_per_s=batch / 0.1, peak_mem_bytes=mem,
            gpu_util=util,
        )  # fmt: skip

    samples = [sample(m, k) for m in (16, 32, 64, 128) for k in (0, 3, 6, 9)]
    predictor = fit_sharing(samples, layers)
    assert predictor is not None
    load = predictor.predict(batch=256, frozen=5, layers=layers)
    assert load.util == pytest.approx(0.1 + 0.512 + 0.15, rel=1e-6)
    assert load.memory == pytest.approx((2 + 12.8 + 4 + 2) * GB, rel=1e-6)


def test_without_measurements_there_is_no_predictor() -> None:
    sample = ProfileSample(
        gpus=1, batch=8, frozen=0, shared=False, t_fwd_s=0.0, t_bwd_s=0.0,
        t_sync_s=0.0, t_iter_s=0.1, samples_per_s=80.0,
    )  # fmt: skip
    assert fit_sharing([sample], LayerTable.uniform(4)) is None
    with pytest.raises(InputError, match="fit_linear"):
        fit_linear([], [])
    with pytest.raises(InputError, match="gpu_memory"):
        admissible([], gpu_memory=0.0)
