"""Sampling evaluation workloads from the Philly trace (spec section 12), as the paper does.

The paper takes hours 3 to 6 of the Microsoft Philly trace, samples 120 jobs for 1x load
(120 x W for W x load), keeps each job's submission time and GPU request, and maps the job
to the catalog task whose GPU time is nearest to the job's duration x GPUs. As Pollux's
workload generator (AdaptDL ``simulator/workload.py``) does, the hours are hours of the day
taken across every day of the trace, and only jobs with duration >= 60 s and GPU time
< 1000 GPU-hours are kept. Submission times are seconds from the window start (hour of day
minus the first hour, plus minutes and seconds).

"Nearest" is by ratio (distance of logarithms): GPU times span five orders of magnitude,
and a 30-GPU-hour job is more alike a 58-hour task (1.9x) than a 14.5-hour one (2.1x),
which a plain difference would turn round. A task's GPU time is its calibrated reference
(``calibration.TaskCalibration.reference_gpu_seconds``). The GPU request is clipped to the
task's legal GPU counts (the original is kept in the mapping).

The package carries Pollux's copy of the trace gzip-compressed (``sim/data/philly.csv.gz``,
Apache-2.0, notice beside it); :func:`packaged_philly` names it, and :func:`read_philly`
reads a plain or a ``.gz`` CSV.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.sim.catalog import Catalog, Task
from icefrog_slurm.sim.workload import BOM, MAX_CSV_BYTES, TraceJob
from icefrog_slurm.userfiles import read_bytes, read_text

MIN_DURATION_S = 60.0
MAX_GPU_TIME_S = 1000 * 3600.0
BASE_JOBS = 120  # 1x load (spec section 12)
_HOURS = re.compile(r"^\s*(\d{1,2})\s*-\s*(\d{1,2})\s*$", re.ASCII)


@dataclass(frozen=True)
class PhillyJob:
    """One row of philly.csv; ``row`` is its line number in the file (header = line 1)."""

    row: int
    timestamp: datetime
    duration_s: float
    num_gpus: int
    gpu_time_s: float


@dataclass(frozen=True)
class Mapped:
    """How one sampled Philly job became a workload job (the sidecar's per-job record)."""

    name: str
    philly_row: int
    timestamp: str
    submit_s: float
    duration_s: float
    num_gpus: int
    gpu_time_s: float
    task: str
    task_gpu_time_s: float
    gpus: int


def packaged_philly() -> Path:
    """The Philly trace the package ships (``icefrog_slurm/sim/data/philly.csv.gz``)."""
    resource = files("icefrog_slurm.sim.data") / "philly.csv.gz"
    if not isinstance(resource, Path):  # a zipped install: no file to name
        raise InputError("the packaged Philly trace is not a file here; give --philly PATH")
    return resource


def read_philly(path: str | Path) -> list[PhillyJob]:
    """Parse philly.csv (``timestamp,duration,num_gpus,gpu_time,cluster``); a name ending
    in ``.gz`` is gunzipped first (at most MAX_CSV_BYTES either way); a leading UTF-8
    byte-order mark is dropped."""
    if str(path).endswith(".gz"):
        text = _read_gzip_text(path)
    else:
        text = read_text(path, limit=MAX_CSV_BYTES, kind="CSV file")
    text = text.removeprefix(BOM)
    jobs = []
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        need = ("timestamp", "duration", "num_gpus", "gpu_time")
        missing = [c for c in need if c not in (reader.fieldnames or ())]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, rec in enumerate(reader, start=2):
            jobs.append(_philly_row(rec, line, f"{path}:{line}"))
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable CSV: {exc}") from None
    if not jobs:
        raise InputError(f"{path}: no jobs")
    return jobs


def _read_gzip_text(path: str | Path) -> str:
    """The UTF-8 text of the gzip file ``path``, refusing more than MAX_CSV_BYTES unpacked."""
    raw = read_bytes(path, limit=MAX_CSV_BYTES, kind="gzip file")
    name = printable(str(path), 200)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as fh:
            data = fh.read(MAX_CSV_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{name}: not a readable gzip file: {exc}") from None
    if len(data) > MAX_CSV_BYTES:
        raise InputError(f"{name}: more than {MAX_CSV_BYTES} bytes unpacked")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 (byte {exc.start})") from None


def _philly_row(rec: Mapping[str, str], line: int, where: str) -> PhillyJob:
    try:
        stamp = datetime.strptime(rec["timestamp"], "%Y-%m-%d %H:%M:%S")
        duration, gpu_time = float(rec["duration"]), float(rec["gpu_time"])
        gpus = int(rec["num_gpus"])
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: {exc}") from None
    if not (math.isfinite(duration) and math.isfinite(gpu_time)) or gpus < 0:
        raise InputError(f"{where}: duration, gpu_time and num_gpus must be finite and >= 0")
    return PhillyJob(line, stamp, duration, gpus, gpu_time)


def parse_hours(text: str) -> tuple[int, int]:
    """``"3-6"`` -> (3, 6): hours of the day, first inclusive, last exclusive."""
    match = _HOURS.match(text)
    if match is None:
        raise InputError(f"--hours: must be FIRST-LAST hours of the day, e.g. 3-6, got {text!r}")
    first, last = int(match.group(1)), int(match.group(2))
    if not 0 <= first < last <= 24:
        raise InputError(f"--hours: need 0 <= first < last <= 24, got {text!r}")
    return first, last


def in_window(jobs: Sequence[PhillyJob], hours: tuple[int, int]) -> list[PhillyJob]:
    """Jobs kept by Pollux's filters and submitted within the hours of the day."""
    first, last = hours
    return [
        j
        for j in jobs
        if j.duration_s >= MIN_DURATION_S
        and j.gpu_time_s < MAX_GPU_TIME_S
        and j.num_gpus >= 1
        and first <= j.timestamp.hour < last
    ]


def nearest_task(gpu_time_s: float, task_gpu_s: Mapping[str, float]) -> str:
    """The task whose GPU time is nearest on a log scale (ties: the first in order)."""
    x = math.log(max(gpu_time_s, 1.0))
    return min(task_gpu_s, key=lambda name: abs(math.log(task_gpu_s[name]) - x))


def clip_gpus(task: Task, requested: int) -> int:
    """The request clipped into [min_gpus, max_gpus] and rounded up to a gpu_unit multiple."""
    unit = task.gpu_unit
    return min(task.max_gpus, max(task.min_gpus, -(-requested // unit) * unit))


def sample_workload(
    jobs: Sequence[PhillyJob],
    *,
    hours: tuple[int, int],
    count: int,
    seed: int,
    catalog: Catalog,
    task_gpu_s: Mapping[str, float],
) -> tuple[list[TraceJob], list[Mapped]]:
    """Sample ``count`` window jobs without replacement (numpy ``default_rng(seed)``) and map
    each to its nearest task (module doc). Returns jobs and mappings sorted by submission."""
    pool = in_window(jobs, hours)
    if count < 1:
        raise InputError(f"jobs x load: must give at least 1 job, got {count}")
    if count > len(pool):
        raise InputError(f"jobs x load: {count} jobs asked, the window holds only {len(pool)}")
    if not task_gpu_s:
        raise InputError("tasks: none to map jobs to")
    picked = np.random.default_rng(seed).choice(len(pool), size=count, replace=False)
    chosen = sorted((pool[int(i)] for i in picked), key=lambda j: (_second(j, hours), j.row))
    out_jobs, out_map = [], []
    for index, pj in enumerate(chosen):
        name = nearest_task(pj.gpu_time_s, task_gpu_s)
        task = catalog.get(name)
        gpus = clip_gpus(task, pj.num_gpus)
        job = TraceJob(f"{name}-{index}", _second(pj, hours), name, gpus, gpus * task.default_batch)
        out_jobs.append(job)
        out_map.append(
            Mapped(
                job.name,
                pj.row,
                pj.timestamp.isoformat(sep=" "),
                job.submit_s,
                pj.duration_s,
                pj.num_gpus,
                pj.gpu_time_s,
                name,
                task_gpu_s[name],
                gpus,
            )
        )
    return out_jobs, out_map


def sidecar(mapped: Sequence[Mapped], params: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON saved beside a sampled workload: parameters, seed and per-job mapping."""
    return {**params, "count": len(mapped), "jobs": [asdict(m) for m in mapped]}


def _second(job: PhillyJob, hours: tuple[int, int]) -> float:
    t = job.timestamp
    return float((t.hour - hours[0]) * 3600 + t.minute * 60 + t.second)
