"""What the Model Profiler measures (spec section 9, step 2): the model's ordered layers with
their FLOPs and parameter bytes (once, at start, on the real model), and per-step timings
split into forward, backward and the synchronisation not hidden behind backward, with the
peak memory and the device's utilisation.

With CUDA: GPU utilisation from NVML (-1 when pynvml is missing or NVML fails) and
``torch.cuda.max_memory_allocated``. Without CUDA the same report fields carry the CPU
analogue (docs/trainer.md), never GPU figures: utilisation is the share of the measured
steps' wall time the process spent computing, its CPU time (``time.process_time``, every
thread) over wall time times its thread budget (``torch.get_num_threads()``); memory is
the process's peak resident set size.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from icefrog_slurm.errors import InputError


def find_layers(model: nn.Module, layers: Sequence[nn.Module] | None = None) -> list[nn.Module]:
    """The ordered layers: ``layers`` when given (each a submodule of ``model``), else the
    model's top-level children that hold parameters or do work, input side first."""
    if layers is None:
        found = list(model.children())
        if not found:
            raise InputError("layers: the model has no child modules; pass layers=[...]")
        return found
    members = {id(m) for m in model.modules()}
    out = list(layers)
    for i, layer in enumerate(out):
        if id(layer) not in members:
            raise InputError(f"layers[{i}]: not a submodule of the model")
    if not out:
        raise InputError("layers: empty list")
    return out


def param_bytes(layer: nn.Module) -> float:
    return float(sum(p.numel() * p.element_size() for p in layer.parameters()))


def layer_flops(model: nn.Module, layers: Sequence[nn.Module], sample: Any) -> list[float]:
    """FLOPs of one forward+backward step of each layer (torch.utils.flop_counter), measured
    on the real model with ``sample`` (one input batch). Gradients it makes are dropped."""
    names = {id(m): n for n, m in model.named_modules()}
    root = type(model).__name__
    with FlopCounterMode(display=False) as counter:  # depth shapes only the display
        out = model(sample)
        tensor = out if isinstance(out, torch.Tensor) else None
        if tensor is not None and tensor.requires_grad:
            tensor.float().sum().backward()
    for p in model.parameters():
        p.grad = None
    counts = {k: float(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    flops = []
    for layer in layers:
        name = names[id(layer)]
        flops.append(counts.get(f"{root}.{name}" if name else root, 0.0))
    return flops


def peak_memory_bytes(device: torch.device) -> float:
    """Peak device memory (CUDA) or the process's peak resident set size (CPU)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def gpu_utilization(device: torch.device) -> float:
    """GPU utilisation in 0..1 from NVML (``torch.cuda.utilization``, which maps the CUDA index
    through CUDA_VISIBLE_DEVICES to the physical card, as a Slurm job sees it); -1 without
    CUDA or pynvml. NVML reports the whole card: on a shared GPU it includes the partner."""
    if device.type != "cuda":
        return -1.0
    try:
        return float(torch.cuda.utilization(device)) / 100.0
    except Exception:  # pynvml missing or NVML unusable: unknown
        return -1.0


def cpu_utilization(cpu_s: float, wall_s: float, threads: int) -> float:
    """The CPU analogue of GPU utilisation, in 0..1: CPU seconds over the wall seconds the
    process's ``threads`` could have computed in; -1 when the wall time is not positive."""
    if wall_s <= 0 or threads < 1:
        return -1.0
    return min(max(cpu_s / (wall_s * threads), 0.0), 1.0)


def utilization(device: torch.device, cpu_s: float, wall_s: float) -> float:
    """NVML's GPU utilisation on CUDA; the CPU analogue (:func:`cpu_utilization`) of the
    measured steps, ``cpu_s`` CPU seconds in ``wall_s``, otherwise."""
    if device.type == "cuda":
        return gpu_utilization(device)
    return cpu_utilization(cpu_s, wall_s, torch.get_num_threads())


@dataclass
class StepTimer:
    """Timestamps of one step, filled by hooks; sums over measured steps."""

    device: torch.device
    fwd_start: float = 0.0
    fwd_end: float = 0.0
    bwd_start: float = 0.0
    last_bucket: float = 0.0  # when the last gradient bucket was ready (DDP comm hook)
    sums: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("fwd", "bwd", "sync", "iter", "cpu", "n"), 0.0)
    )
    last_step_end: float = 0.0
    last_cpu: float = 0.0  # the process's CPU time (time.process_time) at last_step_end

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def record(self, backward_end: float, measured: bool, cpu: float | None = None) -> None:
        """Close a step at ``backward_end`` (the optimizer's step pre-hook), when the
        process had used ``cpu`` CPU seconds (default: ``time.process_time()`` now)."""
        cpu = time.process_time() if cpu is None else cpu
        if measured and self.fwd_end > self.fwd_start and self.last_step_end > 0:
            self.sums["cpu"] += cpu - self.last_cpu
            bwd_start = self.bwd_start if self.bwd_start >= self.fwd_end else self.fwd_end
            compute_end = self.last_bucket if self.last_bucket >= bwd_start else backward_end
            self.sums["fwd"] += self.fwd_end - self.fwd_start
            self.sums["bwd"] += compute_end - bwd_start
            self.sums["sync"] += backward_end - compute_end
            self.sums["iter"] += backward_end - self.last_step_end
            self.sums["n"] += 1
        self.last_step_end, self.last_cpu = backward_end, cpu
        self.last_bucket = 0.0
        self.bwd_start = 0.0

    def take(self) -> dict[str, float] | None:
        """Means over the measured steps since the last take, or None when there were none."""
        n = self.sums["n"]
        if n == 0:
            return None
        means = {k: v / n for k, v in self.sums.items() if k != "n"}
        self.sums = dict.fromkeys(self.sums, 0.0)
        return means
