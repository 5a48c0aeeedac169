"""Calibration of the simulated tasks: unfrozen step and sync times, and convergence.

For a task with Pollux data (``calibration.pollux`` in the catalog):

- **times** — Pollux's measured V100 profiles (``placements.csv`` + ``scalability.csv``)
  are fitted with the core's DDP model (``core.fit.fit_ddp_model``, eq 4-7 at l = 0, one
  compute curve as Pollux has no forward/backward split). A seeded 25 % of the rows is held
  back first and the throughput APE on them is recorded; the kept model is then refitted on
  every row. That V100 model is kept as fitted (``--gpu-model v100``) and moved to the A800
  cluster of the paper (the default, ``a800``) by the stated factors
  (:data:`A800_COMPUTE_SPEEDUP`, :data:`INTRA_NODE_SYNC_SCALE`, :data:`INTER_NODE_SYNC_SCALE`;
  see docs/simulator.md for why and how uncertain);
- **convergence** — samples to reach the catalog target at each measured global batch,
  from ``validation-<batch>.csv`` (first epoch whose metric reaches the target);
- **Pollux's completion rule** (:class:`PolluxApplication`, used with ``--gpu-model v100``):
  AdaptDL's simulator (``simulator/simulator.py`` and ``applications.py``) finishes a job
  when its progress, in steps of the smallest validated batch scaled by statistical
  efficiency (``progress`` of the validation files), has completed the application's epochs
  (``max_epochs`` = the shortest validation file, which is what Pollux's simulator uses);
  each step at global batch B adds ``gain = (var + sqr) / (var / scale + sqr)``, scale =
  B / the smallest batch, with the gradient statistics of the current epoch interpolated
  linearly between validated batches.

A task without Pollux data (``calibration.scale_from``) takes its source task's calibration
scaled by size: compute time x (FLOPs per sample ratio), sync time x (parameter bytes
ratio) — except that measured single-GPU V100 step times in the catalog (``v100_step_s``)
replace the FLOP-scaled compute curve (divided by A800_COMPUTE_SPEEDUP on the A800s, as
measured on the V100s) — and the source's convergence shape (samples
relative to the smallest batch) applied to its own samples to the target at its own
smallest global batch (``calibration.target_epochs`` x samples_per_epoch, else its budget
P_0 = max_epochs x samples_per_epoch).

A fine-tuned transformer (``calibration.fine_tune_from``: the LLaMA tasks) has a model of
its own (:func:`calibrate_fine_tune`): compute from its per-layer FLOPs at a stated share of
the GPU's bf16 peak, the pipeline's bubble under HP, a ring all-reduce of its parameter bytes
(1.5x under SDP, one stage's share among the replicas under HP) at the nodes' link rates,
and the measured convergence of the source (BERT fine-tuned on SQuAD, Pollux's curves) at
the same global batches, scaled to its own samples to the target. Each constant names its
source.

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
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from icefrog_slurm.core.fit import ape, ddp_model_from, fit_ddp_model
from icefrog_slurm.core.goodput import efficiency_of_sums
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallelism import Kind
from icefrog_slurm.core.throughput import (
    PARAMETERS,
    DdpThroughputModel,
    LinearCurve,
    SyncCurve,
    nodes_for,
)
from icefrog_slurm.core.tuner import powers_of_two
from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import expect_object, get_number, get_str
from icefrog_slurm.protocol import JobSpec
from icefrog_slurm.sim.catalog import Catalog, Task, shipped_catalog
from icefrog_slurm.sim.pollux import (
    MeasuredRow,
    ValidationCurve,
    read_placements,
    read_scalability,
    read_validation,
)

GPU_MODELS = ("a800", "v100")
"""The GPUs the simulator models: the paper's A800s (default) or Pollux's V100s as measured."""
A800_COMPUTE_SPEEDUP = 2.0
"""A800 over V100 compute time ratio assumed for training steps (fp32/TF32 mixed)."""
INTRA_NODE_SYNC_SCALE = 1.0
"""One-node all-reduce time factor: the paper's A800s sit on PCIe 3.0 (spec section 13)."""
INTER_NODE_SYNC_SCALE = 0.5
"""Multi-node all-reduce time factor: 200 Gbps HDR InfiniBand a node (spec section 13)."""
PEAK_FLOPS = {"a800": 312e12, "v100": 125e12}
"""Dense tensor-core peak FLOP/s a GPU (NVIDIA's datasheets: A100/A800 BF16 312 TFLOPS,
V100 FP16 125 TFLOPS); a fine-tuned transformer trains in bf16 (fp16 on a V100)."""
FINE_TUNE_MFU = 0.40
"""The share of that peak a fine-tuned transformer's compute reaches (model FLOPs
utilisation): LLaMA-7B's pretraining took 82,432 A100-80GB hours for 1.0T tokens (Touvron et
al. 2023, arXiv 2302.13971, table 15): 3,370 tokens/s a GPU, 43 % of the peak by the 6N
rule; Llama 2 7B's 184,320 hours for 2T tokens (arXiv 2307.09288, table 2): 39 %."""
TRAINING_FLOPS_PER_FORWARD = 3.0
"""A training step's FLOPs over its forward's: backward is twice forward (Kaplan et al.
2020, arXiv 2001.08361, section 2.1: C = 6N a token, 2N of it forward)."""
SHARDED_SYNC_VOLUME = 1.5
"""Bytes a GPU moves a step under sharded data parallelism (ZeRO-3 / FSDP) over DDP's
all-reduce: two all-gathers of the parameters and a reduce-scatter of the gradients, 3 Psi
against 2 Psi (Rajbhandari et al. 2020, arXiv 1910.02054, section 7.2.2: "1.5x compared to
the baseline")."""
PCIE3_X16_BYTES_S = 15.75e9
"""A GPU's link on the paper's nodes (PCIe 3.0 x16, spec section 13): 8 GT/s a lane, 16
lanes, 128b/130b encoding, one direction (PCI-SIG's PCIe 3.0 specification)."""
HDR_IB_BYTES_S = 25e9
"""A node's network link (200 Gb/s HDR InfiniBand, spec section 13)."""
HELD_BACK_FRACTION = 0.25
NOISE_SCALES = np.logspace(0.0, 8.0, 801)
"""Gradient noise scales (samples) :func:`noise_scale` chooses from: 1 to 1e8, 100 a decade."""
SIZE_THRESHOLDS_H = (1.0, 10.0, 100.0)
"""GPU-hours bounds of small / medium / large / xlarge (Pollux's workload generator)."""
CHECKOUT_POLLUX_DIR = Path(__file__).resolve().parents[2] / "data" / "pollux" / "traces"
"""Pollux's measured traces in a source checkout (absent from an installed package)."""
ONE_LAYER = LayerTable.uniform(1)


def check_gpu_model(name: str) -> str:
    """``name`` when the simulator models it; else an InputError naming the choices."""
    if name not in GPU_MODELS:
        raise InputError(f"--gpu-model: unknown {name!r}; choose from {', '.join(GPU_MODELS)}")
    return name


POLLUX_MAX_REPLICAS = 64
"""AdaptDL's simulator caps a job at 64 replicas (its cluster, ``get_pollux_job_info``)."""
POLLUX_MAX_LOCAL_BATCH = {"yolov3": 8}
"""Per-GPU batch caps AdaptDL's ``applications.py`` sets below its measured range."""
POLLUX_FIXED = {"ncf": 32768}
"""Applications AdaptDL's simulator runs at one global batch on one replica (``ncf``:
``target_batch_size = 32768`` under Pollux, ``max_replicas = 1`` under every policy)."""


@dataclass(frozen=True)
class PolluxApplication:
    """One application as AdaptDL's simulator defines and finishes it (module doc):
    progress in steps of ``init_batch`` scaled by efficiency; ``boundaries[e]`` the progress
    at the end of epoch e (the smallest over the validated batches, Pollux's
    ``get_progress``); the job is done at ``boundaries[-1]``; ``grad_sqr`` / ``grad_var``
    per validated batch and epoch; the per-GPU batch range (``local_batch``), the replica
    cap and the global batch it is held at (``fixed_batch``, 0: free)."""

    init_batch: int
    boundaries: tuple[float, ...]
    batches: tuple[int, ...]
    grad_sqr: tuple[tuple[float, ...], ...]
    grad_var: tuple[tuple[float, ...], ...]
    local_batch: tuple[int, int]
    max_replicas: int
    fixed_batch: int = 0

    @property
    def target(self) -> float:
        return self.boundaries[-1]

    def grad_stats(self, global_batch: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) in ``epoch`` at ``global_batch``, interpolated linearly in the
        batch between validated ones (clamped to them), as Pollux's ``get_grad_stats``;
        grad_var is the variance of an ``init_batch`` gradient."""
        x = np.asarray(self.batches, dtype=float)
        sqr = float(np.interp(global_batch, x, [row[epoch] for row in self.grad_sqr]))
        var = float(np.interp(global_batch, x, [row[epoch] for row in self.grad_var]))
        return sqr, var

    def gain(self, global_batch: float, epoch: int) -> float:
        """Progress one step at ``global_batch`` makes in ``epoch`` (Pollux's ``gain``)."""
        sqr, var = self.grad_stats(global_batch, epoch)
        scale = max(global_batch, 1.0) / self.init_batch
        return (var + sqr) / (var / scale + sqr)

    def samples_to_target(self, global_batch: float) -> float:
        """Samples at a fixed ``global_batch`` from the start to the end of the last epoch."""
        edges = (0.0, *self.boundaries)
        return math.fsum(
            (edges[e + 1] - edges[e]) * global_batch / self.gain(global_batch, e)
            for e in range(len(self.boundaries))
        )

    def job_spec(self, spec: JobSpec) -> JobSpec:
        """``spec`` with this application's limits: per-GPU batches the powers of two in
        ``local_batch`` (the tuner's grid), at most ``max_replicas`` GPUs and no more than
        the largest validated global batch at the smallest of them, Pollux's epochs, and
        ``fixed_batch`` where the job leaves its batch free."""
        low, high = powers_of_two(*self.local_batch)[0], powers_of_two(*self.local_batch)[-1]
        gpus = max(1, min(self.max_replicas, self.batches[-1] // low))
        return replace(
            spec, min_gpus=1, max_gpus=gpus, min_batch=low, max_batch=high,
            max_epochs=len(self.boundaries), global_batch=spec.global_batch or self.fixed_batch,
        )  # fmt: skip


def pollux_application(
    app: str, curves: Mapping[int, ValidationCurve], rows: Sequence[MeasuredRow]
) -> PolluxApplication:
    """Application ``app`` as AdaptDL's simulator has it, from its validation curves and
    measured rows (module doc)."""
    epochs = min(len(c.progress) for c in curves.values())
    boundaries = tuple(float(min(c.progress[e] for c in curves.values())) for e in range(epochs))
    if any(b <= a for a, b in zip((0.0, *boundaries), boundaries, strict=False)):
        raise InputError(f"{app}: validation progress must increase epoch by epoch")
    order = sorted(curves)
    local = [s.batch for s, _ in rows]
    high = min(max(local), POLLUX_MAX_LOCAL_BATCH.get(app, max(local)))
    return PolluxApplication(
        init_batch=order[0],
        boundaries=boundaries,
        batches=tuple(order),
        grad_sqr=tuple(tuple(float(v) for v in curves[b].grad_sqr[:epochs]) for b in order),
        grad_var=tuple(tuple(float(v) for v in curves[b].grad_var[:epochs]) for b in order),
        local_batch=(min(local), high),
        max_replicas=1 if app in POLLUX_FIXED else POLLUX_MAX_REPLICAS,
        fixed_batch=POLLUX_FIXED.get(app, 0),
    )


@dataclass(frozen=True)
class TaskCalibration:
    """One task's calibrated unfrozen model (of one GPU model), convergence and provenance."""

    task: str
    source: str  # "pollux:<app>" or "scaled:<task>"
    model: DdpThroughputModel  # unfrozen; forward folded into the backward curve
    batches: tuple[int, ...]  # global batches with a measured convergence point
    samples: tuple[float, ...]  # samples to reach the target at each
    heldback_ape: Mapping[str, float]  # mean / p95 / max throughput APE % (Pollux tasks)
    application: PolluxApplication | None = None  # Pollux's rule (V100), else the target's

    def samples_to_target(self, global_batch: float) -> float:
        """Unfrozen samples to finish at ``global_batch``: by Pollux's rule where it applies,
        else to reach the target (log-log interpolation between measured batches, the
        nearest end beyond them)."""
        if self.application is not None:
            return self.application.samples_to_target(global_batch)
        x = np.log(np.asarray(self.batches, dtype=float))
        y = np.log(np.asarray(self.samples, dtype=float))
        return float(np.exp(np.interp(math.log(max(global_batch, 1.0)), x, y)))

    @property
    def noise_scale(self) -> float:
        """The gradient noise scale of this task's convergence curve (:func:`noise_scale`)."""
        return noise_scale(self.batches, self.samples)

    def throughput(
        self, *, gpus: int, batch: int, nodes: int | None = None, sync_gpus: int | None = None
    ) -> float:
        """Unfrozen samples a second (eq 4 at l = 0): gpus x batch samples an iteration
        whose all-reduce spans ``sync_gpus`` (the data-parallel replicas; default all
        ``gpus``) over ``nodes``."""
        n = nodes_for(gpus, self.model.gpus_per_node) if nodes is None else nodes
        *_, t_iter = self.model.times(
            gpus=gpus if sync_gpus is None else sync_gpus, batch=batch, theta=1.0, omega=1.0,
            nodes=n,
        )  # fmt: skip
        return gpus * batch / t_iter

    def reference_gpu_seconds(self, task: Task) -> float:
        """GPU time of one run: min_gpus x samples to target / throughput, at the task's
        smallest GPU count and default per-GPU batch (unfrozen)."""
        a, m = task.min_gpus, task.default_batch
        rate = self.throughput(gpus=a, batch=m, sync_gpus=sync_group(task, a))
        return a * self.samples_to_target(a * m) / rate


def sync_group(task: Task, gpus: int) -> int:
    """GPUs an iteration's all-reduce spans on ``gpus``: the data-parallel replicas, a / p
    under a pipeline of p stages (one stage's share of the model on each), else all a."""
    return max(1, gpus // task.parallelism.stages)


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


def noise_scale(batches: Sequence[int], samples: Sequence[float]) -> float:
    """The gradient noise scale B (Pollux's phi; McCandlish et al. 2018, arXiv 1812.06162)
    whose statistical efficiency (B + M0) / (B + M) best reproduces the measured ratios
    S(M0) / S(M) of samples to the target, least squares in log over the measured global
    batches M (M0 the smallest), B from :data:`NOISE_SCALES`; the efficiency is
    ``core.goodput``'s, the one the policies score with. Gradient statistics whose
    squared norm over base-batch variance is M_base / B make Pollux's efficiency follow the
    curve. With one batch there is nothing to fit: the largest B (no loss at any batch)."""
    m = np.asarray(batches, dtype=float)
    s = np.asarray(samples, dtype=float)
    if m.size < 2:
        return float(NOISE_SCALES[-1])
    first = int(np.argmin(m))
    predicted = efficiency_of_sums(  # one row a batch, one column a scale: sqr / var = M0 / B
        var=np.ones_like(NOISE_SCALES), sqr=m[first] / NOISE_SCALES,
        global_batches=tuple(m), base_batch=float(m[first]),
    )  # fmt: skip
    error = ((np.log(predicted) - np.log(s[first] / s)[:, None]) ** 2).sum(axis=0)
    return float(NOISE_SCALES[int(np.argmin(error))])


def calibrate_pollux(task: Task, app_dir: Path, gpu_model: str = "a800") -> TaskCalibration:
    """Fit, held-back APE and convergence of a task with Pollux data (module doc); on
    ``v100`` the fit as measured and Pollux's completion rule."""
    rows = read_placements(app_dir) + read_scalability(app_dir)
    errors = heldback_ape(rows)
    curves = read_validation(app_dir)
    batches, samples = convergence(curves, task)
    stats = {
        "mean": float(errors.mean()),
        "p95": float(np.percentile(errors, 95)),
        "max": float(errors.max()),
        "rows": float(len(rows)),
    }
    fitted = fit_measured(rows)
    v100 = check_gpu_model(gpu_model) == "v100"
    return TaskCalibration(
        task.name, f"pollux:{task.pollux_app}", fitted if v100 else to_a800(fitted), batches,
        samples, stats, pollux_application(task.pollux_app or "", curves, rows) if v100 else None,
    )  # fmt: skip


def calibrate_scaled(
    task: Task,
    source: TaskCalibration,
    source_task: Task,
    catalog: Catalog,
    gpu_model: str = "a800",
) -> TaskCalibration:
    """A task without measurements: the source (of the same GPU model) scaled by FLOPs and
    bytes (module doc)."""
    speedup = A800_COMPUTE_SPEEDUP if check_gpu_model(gpu_model) == "a800" else 1.0
    mine, theirs = catalog.layers(task.name), catalog.layers(source_task.name)
    flops = math.fsum(mine.flops) / math.fsum(theirs.flops)
    size = math.fsum(mine.param_bytes) / math.fsum(theirs.param_bytes)
    model = scaled(source.model, compute=flops, intra=size, inter=size)
    if task.v100_step_s:  # measured single-GPU steps beat FLOP scaling (depthwise convs...)
        xs, ys = zip(*task.v100_step_s, strict=True)
        slope, intercept = np.polyfit(np.array(xs, dtype=float), np.array(ys), 1)
        compute = LinearCurve(max(float(intercept), 0.0) / speedup, float(slope) / speedup)
        model = replace(model, forward=LinearCurve(0.0, 0.0), backward=compute)
    base = source.samples[0]
    own_base = task.min_gpus * task.min_batch
    batches = tuple(round(b / source.batches[0] * own_base) for b in source.batches)
    samples = tuple(s / base * task.target_samples for s in source.samples)
    return TaskCalibration(task.name, f"scaled:{source_task.name}", model, batches, samples, {})


def calibrate_fine_tune(
    task: Task,
    source: TaskCalibration,
    source_task: Task,
    catalog: Catalog,
    gpu_model: str = "a800",
) -> TaskCalibration:
    """A fine-tuned transformer (module doc): compute from its FLOPs at
    :data:`FINE_TUNE_MFU` of the GPU's peak plus the source's measured per-iteration fixed
    cost; sync a ring all-reduce of its parameter bytes times its parallelism's volume at the
    links' rates (:func:`ring_allreduce_curve`), overlapped with backward by the source's
    measured gamma; convergence the source's measured curve at the same global batches
    (samples, not ratios to a smallest batch), scaled to its own samples to the target.

    Samples an iteration are a x m on a GPUs as for every task. Under SDP each GPU trains
    its m samples through the whole model and the GPUs exchange 1.5x DDP's bytes
    (:data:`SHARDED_SYNC_VOLUME`). Under HP (p stages, d = a / p replicas) each replica
    pipelines its p x m samples as micro-batches of one, each stage taking 1/p of a sample's
    time, so a stage's step is (p m + p - 1) / p sample times: m plus the bubble (p - 1) / p
    (Narayanan et al. 2021, arXiv 2104.04473, section 2.2: the bubble is (p - 1) micro-batch
    times); its all-reduce carries one stage's 1/p of the bytes, among the d replicas (the
    truth evaluates the curve at d, :meth:`TaskCalibration.throughput`'s ``sync_gpus``)."""
    gpu = check_gpu_model(gpu_model)
    mine = catalog.layers(task.name)
    per_sample = (
        TRAINING_FLOPS_PER_FORWARD * math.fsum(mine.flops) / (PEAK_FLOPS[gpu] * FINE_TUNE_MFU)
    )
    stages = task.parallelism.stages
    launch = source.model.forward.intercept + source.model.backward.intercept
    compute = LinearCurve(launch + (stages - 1) / stages * per_sample, per_sample)
    volume = SHARDED_SYNC_VOLUME if task.parallelism.kind is Kind.SDP else 1.0 / stages
    size = volume * math.fsum(mine.param_bytes)
    groups = max(2, task.max_gpus // stages)
    per_node = source.model.gpus_per_node
    inter_bw = min(PCIE3_X16_BYTES_S, HDR_IB_BYTES_S)  # a node's traffic crosses PCIe too
    intra = ring_allreduce_curve(size, PCIE3_X16_BYTES_S, max(2, min(groups, per_node)))
    inter = ring_allreduce_curve(size, inter_bw, groups)
    model = replace(
        source.model, forward=LinearCurve(0.0, 0.0), backward=compute,
        sync=SyncCurve(intra[0], intra[1], inter[0], inter[1]),
    )  # fmt: skip
    samples = tuple(s / source.samples[0] * task.target_samples for s in source.samples)
    return TaskCalibration(
        task.name, f"fine-tune:{source_task.name}", model, source.batches, samples, {}
    )


def ring_allreduce_curve(size: float, bandwidth: float, groups: int) -> tuple[float, float]:
    """(alpha, beta) of the sync curve's form alpha + beta (g - 2) fitted by least squares
    to a ring all-reduce of ``size`` bytes over g = 2..``groups`` GPUs at ``bandwidth`` bytes
    a second: each GPU sends and receives 2 (g - 1) / g of the bytes (a one-point fit, g = 2
    alone, has beta 0)."""
    g = np.arange(2, max(groups, 2) + 1, dtype=float)
    t = 2 * (g - 1) / g * size / bandwidth
    if len(g) == 1:
        return float(t[0]), 0.0
    beta, alpha = np.polyfit(g - 2, t, 1)
    return float(alpha), float(beta)


def calibrate_all(
    pollux_dir: Path, catalog: Catalog, gpu_model: str = "a800"
) -> dict[str, TaskCalibration]:
    """Every available catalog task on ``gpu_model``: Pollux-fitted ones first, then the
    scaled ones."""
    out: dict[str, TaskCalibration] = {}
    available = catalog.available()
    for name in available:
        task = catalog.get(name)
        if task.pollux_app is not None:
            out[name] = calibrate_pollux(task, pollux_dir / task.pollux_app, gpu_model)
    for name in available:
        task = catalog.get(name)
        if task.scale_from is not None:
            source = catalog.get(task.scale_from)
            out[name] = calibrate_scaled(task, out[source.name], source, catalog, gpu_model)
        elif task.fine_tune_from is not None:
            source = catalog.get(task.fine_tune_from)
            out[name] = calibrate_fine_tune(task, out[source.name], source, catalog, gpu_model)
    return out


# --- The shipped JSON form ------------------------------------------------------------------


def to_document(
    calibrations: Mapping[str, TaskCalibration],
    catalog: Catalog,
    v100: Mapping[str, TaskCalibration] | None = None,
) -> dict[str, Any]:
    """The shipped form: the A800 ``calibrations`` and, when given, the ``v100`` ones'
    models and Pollux completion rules beside them."""
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
        other = None if v100 is None else v100.get(name)
        if other is not None:
            tasks[name]["v100_unfrozen_model"] = _model_values(other.model)
            if other.application is not None:
                tasks[name]["pollux_application"] = asdict(other.application)
    return {
        "about": "Generated by python -m icefrog_slurm.sim.calibration; see docs/simulator.md",
        "assumptions": {
            "a800_compute_speedup": A800_COMPUTE_SPEEDUP,
            "intra_node_sync_scale": INTRA_NODE_SYNC_SCALE,
            "inter_node_sync_scale": INTER_NODE_SYNC_SCALE,
        },
        "tasks": tasks,
    }


def from_document(doc: Any, gpu_model: str = "a800") -> dict[str, TaskCalibration]:
    """Parse the shipped calibration document for ``gpu_model`` (strictly: every field
    named on error)."""
    key = f"{check_gpu_model(gpu_model)}_unfrozen_model"
    root = expect_object(doc, "calibration")
    out = {}
    for name, raw in expect_object(root.get("tasks"), "calibration.tasks").items():
        where = f"calibration.tasks.{name}"
        item = expect_object(raw, where)
        values = expect_object(item.get(key), f"{where}.{key}")
        model = ddp_model_from({k: get_number(values, k, where) for k in PARAMETERS}, 4)
        conv = expect_object(item.get("convergence"), f"{where}.convergence")
        batches = tuple(int(b) for b in conv.get("global_batch", ()))
        samples = tuple(float(s) for s in conv.get("samples", ()))
        if not batches or len(batches) != len(samples):
            raise InputError(f"{where}.convergence: needs equal, non-empty lists")
        ape_stats = expect_object(item.get("heldback_throughput_ape_pct", {}), where)
        stats = {k: float(v) for k, v in ape_stats.items()}
        source = get_str(item, "source", where)
        application = None
        if gpu_model == "v100" and "pollux_application" in item:
            application = _application(item["pollux_application"], f"{where}.pollux_application")
        out[name] = TaskCalibration(name, source, model, batches, samples, stats, application)
    return out


def _application(raw: Any, where: str) -> PolluxApplication:
    obj = expect_object(raw, where)
    try:
        low, high = (int(v) for v in obj["local_batch"])
        done = PolluxApplication(
            init_batch=int(obj["init_batch"]),
            boundaries=tuple(float(v) for v in obj["boundaries"]),
            batches=tuple(int(v) for v in obj["batches"]),
            grad_sqr=tuple(tuple(float(v) for v in row) for row in obj["grad_sqr"]),
            grad_var=tuple(tuple(float(v) for v in row) for row in obj["grad_var"]),
            local_batch=(low, high),
            max_replicas=int(obj["max_replicas"]),
            fixed_batch=int(obj["fixed_batch"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{where}: malformed ({exc})") from None
    epochs = len(done.boundaries)
    rows = (*done.grad_sqr, *done.grad_var)
    if not epochs or len(done.batches) * 2 != len(rows) or any(len(r) != epochs for r in rows):
        raise InputError(f"{where}: needs one row of statistics an epoch for each batch")
    return done


_SHIPPED: dict[str, dict[str, TaskCalibration]] = {}


def shipped_calibration(gpu_model: str = "a800") -> dict[str, TaskCalibration]:
    """The calibration of ``gpu_model`` shipped as package data (parsed once)."""
    if check_gpu_model(gpu_model) not in _SHIPPED:
        text = resources.files("icefrog_slurm.sim.data").joinpath("calibration.json").read_text()
        _SHIPPED[gpu_model] = from_document(json.loads(text), gpu_model)
    return dict(_SHIPPED[gpu_model])


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
    doc = to_document(calibrations, catalog, v100=calibrate_all(pollux, catalog, "v100"))
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
