"""Calibration of the simulated tasks: unfrozen step and sync times, and convergence.

For a task with Pollux data (``calibration.pollux`` in the catalog):

- **times** — Pollux's measured V100 profiles (``placements.csv`` + ``scalability.csv``)
  are fitted with the core's DDP model (``core.fit.fit_ddp_model``, eq 4-7 at l = 0, one
  compute curve as Pollux has no forward/backward split). A seeded 25 % of the rows is held
  back first and the throughput APE on them is recorded; the kept model is then refitted on
  every row. The V100 model is moved to the A800 cluster of the paper by the stated factors
  (:data:`A800_COMPUTE_SPEEDUP`, :data:`INTRA_NODE_SYNC_SCALE`, :data:`INTER_NODE_SYNC_SCALE`;
  see docs/simulator.md for why and how uncertain);
- **convergence** — samples to reach the catalog target at each measured global batch,
  from ``validation-<batch>.csv`` (first epoch whose metric reaches the target).

A task without Pollux data (``calibration.scale_from``) takes its source task's calibration
scaled by size: compute time x (FLOPs per sample ratio), sync time x (parameter bytes
ratio) — except that measured single-GPU V100 step times in the catalog (``v100_step_s``)
replace the FLOP-scaled compute curve — and the source's convergence shape (samples
relative to the smallest batch) applied to its own samples to the target at its own
smallest global batch (``calibration.target_epochs`` x samples_per_epoch, else its budget
P_0 = max_epochs x samples_per_epoch).

The result ships as ``icefrog_slurm/sim/data/calibration.json`` (regenerate with
``python -m icefrog_slurm.sim.calibration``, which reads the repository's
``data/pollux/traces``, or ``--pollux DIR`` outside a checkout) so the simulator needs
neither the Pollux files nor a fit at run time.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from icefrog_slurm.core.fit import ape, ddp_model_from, fit_ddp_model
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.throughput import (
    PARAMETERS,
    DdpThroughputModel,
    LinearCurve,
    SyncCurve,
)
from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import expect_object, get_number, get_str
from icefrog_slurm.sim.catalog import Catalog, Task, shipped_catalog
from icefrog_slurm.sim.pollux import (
    MeasuredRow,
    ValidationCurve,
    read_placements,
    read_scalability,
    read_validation,
)

A800_COMPUTE_SPEEDUP = 2.0
"""A800 over V100 compute time ratio assumed for training steps (fp32/TF32 mixed)."""
INTRA_NODE_SYNC_SCALE = 1.0
"""One-node all-reduce time factor: the paper's A800s sit on PCIe 3.0 (spec section 13)."""
INTER_NODE_SYNC_SCALE = 0.5
"""Multi-node all-reduce time factor: 200 Gbps HDR InfiniBand a node (spec section 13)."""
HELD_BACK_FRACTION = 0.25
SIZE_THRESHOLDS_H = (1.0, 10.0, 100.0)
"""GPU-hours bounds of small / medium / large / xlarge (Pollux's workload generator)."""
CHECKOUT_POLLUX_DIR = Path(__file__).resolve().parents[2] / "data" / "pollux" / "traces"
"""Pollux's measured traces in a source checkout (absent from an installed package)."""
ONE_LAYER = LayerTable.uniform(1)


@dataclass(frozen=True)
class TaskCalibration:
    """One task's calibrated unfrozen A800 model, convergence and provenance."""

    task: str
    source: str  # "pollux:<app>" or "scaled:<task>"
    model: DdpThroughputModel  # unfrozen, A800; forward folded into the backward curve
    batches: tuple[int, ...]  # global batches with a measured convergence point
    samples: tuple[float, ...]  # samples to reach the target at each
    heldback_ape: Mapping[str, float]  # mean / p95 / max throughput APE % (Pollux tasks)

    def samples_to_target(self, global_batch: float) -> float:
        """Unfrozen samples to reach the target at ``global_batch``: log-log interpolation
        between measured batches, the nearest end beyond them."""
        x = np.log(np.asarray(self.batches, dtype=float))
        y = np.log(np.asarray(self.samples, dtype=float))
        return float(np.exp(np.interp(math.log(max(global_batch, 1.0)), x, y)))

    def throughput(self, *, gpus: int, batch: int, nodes: int | None = None) -> float:
        """Unfrozen samples a second on A800 (eq 4 at l = 0)."""
        return self.model.throughput(
            gpus=gpus, batch=batch, frozen=0, layers=ONE_LAYER, nodes=nodes
        )

    def reference_gpu_seconds(self, task: Task) -> float:
        """GPU time of one run: min_gpus x samples to target / throughput, at the task's
        smallest GPU count and default per-GPU batch (unfrozen)."""
        a, m = task.min_gpus, task.default_batch
        return a * self.samples_to_target(a * m) / self.throughput(gpus=a, batch=m)


def size_class(gpu_seconds: float) -> str:
    """small < 1 GPU-hour <= medium < 10 <= large < 100 <= xlarge (Pollux's buckets)."""
    hours = gpu_seconds / 3600.0
    for name, bound in zip(("small", "medium", "large"), SIZE_THRESHOLDS_H, strict=True):
        if hours < bound:
            return name
    return "xlarge"


def fit_measured(rows: Sequence[MeasuredRow]) -> DdpThroughputModel:
    """The core's DDP fit (eq 5-7 at l = 0) on measured rows with their node counts."""
    return fit_ddp_model([s for s, _ in rows], ONE_LAYER, nodes=[n for _, n in rows])


def heldback_ape(rows: Sequence[MeasuredRow], seed: int = 0) -> np.ndarray:
    """Throughput APE (%) on a seeded 25 % of rows after fitting the other 75 %."""
    order = np.random.default_rng(seed).permutation(len(rows))
    cut = int(len(rows) * HELD_BACK_FRACTION)
    test = [rows[i] for i in order[:cut]]
    model = fit_measured([rows[i] for i in order[cut:]])
    predicted = [
        model.throughput(gpus=s.gpus, batch=s.batch, frozen=0, layers=ONE_LAYER, nodes=n)
        for s, n in test
    ]
    return ape(predicted, [s.samples_per_s for s, _ in test])


def to_a800(model: DdpThroughputModel) -> DdpThroughputModel:
    """Compute curves / A800_COMPUTE_SPEEDUP; intra- and inter-node sync by their factors."""
    return scaled(
        model,
        compute=1.0 / A800_COMPUTE_SPEEDUP,
        intra=INTRA_NODE_SYNC_SCALE,
        inter=INTER_NODE_SYNC_SCALE,
    )


def scaled(
    model: DdpThroughputModel, *, compute: float, intra: float, inter: float
) -> DdpThroughputModel:
    """The model with compute times x ``compute`` and sync times x ``intra`` / ``inter``."""
    s = model.sync
    return DdpThroughputModel(
        forward=LinearCurve(model.forward.intercept * compute, model.forward.slope * compute),
        backward=LinearCurve(model.backward.intercept * compute, model.backward.slope * compute),
        sync=SyncCurve(
            s.alpha_intra * intra, s.beta_intra * intra, s.alpha_inter * inter, s.beta_inter * inter
        ),
        freeze=model.freeze,
        gpus_per_node=model.gpus_per_node,
    )


def convergence(
    curves: Mapping[int, ValidationCurve], task: Task
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(global batches, samples to the task's target) from Pollux validation curves; a curve
    that never reaches the target is an InputError (the catalog target is too ambitious)."""
    batches, samples = [], []
    for batch, curve in curves.items():
        need = curve.samples_to(task.target.value)
        if need is None:
            raise InputError(f"{task.name}: batch {batch} never reaches {task.target}")
        batches.append(batch)
        samples.append(need)
    return tuple(batches), tuple(samples)


def calibrate_pollux(task: Task, app_dir: Path) -> TaskCalibration:
    """Fit, held-back APE and convergence of a task with Pollux data (module doc)."""
    rows = read_placements(app_dir) + read_scalability(app_dir)
    errors = heldback_ape(rows)
    batches, samples = convergence(read_validation(app_dir), task)
    stats = {
        "mean": float(errors.mean()),
        "p95": float(np.percentile(errors, 95)),
        "max": float(errors.max()),
        "rows": float(len(rows)),
    }
    return TaskCalibration(
        task.name, f"pollux:{task.pollux_app}", to_a800(fit_measured(rows)), batches, samples, stats
    )


def calibrate_scaled(
    task: Task, source: TaskCalibration, source_task: Task, catalog: Catalog
) -> TaskCalibration:
    """A task without measurements: the source scaled by FLOPs and bytes (module doc)."""
    mine, theirs = catalog.layers(task.name), catalog.layers(source_task.name)
    flops = math.fsum(mine.flops) / math.fsum(theirs.flops)
    size = math.fsum(mine.param_bytes) / math.fsum(theirs.param_bytes)
    model = scaled(source.model, compute=flops, intra=size, inter=size)
    if task.v100_step_s:  # measured single-GPU steps beat FLOP scaling (depthwise convs...)
        xs, ys = zip(*task.v100_step_s, strict=True)
        slope, intercept = np.polyfit(np.array(xs, dtype=float), np.array(ys), 1)
        compute = LinearCurve(
            max(float(intercept), 0.0) / A800_COMPUTE_SPEEDUP, float(slope) / A800_COMPUTE_SPEEDUP
        )
        model = replace(model, forward=LinearCurve(0.0, 0.0), backward=compute)
    base = source.samples[0]
    own_base = task.min_gpus * task.min_batch
    batches = tuple(round(b / source.batches[0] * own_base) for b in source.batches)
    samples = tuple(s / base * task.target_samples for s in source.samples)
    return TaskCalibration(task.name, f"scaled:{source_task.name}", model, batches, samples, {})


def calibrate_all(pollux_dir: Path, catalog: Catalog) -> dict[str, TaskCalibration]:
    """Every available catalog task: Pollux-fitted ones first, then the scaled ones."""
    out: dict[str, TaskCalibration] = {}
    available = catalog.available()
    for name in available:
        task = catalog.get(name)
        if task.pollux_app is not None:
            out[name] = calibrate_pollux(task, pollux_dir / task.pollux_app)
    for name in available:
        task = catalog.get(name)
        if task.scale_from is not None:
            source = catalog.get(task.scale_from)
            out[name] = calibrate_scaled(task, out[source.name], source, catalog)
    return out


# --- The shipped JSON form ------------------------------------------------------------------


def to_document(calibrations: Mapping[str, TaskCalibration], catalog: Catalog) -> dict[str, Any]:
    tasks = {}
    for name, cal in calibrations.items():
        task = catalog.get(name)
        gpu_s = cal.reference_gpu_seconds(task)
        tasks[name] = {
            "source": cal.source,
            "a800_unfrozen_model": _model_values(cal.model),
            "convergence": {"global_batch": list(cal.batches), "samples": list(cal.samples)},
            "heldback_throughput_ape_pct": dict(cal.heldback_ape),
            "reference_gpu_hours": gpu_s / 3600.0,
            "size_class_by_gpu_time": size_class(gpu_s),
        }
    return {
        "about": "Generated by python -m icefrog_slurm.sim.calibration; see docs/simulator.md",
        "assumptions": {
            "a800_compute_speedup": A800_COMPUTE_SPEEDUP,
            "intra_node_sync_scale": INTRA_NODE_SYNC_SCALE,
            "inter_node_sync_scale": INTER_NODE_SYNC_SCALE,
        },
        "tasks": tasks,
    }


def from_document(doc: Any) -> dict[str, TaskCalibration]:
    """Parse the shipped calibration document (strictly: every field named on error)."""
    root = expect_object(doc, "calibration")
    out = {}
    for name, raw in expect_object(root.get("tasks"), "calibration.tasks").items():
        where = f"calibration.tasks.{name}"
        item = expect_object(raw, where)
        values = expect_object(item.get("a800_unfrozen_model"), f"{where}.a800_unfrozen_model")
        model = ddp_model_from({k: get_number(values, k, where) for k in PARAMETERS}, 4)
        conv = expect_object(item.get("convergence"), f"{where}.convergence")
        batches = tuple(int(b) for b in conv.get("global_batch", ()))
        samples = tuple(float(s) for s in conv.get("samples", ()))
        if not batches or len(batches) != len(samples):
            raise InputError(f"{where}.convergence: needs equal, non-empty lists")
        ape_stats = expect_object(item.get("heldback_throughput_ape_pct", {}), where)
        stats = {k: float(v) for k, v in ape_stats.items()}
        source = get_str(item, "source", where)
        out[name] = TaskCalibration(name, source, model, batches, samples, stats)
    return out


_SHIPPED: dict[str, TaskCalibration] = {}


def shipped_calibration() -> dict[str, TaskCalibration]:
    """The calibration shipped as package data (parsed once)."""
    if not _SHIPPED:
        text = resources.files("icefrog_slurm.sim.data").joinpath("calibration.json").read_text()
        _SHIPPED.update(from_document(json.loads(text)))
    return dict(_SHIPPED)


def _model_values(model: DdpThroughputModel) -> dict[str, float]:
    s, f = model.sync, model.freeze
    return {
        "fwd_intercept": model.forward.intercept,
        "fwd_slope": model.forward.slope,
        "bwd_intercept": model.backward.intercept,
        "bwd_slope": model.backward.slope,
        "alpha_intra": s.alpha_intra,
        "beta_intra": s.beta_intra,
        "alpha_inter": s.alpha_inter,
        "beta_inter": s.beta_inter,
        "alpha_flop": f.alpha_flop,
        "gamma_flop": f.gamma_flop,
        "alpha_sync": f.alpha_sync,
        "gamma": f.gamma,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Calibrate the simulator's tasks")
    parser.add_argument("--pollux", type=Path, default=None,
                        help="Pollux's traces/ folder (default: data/pollux/traces of the "
                        "source checkout)")  # fmt: skip
    default_out = Path(__file__).resolve().parent / "data" / "calibration.json"
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args(argv)
    pollux = args.pollux
    if pollux is None:
        if not CHECKOUT_POLLUX_DIR.is_dir():
            parser.error("--pollux DIR is required outside a source checkout (Pollux's traces/"
                         " folder; the repository keeps it in data/pollux/traces)")  # fmt: skip
        pollux = CHECKOUT_POLLUX_DIR
    catalog = shipped_catalog()
    calibrations = calibrate_all(pollux, catalog)
    doc = to_document(calibrations, catalog)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print("| task | source | held-back APE mean / p95 / max % | GPU-h | size (time) | declared |")
    print("| --- | --- | --- | ---: | --- | --- |")
    for name, item in doc["tasks"].items():
        e = item["heldback_throughput_ape_pct"]
        err = f"{e['mean']:.1f} / {e['p95']:.1f} / {e['max']:.1f}" if e else "(scaled)"
        print(
            f"| {name} | {item['source']} | {err} | {item['reference_gpu_hours']:.2f} |"
            f" {item['size_class_by_gpu_time']} | {catalog.get(name).size_class} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
