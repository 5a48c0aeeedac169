"""Readers of Pollux's measured application traces (``traces/<app>/`` of the AdaptDL simulator).

- ``placements.csv`` (``placement,local_bsz,step_time,sync_time``; placement = per-node GPU
  counts, e.g. ``22``) and ``scalability.csv`` (``num_nodes,num_replicas,local_bsz,...``)
  become unshared, unfrozen :class:`ProfileSample` s with their node counts. Pollux measures
  one compute time (step - sync), so it is given as ``t_bwd_s`` with ``t_fwd_s = 0``, which
  ``core.fit.fit_ddp_model`` reads as "no forward split measured".
- ``validation-<global batch>.csv`` (one row an epoch: ``progress,iteration,metric,
  grad_sqr,grad_var``) becomes a :class:`ValidationCurve`. ``progress`` counts iterations
  of the smallest batch (statistical-efficiency scaled), ``iteration`` the real steps at
  this global batch, so the samples processed by epoch e are ``iteration[e] x batch``.

The measurements are V100, unfrozen and whole-model (the data's README).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.errors import InputError

FloatArray = npt.NDArray[np.float64]
MeasuredRow = tuple[ProfileSample, int]  # (sample, nodes)


@dataclass(frozen=True)
class ValidationCurve:
    """One validation file: per-epoch arrays at one global batch."""

    global_batch: int
    progress: FloatArray
    iteration: FloatArray
    metric: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray

    @property
    def increasing(self) -> bool:
        """Whether the metric improves upward (accuracy) rather than downward (loss, WER)."""
        return bool(self.metric[-1] > self.metric[0])

    def samples_to(self, value: float) -> float | None:
        """Samples processed (iteration x batch) at the first epoch whose metric reaches
        ``value`` in the curve's direction; None when it never does."""
        reached = self.metric >= value if self.increasing else self.metric <= value
        hits = np.flatnonzero(reached)
        if hits.size == 0:
            return None
        return float(self.iteration[hits[0]] * self.global_batch)


def read_placements(app_dir: Path) -> list[MeasuredRow]:
    """``placements.csv`` rows as (sample, nodes)."""
    out = []
    for where, row in _rows(app_dir / "placements.csv"):
        placement = row["placement"].strip()
        if not placement.isdigit() or "0" in placement:
            raise InputError(f"{where}: placement must be per-node GPU counts, got {placement!r}")
        counts = [int(c) for c in placement]
        out.append((_sample(where, sum(counts), row), len(counts)))
    return out


def read_scalability(app_dir: Path) -> list[MeasuredRow]:
    """``scalability.csv`` rows as (sample, nodes) (large placements, one GPU a node)."""
    out = []
    for where, row in _rows(app_dir / "scalability.csv"):
        gpus = _int(row["num_replicas"], f"{where}: num_replicas")
        out.append((_sample(where, gpus, row), _int(row["num_nodes"], f"{where}: num_nodes")))
    return out


def read_validation(app_dir: Path) -> dict[int, ValidationCurve]:
    """Every ``validation-<batch>.csv`` of an application, by global batch."""
    curves: dict[int, ValidationCurve] = {}
    for path in sorted(app_dir.glob("validation-*.csv")):
        batch = _int(path.stem.removeprefix("validation-"), f"{path}: batch in the file name")
        cols: dict[str, list[float]] = {k: [] for k in _VALIDATION}
        for where, row in _rows(path):
            for key in _VALIDATION:
                cols[key].append(_float(row.get(key), f"{where}: {key}"))
        if not cols["progress"]:
            raise InputError(f"{path}: no rows")
        curves[batch] = ValidationCurve(batch, *(np.array(cols[k]) for k in _VALIDATION))
    if not curves:
        raise InputError(f"{app_dir}: no validation-*.csv")
    return dict(sorted(curves.items()))


_VALIDATION = ("progress", "iteration", "metric", "grad_sqr", "grad_var")


def _sample(where: str, gpus: int, row: dict[str, str]) -> ProfileSample:
    batch = _int(row["local_bsz"], f"{where}: local_bsz")
    step = _float(row["step_time"], f"{where}: step_time")
    sync = _float(row["sync_time"], f"{where}: sync_time")
    if step <= 0 or not 0 <= sync < step:
        raise InputError(f"{where}: need step_time > sync_time >= 0")
    return ProfileSample(
        gpus=gpus, batch=batch, frozen=0, shared=False, t_fwd_s=0.0, t_bwd_s=step - sync,
        t_sync_s=sync, t_iter_s=step, samples_per_s=gpus * batch / step,
    )  # fmt: skip


def _rows(path: Path) -> list[tuple[str, dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            return [(f"{path}:{i}", row) for i, row in enumerate(csv.DictReader(fh), start=2)]
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None


def _float(text: str | None, where: str) -> float:
    try:
        value = float(text or "")
    except ValueError:
        raise InputError(f"{where}: must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise InputError(f"{where}: must be finite")
    return value


def _int(text: str | None, where: str) -> int:
    try:
        return int(text or "")
    except ValueError:
        raise InputError(f"{where}: must be an integer, got {text!r}") from None
