from collections.abc import Sequence

import numpy as np
import pytest

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.sharing import (
    PRIOR_ACTIVATION_BYTES_PER_FLOP,
    PRIOR_CONTEXT_BYTES,
    PRIOR_UTIL,
    DeclaredLoad,
    LinearRegression,
    Load,
    LoadModel,
    SharingPredictor,
    admissible,
    credited_util,
    fit_linear,
    fit_sharing,
    shared_throughput,
    sharing_lambda,
)
from icefrog_slurm.core.tuner import FloatArray, tune_grid
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


def test_credited_util_is_eq8_at_lambda_one_and_keeps_the_credited_speed_below() -> None:
    assert credited_util(0.6, 1.0) == 0.6
    # Two jobs at 70 % time-slice to 1/1.4 = 0.71 of their speed each: they keep 0.7 (the
    # pair is admitted when lambda = 0.7) but not 0.9.
    assert credited_util(0.7, 0.7) * 2 <= 1.0
    assert credited_util(0.7, 0.9) * 2 > 1.0


def test_declared_load_from_the_tables() -> None:
    layers = LayerTable(flops=(1e9, 1e9), param_bytes=(1e8, 3e8))
    load = DeclaredLoad().predict(batch=10, frozen=0, layers=layers)
    assert load.util == PRIOR_UTIL
    acts = PRIOR_ACTIVATION_BYTES_PER_FLOP * 2e9 * 10
    assert load.memory == pytest.approx(PRIOR_CONTEXT_BYTES + 4e8 * 4 + acts)
    frozen = DeclaredLoad().predict(batch=10, frozen=1, layers=layers)  # omega = 3/4
    assert frozen.memory == pytest.approx(PRIOR_CONTEXT_BYTES + 4e8 * (1 + 3 * 0.75) + acts)
    util, memory = DeclaredLoad().predict_grid(batches=(10, 20), frozen=(0, 1), layers=layers)
    assert util.shape == memory.shape == (2, 2) and memory[0, 1] == pytest.approx(frozen.memory)


def test_predict_grid_matches_predict() -> None:
    layers = LayerTable(flops=(3.0, 1.0, 1.0), param_bytes=(1.0, 1.0, 2.0))
    pred = SharingPredictor(
        util=LinearRegression((0.1, 0.004, 0.3, 0.1)),
        memory=LinearRegression((1e9, 2e7, 4e9, 3e9)),
    )
    util, memory = pred.predict_grid(batches=(16, 64), frozen=(0, 2, 3), layers=layers)
    for i, m in enumerate((16, 64)):
        for j, k in enumerate((0, 2, 3)):
            one = pred.predict(batch=m, frozen=k, layers=layers)
            assert util[i, j] == pytest.approx(one.util) and memory[i, j] == pytest.approx(
                one.memory
            )


def _grid_load(util: list[list[float]], memory: list[list[float]]) -> LoadModel:
    class Grid:
        def predict(self, *, batch: int, frozen: int, layers: LayerTable) -> Load:
            raise AssertionError("the shared option reads the grid")

        def predict_grid(
            self, *, batches: Sequence[int], frozen: Sequence[int], layers: LayerTable
        ) -> tuple[FloatArray, FloatArray]:
            return np.array(util), np.array(memory)

    return Grid()


def test_the_shared_option_is_tuned_on_the_configurations_that_fit_half_a_gpu() -> None:
    layers = LayerTable.uniform(4)
    grid = np.array([[100.0, 120.0], [150.0, 170.0]])
    kwargs = dict(batch_sizes=(32, 64), frozen_candidates=(0, 2), throughput=grid,
                  layers=layers, lam=0.9, gpu_memory=80 * GB)  # fmt: skip
    tuner = dict(batch_sizes=(32, 64), frozen_candidates=(0, 2), psi=np.array([1.0, 0.9]),
                 lam=0.9)  # fmt: skip
    # Batch 64 is fastest but takes 70 % of the GPU (credited 63 %): not within half.
    loads = _grid_load([[0.5, 0.45], [0.7, 0.65]], [[10 * GB] * 2, [20 * GB] * 2])
    fitting, util, memory = shared_throughput(loads=loads, **kwargs)  # type: ignore[arg-type]
    assert fitting.tolist() == [[100.0, 120.0], [0.0, 0.0]]
    assert util.tolist() == [[0.5, 0.45], [0.7, 0.65]] and memory[0, 1] == 10 * GB
    choice = tune_grid(throughput=fitting, **tuner)  # type: ignore[arg-type]
    assert choice is not None and (choice.batch, choice.frozen) == (32, 2)  # 0.9 x 120 > 100
    # Memory counts too: 40 GB x 1.1 > 40 GB leaves nothing within half of 80 GB.
    big = _grid_load([[0.1, 0.1], [0.1, 0.1]], [[40 * GB] * 2, [40 * GB] * 2])
    none, _, _ = shared_throughput(loads=big, **kwargs)  # type: ignore[arg-type]
    assert not none.any() and tune_grid(throughput=none, **tuner) is None  # type: ignore[arg-type]
    # One job a GPU may use all of it (then the fastest is chosen, as the exclusive tuner).
    whole, _, _ = shared_throughput(loads=loads, jobs_per_gpu=1, **kwargs)  # type: ignore[arg-type]
    assert whole.tolist() == grid.tolist()
    with pytest.raises(InputError):
        shared_throughput(loads=loads, jobs_per_gpu=0, **kwargs)  # type: ignore[arg-type]


def test_samples_of_one_batch_say_nothing_about_other_batches() -> None:
    layers = LayerTable.uniform(4)
    one_batch = [
        ProfileSample(1, 64, k, False, 0.0, 0.0, 0.0, 0.1, 640.0, 10e9 - k * 1e9, 0.9 - 0.05 * k)
        for k in (0, 2)
    ]
    pred = fit_sharing(one_batch, layers)
    assert pred is not None
    # Not a quarter of 0.9 at batch 32 (the minimum-norm share-out onto the batch column):
    # the batch was never varied, so its coefficient is 0 and the depth explains the rest.
    assert pred.util.coef[1] == 0.0
    assert pred.predict(batch=32, frozen=0, layers=layers).util == pytest.approx(0.9)
    assert pred.predict(batch=64, frozen=2, layers=layers).util == pytest.approx(0.8)
    # Outside the measured batches nothing is judged: memory grows with the batch.
    util, memory = pred.predict_grid(batches=(32, 64, 128), frozen=(0,), layers=layers)
    assert np.isinf(util[[0, 2], 0]).all() and np.isinf(memory[[0, 2], 0]).all()
    assert util[1, 0] == pytest.approx(0.9)
