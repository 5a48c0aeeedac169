"""``--gpu-model v100``: Pollux's V100 measurements as measured and Pollux's applications
finishing as AdaptDL's simulator finishes them (``sim/calibration.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import GradStats
from icefrog_slurm.sim.calibration import (
    A800_COMPUTE_SPEEDUP,
    calibrate_pollux,
    from_document,
    shipped_calibration,
    to_document,
)
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import SimOptions
from icefrog_slurm.sim.jobs import Config, SimJob
from icefrog_slurm.sim.pollux import read_placements, read_validation
from icefrog_slurm.sim.truth import TaskTruth
from icefrog_slurm.sim.workload import TraceJob

TRACES = Path(__file__).resolve().parents[2] / "data" / "pollux" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.exists(), reason="Pollux data not present")


def truth(name: str, gpu_model: str = "v100", seed: int = 1) -> TaskTruth:
    catalog = shipped_catalog()
    cal = shipped_calibration(gpu_model)[name]
    return TaskTruth(catalog.get(name), catalog.layers(name), cal, seed=seed)


def test_unknown_gpu_model_is_a_clear_input_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(InputError, match="--gpu-model: unknown 'h100'; choose from a800, v100"):
        SimOptions(gpu_model="h100").check()
    with pytest.raises(InputError, match="--gpu-model"):
        shipped_calibration("V100")
    workload = tmp_path / "w.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\nj,0,ncf,1,32768\n")
    argv = ["simulate", "--workload", str(workload), "--out", str(tmp_path / "out")]
    assert main([*argv, "--gpu-model", "h100", "--quiet"]) == 2
    assert "--gpu-model: unknown 'h100'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_v100_step_times_are_the_catalogs_measured_ones() -> None:
    """A task with measured single-GPU V100 steps (``v100_step_s``) steps exactly that long
    on one V100, and A800_COMPUTE_SPEEDUP times faster on the A800s."""
    task = shipped_catalog().get("mobilenetv2-cifar10")
    assert task.v100_step_s
    v100 = shipped_calibration("v100")[task.name]
    a800 = shipped_calibration()[task.name]
    for batch, seconds in task.v100_step_s:
        assert batch / v100.throughput(gpus=1, batch=batch) == pytest.approx(seconds, rel=1e-9)
        a800_s = batch / a800.throughput(gpus=1, batch=batch)
        assert a800_s == pytest.approx(seconds / A800_COMPUTE_SPEEDUP, rel=1e-9)


@needs_traces
def test_v100_model_is_the_fit_of_the_measured_rows_without_a800_factors() -> None:
    """The shipped V100 model of a Pollux task predicts Pollux's measured step times (no
    factor: the A800 one would be about twice as fast) and is what a fresh fit gives."""
    name = "yolov3-voc"
    task = shipped_catalog().get(name)
    cal = shipped_calibration("v100")[name]
    rows = read_placements(TRACES / "yolov3")
    errors = [
        abs(cal.throughput(gpus=s.gpus, batch=s.batch, nodes=n) / s.samples_per_s - 1)
        for s, n in rows
    ]
    assert float(np.median(errors)) < 0.1  # the fit's error, not a factor of 2
    fresh = calibrate_pollux(task, TRACES / "yolov3", "v100")
    again = from_document(to_document({name: fresh}, shipped_catalog(), v100={name: fresh}), "v100")
    for gpus, batch in ((1, 4), (4, 8), (16, 8)):
        assert cal.throughput(gpus=gpus, batch=batch) == pytest.approx(
            again[name].throughput(gpus=gpus, batch=batch), rel=1e-6
        )


def pollux_epochs(app: str, batch: int) -> list[float]:
    """Samples each epoch takes at a fixed global batch until AdaptDL's simulator finishes
    ``app``, straight from its validation files: epoch e ends at progress min over the
    files of progress[e]; a step makes (var + sqr) / (var / scale + sqr) progress, the
    statistics interpolated linearly between the two validated batches around ``batch``."""
    curves = read_validation(TRACES / app)
    epochs = min(len(c.progress) for c in curves.values())
    ends = [min(c.progress[e] for c in curves.values()) for e in range(epochs)]
    lo = max(b for b in curves if b <= batch)
    hi = min(b for b in curves if b >= batch)
    w = 0.0 if hi == lo else (batch - lo) / (hi - lo)
    out, before = [], 0.0
    for e, end in enumerate(ends):
        sqr = (1 - w) * curves[lo].grad_sqr[e] + w * curves[hi].grad_sqr[e]
        var = (1 - w) * curves[lo].grad_var[e] + w * curves[hi].grad_var[e]
        scale = batch / min(curves)
        out.append((end - before) / ((var + sqr) / (var / scale + sqr)) * batch)
        before = end
    return out


@needs_traces
@pytest.mark.parametrize(
    ("name", "app", "batch"),
    [("bert-squad", "bert", 12), ("resnet18-cifar10", "cifar10", 1536),
     ("deepspeech2-arctic", "deepspeech2", 320)],
)  # fmt: skip
def test_a_job_finishes_as_pollux_finishes_it(name: str, app: str, batch: int) -> None:
    t = truth(name)
    need = sum(pollux_epochs(app, batch))
    assert t.samples_to_target(batch) == pytest.approx(need, rel=1e-9)
    run = t.start_run(seed=7)  # no per-job factor under Pollux's rule: any seed
    step = need / 997
    done = 0.0
    while not run.reached:
        run.advance(samples=step, global_batch=batch)
        done += step
    assert done - step < need <= done * (1 + 1e-9)
    assert run.epoch == len(t.pollux_app.boundaries) - 1  # type: ignore[union-attr]


@needs_traces
@pytest.mark.parametrize("steps", [(7.0, 3.0), (101.0, 0.5)])
def test_a_changed_batch_counts_its_own_gain_from_then_on(steps: tuple[float, float]) -> None:
    """Half the epochs at the smallest batch, the rest at the largest: the second part takes
    the largest batch's samples of those epochs, however the caller slices the steps."""
    t = truth("resnet18-cifar10")
    app = t.pollux_app
    assert app is not None
    small, large = app.batches[0], app.batches[-1]
    half = len(app.boundaries) // 2
    run = t.start_run(seed=1)
    first = sum(pollux_epochs("cifar10", small)[:half])
    step = small * steps[0]
    done = 0.0
    while done < first:
        run.advance(samples=min(step, first - done), global_batch=small)
        done += min(step, first - done)
    run.advance(samples=first * 1e-12, global_batch=small)  # past the boundary's rounding
    assert run.epoch == half
    need = sum(pollux_epochs("cifar10", large)[half:])
    step, used = large * steps[1], 0.0
    while not run.reached:
        run.advance(samples=step, global_batch=large)
        used += step
    assert used - step < need * (1 + 1e-9) and need <= used * (1 + 1e-9)


def test_a800_keeps_the_target_rule_and_v100_the_pollux_limits() -> None:
    assert all(c.application is None for c in shipped_calibration().values())
    v100 = shipped_calibration("v100")
    pollux = {n for n, c in v100.items() if c.application is not None}
    assert pollux == {n for n in v100 if shipped_catalog().get(n).pollux_app}
    ncf = truth("ncf-movielens")
    base = ncf.task.job_spec(shipped_catalog().layers(ncf.task.name))
    spec = ncf.pollux_app.job_spec(base)  # type: ignore[union-attr]
    assert (spec.min_gpus, spec.max_gpus, spec.global_batch) == (1, 1, 32768)
    cifar = truth("resnet18-cifar10")
    spec = cifar.pollux_app.job_spec(cifar.task.job_spec(shipped_catalog().layers(cifar.task.name)))  # type: ignore[union-attr]
    assert (spec.min_gpus, spec.max_gpus, spec.global_batch) == (1, 64, 0)
    assert (spec.min_batch, spec.max_batch, spec.max_epochs) == (32, 1024, 100)


def test_reported_gradient_statistics_are_pollux_measured_ones() -> None:
    """Under v100 a job reports, summed over its trainable layers, the application's measured
    (sqr, var) at its epoch and global batch, var moved to its own base batch."""
    t = truth("resnet18-cifar10")
    app = t.pollux_app
    assert app is not None
    spec = app.job_spec(t.task.job_spec(shipped_catalog().layers(t.task.name)))
    job = SimJob(TraceJob("j", 0.0, t.task.name, 4, 512), t, spec, seed=3, overhead_s=0.0)
    job.set_config(Config(4, 1, 128, 0, False, (("n0", 0),)), 0.0)
    job.run.advance(samples=app.boundaries[2] * app.init_batch * 1.01, global_batch=128)
    stats: GradStats = job._grad_stats(3)
    sqr, var = app.grad_stats(512, job.run.epoch)
    assert job.run.epoch == 3
    assert sum(stats.grad_sqr) == pytest.approx(sqr, rel=1e-9)
    assert sum(stats.grad_var) == pytest.approx(var * app.init_batch / 32, rel=1e-9)
