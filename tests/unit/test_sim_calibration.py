"""Calibration of the simulated tasks against Pollux's measured profiles and curves."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from icefrog_slurm.sim.calibration import (
    A800_COMPUTE_SPEEDUP,
    FINE_TUNE_MFU,
    NOISE_SCALES,
    PCIE3_X16_BYTES_S,
    PEAK_FLOPS,
    SHARDED_SYNC_VOLUME,
    TRAINING_FLOPS_PER_FORWARD,
    calibrate_pollux,
    from_document,
    noise_scale,
    ring_allreduce_curve,
    shipped_calibration,
    size_class,
    sync_group,
    to_document,
)
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.pollux import read_placements, read_validation

TRACES = Path(__file__).resolve().parents[2] / "data" / "pollux" / "traces"
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="Pollux data not present")


# The three smallest Pollux profiles keep the test fast; ``python -m
# icefrog_slurm.sim.calibration`` prints all six (docs/simulator.md).
QUICK = ("yolov3-voc", "bert-squad", "deepspeech2-arctic")


@pytest.fixture(scope="module")
def fresh():
    catalog = shipped_catalog()
    return {n: calibrate_pollux(catalog.get(n), TRACES / catalog.get(n).pollux_app) for n in QUICK}


def test_heldback_ape_is_reported_and_loosely_bounded(fresh) -> None:
    for name, cal in fresh.items():
        assert cal.source.startswith("pollux:")
        e = cal.heldback_ape
        print(f"{name}: held-back throughput APE mean {e['mean']:.1f} % p95 {e['p95']:.1f} %"
              f" max {e['max']:.1f} % over {e['rows']:.0f} rows")  # fmt: skip
        assert e["mean"] < 15.0, name  # measured 7.6-10.1 %
        assert e["p95"] < 40.0, name  # measured 20.6-34.3 %


def test_shipped_calibration_is_current(fresh) -> None:
    """calibration.json is what ``python -m icefrog_slurm.sim.calibration`` gives today."""
    shipped = shipped_calibration()
    regenerate = "regenerate it: python -m icefrog_slurm.sim.calibration"
    assert set(shipped) == set(shipped_catalog().available()), regenerate
    again = from_document(to_document(fresh, shipped_catalog()))
    for name in QUICK:
        cal = shipped[name]
        for gpus, batch in ((1, 8), (4, 16), (8, 32), (16, 64)):
            assert cal.throughput(gpus=gpus, batch=batch) == pytest.approx(
                again[name].throughput(gpus=gpus, batch=batch), rel=1e-6
            )
        assert cal.samples == pytest.approx(again[name].samples)


def test_a800_is_the_v100_measurement_sped_up() -> None:
    """One GPU has no sync: A800 throughput = V100 measured x the assumed speedup (+- fit)."""
    cal = shipped_calibration()["resnet18-cifar10"]
    rows = [s for s, n in read_placements(TRACES / "cifar10") if s.gpus == 1]
    for s in rows:
        a800 = cal.throughput(gpus=1, batch=s.batch)
        assert a800 / s.samples_per_s == pytest.approx(A800_COMPUTE_SPEEDUP, rel=0.15)


def test_convergence_comes_from_the_validation_curves() -> None:
    cal = shipped_calibration()["resnet18-cifar10"]
    curves = read_validation(TRACES / "cifar10")
    assert cal.batches == tuple(curves)
    for batch, curve in curves.items():
        first = next(i for i, m in enumerate(curve.metric) if m >= 0.94)
        assert cal.samples_to_target(batch) == pytest.approx(curve.iteration[first] * batch)
    # between measured batches: log-log interpolation, inside the neighbours' range
    mid = cal.samples_to_target(math.sqrt(128 * 256))
    assert min(cal.samples[:2]) <= mid <= max(cal.samples[:2])
    # larger batches need more samples (statistical efficiency falls)
    assert cal.samples_to_target(4096) > cal.samples_to_target(128)


def test_scaled_tasks() -> None:
    cal, catalog = shipped_calibration(), shipped_catalog()
    mobilenet = cal["mobilenetv2-cifar10"]
    assert mobilenet.source == "scaled:resnet18-cifar10"
    for batch, v100_s in ((32, 0.057), (64, 0.074)):  # the spec's measured V100 steps
        t_iter = batch / mobilenet.throughput(gpus=1, batch=batch)
        assert t_iter == pytest.approx(v100_s / A800_COMPUTE_SPEEDUP, rel=1e-6)
    ddpm, resnet = cal["ddpm-cifar10"], cal["resnet18-cifar10"]
    ratio = sum(catalog.layers("ddpm-cifar10").flops) / sum(
        catalog.layers("resnet18-cifar10").flops
    )
    slow = resnet.throughput(gpus=1, batch=128) / ddpm.throughput(gpus=1, batch=128)
    assert slow == pytest.approx(ratio, rel=1e-6)
    base = catalog.get("ddpm-cifar10")
    assert ddpm.samples_to_target(base.min_batch) == pytest.approx(base.target_samples)


def test_fine_tuned_transformers_have_a_model_of_their_own() -> None:
    """LLaMA: compute from its FLOPs at the stated utilisation of the A800's peak, BERT's
    measured fixed cost an iteration, the pipeline's bubble under HP, a ring all-reduce of
    its bytes at PCIe 3.0's rate (1.5x under SDP, one stage's share among the replicas under
    HP), and BERT's measured convergence at the same global batches."""
    cal, catalog = shipped_calibration(), shipped_catalog()
    bert = cal["bert-squad"].model
    launch = bert.forward.intercept + bert.backward.intercept
    for name in ("llama-3b-squad2", "llama-7b-sst2"):
        task, c = catalog.get(name), cal[name]
        assert c.source == "fine-tune:bert-squad"
        layers = catalog.layers(name)
        per_sample = (
            TRAINING_FLOPS_PER_FORWARD * sum(layers.flops) / (PEAK_FLOPS["a800"] * FINE_TUNE_MFU)
        )
        p = task.parallelism.stages
        assert c.model.backward.slope == pytest.approx(per_sample, rel=1e-12)
        assert c.model.backward.intercept == pytest.approx(
            launch + (p - 1) / p * per_sample, rel=1e-12
        )
        # samples to the target: BERT's measured curve at the same batches, scaled
        ratios = [s / cal["bert-squad"].samples[0] for s in cal["bert-squad"].samples]
        for b, r in zip(cal["bert-squad"].batches, ratios, strict=True):
            assert c.samples_to_target(b) == pytest.approx(r * task.target_samples)
    sdp, hp = cal["llama-3b-squad2"], cal["llama-7b-sst2"]
    size = SHARDED_SYNC_VOLUME * sum(catalog.layers("llama-3b-squad2").param_bytes)
    assert sdp.model.sync(4.0, 1.0) == pytest.approx(1.5 * size / PCIE3_X16_BYTES_S, rel=0.05)
    # HP on one node of four is one pipeline: nothing to all-reduce, compute alone
    seven = catalog.get("llama-7b-sst2")
    assert sync_group(seven, 4) == 1 and sync_group(seven, 16) == 4
    t_iter = 8 * 4 / hp.throughput(gpus=4, batch=8, sync_gpus=1)
    assert t_iter == pytest.approx(hp.model.backward(8.0), rel=1e-12)
    # with replicas, each all-reduces its stage's quarter of the bytes
    stage = sum(catalog.layers("llama-7b-sst2").param_bytes) / 4
    assert hp.model.sync(2.0, 2.0) == pytest.approx(stage / PCIE3_X16_BYTES_S, rel=0.2)


def test_ring_allreduce_curve_fits_the_ring() -> None:
    alpha, beta = ring_allreduce_curve(1e9, 1e9, 2)
    assert (alpha, beta) == (pytest.approx(1.0), 0.0)
    alpha, beta = ring_allreduce_curve(1e9, 1e9, 4)  # 1, 4/3, 3/2 seconds at 2, 3, 4
    assert alpha + 2 * beta == pytest.approx(1.5, rel=0.03)
    assert 0 < beta < 0.5


def test_declared_size_classes_match_gpu_time() -> None:
    cal, catalog = shipped_calibration(), shipped_catalog()
    for name, c in cal.items():
        task = catalog.get(name)
        assert size_class(c.reference_gpu_seconds(task)) == task.size_class, name
    assert [size_class(h * 3600) for h in (0.5, 5, 50, 500)] == [
        "small", "medium", "large", "xlarge",
    ]  # fmt: skip


def test_the_checkout_data_is_the_default_and_elsewhere_pollux_is_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from icefrog_slurm.sim import calibration

    assert calibration.CHECKOUT_POLLUX_DIR == TRACES
    monkeypatch.setattr(calibration, "CHECKOUT_POLLUX_DIR", tmp_path / "absent")
    with pytest.raises(SystemExit) as exc:
        calibration.main(["--out", str(tmp_path / "c.json")])
    assert exc.value.code == 2
    assert "--pollux DIR is required outside a source checkout" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("true_scale", [50.0, 3000.0, 2e6])
def test_noise_scale_recovers_the_scale_of_a_pollux_shaped_curve(true_scale: float) -> None:
    """Samples to the target S(M) = S0 (B + M) / (B + M0) (Pollux's efficiency at noise
    scale B): the fit finds B within the grid's step, in whatever order the batches come."""
    batches = (512, 32, 64, 128, 256, 1024)
    samples = tuple(1e6 * (true_scale + m) / (true_scale + 32) for m in batches)
    step = NOISE_SCALES[1] / NOISE_SCALES[0]
    assert noise_scale(batches, samples) == pytest.approx(true_scale, rel=step - 1)


def test_noise_scale_at_the_ends_of_its_grid() -> None:
    """No loss at a larger batch, or one batch (nothing to fit): the largest scale; all
    loss (twice the samples at twice the batch): the smallest."""
    assert noise_scale((32, 64, 128), (1e6, 1e6, 1e6)) == NOISE_SCALES[-1]
    assert noise_scale((32,), (1e6,)) == NOISE_SCALES[-1]
    assert noise_scale((32, 64), (1e6, 2e6)) == NOISE_SCALES[0]
