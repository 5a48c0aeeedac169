"""Simulated workloads: the in-memory job list and its Pollux-format CSV form.

A workload is a list of :class:`TraceJob` sorted by submission time. Its file form is Pollux's
(``workloads-*/workload-N.csv`` of the AdaptDL simulator):
``name,time,application,num_replicas,batch_size`` — time the submission second relative to
the trace start, application a catalog task or a Pollux application name (an alias, see
``catalog.py``), num_replicas the requested GPU count and batch_size the global batch.
A request must be one the task can run on: at least its smallest legal GPU count and a
multiple of its allocation unit (a larger request than its largest count is read: Pollux's
workloads hold some, and the policies that choose a job's GPUs place it within its range).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from icefrog_slurm.errors import InputError
from icefrog_slurm.limits import MAX_JOB_GPUS, MAX_SUBMIT_S
from icefrog_slurm.protocol import INT32_MAX
from icefrog_slurm.sim.catalog import Catalog
from icefrog_slurm.userfiles import read_text

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
BOM = "\ufeff"
"""The byte-order mark a spreadsheet may put before a UTF-8 CSV's header: not part of it."""
MAX_CSV_BYTES = 256 * 1024 * 1024
"""Largest workload or trace CSV read (Philly's whole trace is 3.4 MB)."""


@dataclass(frozen=True)
class TraceJob:
    """One submitted job: ``task`` is the catalog task name (aliases resolved)."""

    name: str
    submit_s: float  # seconds from the trace start
    task: str
    gpus: int  # requested GPU count (Pollux's num_replicas; the paper's "GPU request")
    batch_size: int  # global batch (fixed for Lucid, Optimus and ICEFROG; spec section 12)
    row: int = field(default=0, compare=False)  # its line in the file read (0: none)


def read_workload(path: str | Path, catalog: Catalog) -> list[TraceJob]:
    """Read a Pollux-format workload CSV (a leading UTF-8 byte-order mark dropped); every
    error names the file, row and column."""
    text = read_text(path, limit=MAX_CSV_BYTES, kind="CSV file").removeprefix(BOM)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = tuple(reader.fieldnames or ())
        rows = list(reader)
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable CSV: {exc}") from None
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}; needs {COLUMNS}")
    jobs, names = [], set()
    for i, row in enumerate(rows, start=2):
        where = f"{path}:{i}"
        name = (row["name"] or "").strip()
        if not name or name in names or not name.isprintable():
            raise InputError(f"{where}: name {name!r} is empty, repeated or not printable")
        names.add(name)
        try:
            task = catalog.resolve((row["application"] or "").strip())
        except InputError as exc:
            raise InputError(f"{where}: application: {exc}") from None
        submit_s = _number(row["time"], f"{where}: time", maximum=MAX_SUBMIT_S)
        gpus = _positive_int(row["num_replicas"], f"{where}: num_replicas", MAX_JOB_GPUS)
        _check_request(catalog, task, gpus, where)
        jobs.append(
            TraceJob(
                name=name,
                submit_s=submit_s,
                task=task,
                gpus=gpus,
                batch_size=_positive_int(row["batch_size"], f"{where}: batch_size", INT32_MAX),
                row=i,
            )
        )
    if not jobs:
        raise InputError(f"{path}: no jobs")
    return sorted(jobs, key=lambda j: j.submit_s)  # stable: file order among equal times


def write_workload(jobs: Iterable[TraceJob], path: str | Path) -> None:
    """Write jobs as a Pollux-format CSV (integer submission seconds, as Pollux's files)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for job in jobs:
            writer.writerow([job.name, round(job.submit_s), job.task, job.gpus, job.batch_size])


def by_task(jobs: Sequence[TraceJob]) -> dict[str, int]:
    """How many jobs of each task (for summaries)."""
    out: dict[str, int] = {}
    for job in jobs:
        out[job.task] = out.get(job.task, 0) + 1
    return out


def _check_request(catalog: Catalog, task: str, gpus: int, where: str) -> None:
    """InputError when the task can never run on ``gpus`` GPUs: fewer than its smallest
    legal count, or not a multiple of its allocation unit."""
    spec = catalog.get(task)
    counts = spec.gpu_counts()
    if not counts or gpus < counts[0] or gpus % spec.gpu_unit:
        least = counts[0] if counts else spec.min_gpus
        raise InputError(
            f"{where}: num_replicas {gpus}: {task} runs on a multiple of {spec.gpu_unit} "
            f"GPU(s), at least {least}"
        )


def _number(text: str | None, where: str, *, maximum: float) -> float:
    try:
        value = float(text or "")
    except ValueError:
        raise InputError(f"{where}: must be a number, got {_cut(text)}") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{where}: must be a finite number >= 0, got {_cut(text)}")
    if value > maximum:
        raise InputError(f"{where}: must be <= {maximum:g}, got {_cut(text)}")
    return value


def _positive_int(text: str | None, where: str, maximum: int) -> int:
    raw = (text or "").strip()
    if not (raw.isascii() and raw.isdigit()):
        raise InputError(f"{where}: must be an integer >= 1, got {_cut(text)}")
    if len(raw) > 19 or not 1 <= int(raw) <= maximum:
        raise InputError(f"{where}: must be within [1, {maximum}], got {_cut(text)}")
    return int(raw)


def _cut(text: str | None) -> str:
    """A cell quoted for an error message, cut to a readable length."""
    return repr(text if text is None or len(text) <= 40 else text[:40] + "...")
