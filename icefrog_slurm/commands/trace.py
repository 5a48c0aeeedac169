"""``icefrog trace sample``: draw an evaluation workload from the Philly trace (spec section 12).

    icefrog trace sample --hours 3-6 --jobs 120 --load 2 --seed 1 --out w.csv

reads the Philly trace the package ships (Pollux's copy, gzip-compressed) unless
``--philly PATH`` names another (a plain CSV or a ``.csv.gz``), and writes ``w.csv``
(Pollux's workload format: name,time,application,num_replicas,batch_size) and ``w.json``
beside it: the seed, the parameters (the Philly file's sha256 among them), each task's
reference GPU time and the per-job mapping (Philly row, its GPU time, the task chosen). The
sampling rules are in ``icefrog_slurm/sim/trace.py``. Bad arguments or files exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import math

from icefrog_slurm.errors import InputError
from icefrog_slurm.evaluation.runs import file_sha256
from icefrog_slurm.limits import MAX_SEED
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import Catalog, shipped_catalog
from icefrog_slurm.sim.trace import (
    BASE_JOBS,
    packaged_philly,
    parse_hours,
    read_philly,
    sample_workload,
    sidecar,
)
from icefrog_slurm.sim.workload import by_task, write_workload
from icefrog_slurm.userfiles import path_arg

HOURS = "3-6"  # the paper's window: hours 3 to 6 of each day
MAX_JOBS = 1_000_000
"""Most jobs drawn (--jobs, and --jobs x --load; Philly's whole trace has 82,247)."""


def _cut(value: int) -> str:
    """An integer argument for an error message, cut to a readable length."""
    text = str(value) if abs(value) < 10**40 else f"{str(value)[:20]}... ({len(str(value))} digits)"
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)
    sp = sub.add_parser("sample", help="sample a workload from the Philly trace")
    sp.add_argument("--philly", type=path_arg, default=None,
                    help="philly.csv or .csv.gz (default: the packaged trace)")  # fmt: skip
    sp.add_argument("--hours", default=HOURS, help=f"hours of the day FIRST-LAST (default {HOURS})")
    sp.add_argument("--jobs", type=int, default=BASE_JOBS, help="jobs at 1x load (120)")
    sp.add_argument("--load", type=float, default=1.0, help="load factor W: jobs x W are drawn")
    sp.add_argument("--seed", type=int, required=True, help="random seed (saved in the sidecar)")
    sp.add_argument("--tasks", default="", help="comma-separated catalog tasks to map to "
                    "(default: the paper's tasks available here)")  # fmt: skip
    sp.add_argument("--out", required=True, type=path_arg, help="workload CSV to write")


def task_gpu_seconds(tasks: str, catalog: Catalog) -> dict[str, float]:
    """``--tasks`` (comma-separated catalog tasks or aliases; empty: the paper's tasks that
    load and are calibrated here) -> each task's reference GPU time; InputError naming an
    unknown or uncalibrated task."""
    calibration = shipped_calibration()
    try:
        names = [catalog.resolve(t.strip()) for t in tasks.split(",") if t.strip()]
    except InputError as exc:
        raise InputError(f"--tasks: {str(exc).removeprefix('task: ')}") from None
    # default: the paper's tasks that load and are calibrated here (the LLaMA ones join once
    # core.transformer_tables is merged and calibration.json regenerated)
    names = names or [n for n in catalog.available("icefrog") if n in calibration]
    missing = [n for n in names if n not in calibration]
    if missing:
        raise InputError(f"--tasks: no calibration for {', '.join(missing)}")
    return {n: calibration[n].reference_gpu_seconds(catalog.get(n)) for n in names}


def run(args: argparse.Namespace) -> int:
    hours = parse_hours(args.hours)
    if not 1 <= args.jobs <= MAX_JOBS:
        raise InputError(f"--jobs: must be within [1, {MAX_JOBS}], got {_cut(args.jobs)}")
    if not (math.isfinite(args.load) and args.load > 0):
        raise InputError(f"--load: must be a finite number > 0, got {args.load}")
    if args.jobs * args.load > MAX_JOBS:
        raise InputError(
            f"--load: --jobs {args.jobs} x --load {args.load:g} must be at most {MAX_JOBS} jobs"
        )
    if not 0 <= args.seed <= MAX_SEED:
        raise InputError(f"--seed: must be within [0, {MAX_SEED}], got {args.seed}")
    if args.out.suffix != ".csv":
        raise InputError(f"--out: must end in .csv, got {args.out}")
    if not args.out.parent.is_dir():
        raise InputError(f"--out: folder {args.out.parent} does not exist")
    if args.out.is_dir():
        raise InputError(f"--out: {args.out} is a folder")
    catalog = shipped_catalog()
    task_gpu_s = task_gpu_seconds(args.tasks, catalog)
    count = round(args.jobs * args.load)
    philly = args.philly if args.philly is not None else packaged_philly()
    jobs, mapped = sample_workload(
        read_philly(philly), hours=hours, count=count, seed=args.seed, catalog=catalog,
        task_gpu_s=task_gpu_s,
    )  # fmt: skip
    write_workload(jobs, args.out)
    params = {
        "philly": str(args.philly) if args.philly is not None else "packaged:philly.csv.gz",
        "philly_sha256": file_sha256(philly),
        "hours": list(hours),
        "jobs_at_1x": args.jobs,
        "load": args.load,
        "seed": args.seed,
        "rng": "numpy.random.default_rng(seed).choice(window, count, replace=False)",
        "task_gpu_time_s": task_gpu_s,
    }
    sidecar_path = args.out.with_suffix(".json")
    sidecar_path.write_text(json.dumps(sidecar(mapped, params), indent=1) + "\n", "utf-8")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(by_task(jobs).items()))
    print(f"wrote {args.out} ({len(jobs)} jobs: {counts}) and {sidecar_path}")
    return 0
