"""A table end to end: the grid from the command's options, the runs it needs (run when
missing), the table printed as markdown and saved to ``OUT/tables/TABLE.md`` with its raw
numbers in ``OUT/tables/TABLE.json``. The header line of each table says how many runs were
reused and from which commits (use a fresh ``--out`` after the code changed).

``--quick``: 16 GPUs, 0.25 load, one seed (and scale 0.5x on 32 GPUs, faithful one workload
at 0.5 load): a smoke test of the runner, not a result.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from icefrog_slurm.errors import InputError
from icefrog_slurm.evaluation.grid import (
    POLICIES,
    Grid,
    ablation_rows,
    faithful_runs,
    fidelity_runs,
    main_runs,
    scale_runs,
    sharing_runs,
)
from icefrog_slurm.evaluation.runs import Run, Runner
from icefrog_slurm.evaluation.tables import (
    BATCH_ROWS,
    Table,
    markdown,
    table_ablation,
    table_batch,
    table_faithful,
    table_fidelity,
    table_main,
    table_scale,
    table_sharing,
    table_size,
    table_solver,
    table_tta,
)

MAX_LOAD = 100.0
MAX_SEED = 2**32 - 1  # what icefrog trace sample and simulate accept
MAX_GPUS = 100_000
MAX_BASE_JOBS = 1_000_000
TABLES = ("main", "size", "tta", "solver", "scale", "sharing", "ablation", "batch", "faithful",
          "fidelity")  # fmt: skip
MAX_WORKLOADS = 8  # Pollux's workloads a load
QUICK = Grid(loads=(0.25,), seeds=(1,), gpus=16, ablation_load=0.25, ablation_seeds=(1,),
             scale=((0.5, 32),), faithful_loads=(0.5,), workloads=1)  # fmt: skip


def grid_from(args: argparse.Namespace) -> Grid:
    """The grid the options ask for (``args`` as ``icefrog evaluate`` parses them)."""
    g = QUICK if args.quick else Grid()
    common = ("--batch", "paper", *[x for kv in args.set for x in ("--set", kv)])
    scale = tuple(p for p in g.scale if p[1] <= args.max_scale)
    return check_grid(
        Grid(
            loads=_floats("--loads", args.loads) if args.loads is not None else g.loads,
            seeds=_ints("--seeds", args.seeds) if args.seeds is not None else g.seeds,
            gpus=g.gpus if args.gpus is None else args.gpus,
            policies=_items("--policies", args.policies)
            if args.policies is not None
            else g.policies,
            base_jobs=args.base_jobs,
            tasks=args.tasks,
            ablation_load=g.ablation_load if args.ablation_load is None else args.ablation_load,
            ablation_seeds=_ints("--ablation-seeds", args.ablation_seeds)
            if args.ablation_seeds is not None
            else g.ablation_seeds,
            scale=scale,
            faithful_loads=g.faithful_loads,
            workloads=g.workloads if args.workloads is None else args.workloads,
            pollux=args.pollux if args.pollux is not None else g.pollux,
            common=common,
            philly=args.philly,
        )
    )


def check_grid(g: Grid) -> Grid:
    """``g`` when every size in it can run; else an InputError naming the option, before
    any simulation starts."""
    if not all(math.isfinite(w) and 0 < w <= MAX_LOAD for w in g.loads):
        raise InputError(f"--loads: each load must be in (0, {MAX_LOAD:g}], got {g.loads}")
    for flag, seeds in (("--seeds", g.seeds), ("--ablation-seeds", g.ablation_seeds)):
        if not seeds or not all(0 <= s <= MAX_SEED for s in seeds):
            raise InputError(f"{flag}: each seed must be in [0, {MAX_SEED}], got {seeds}")
    if not 1 <= g.gpus <= MAX_GPUS:
        raise InputError(f"--gpus: must be in [1, {MAX_GPUS}], got {g.gpus}")
    unknown = [p for p in g.policies if p not in POLICIES]
    if unknown:
        raise InputError(f"--policies: unknown {', '.join(unknown)}; choose from "
                         f"{', '.join(POLICIES)}")  # fmt: skip
    if not 1 <= g.base_jobs <= MAX_BASE_JOBS:
        raise InputError(f"--base-jobs: must be in [1, {MAX_BASE_JOBS}], got {g.base_jobs}")
    if not (math.isfinite(g.ablation_load) and 0 < g.ablation_load <= MAX_LOAD):
        raise InputError(f"--ablation-load: must be in (0, {MAX_LOAD:g}], got {g.ablation_load}")
    if not 1 <= g.workloads <= MAX_WORKLOADS:
        raise InputError(f"--workloads: must be within [1, {MAX_WORKLOADS}] (Pollux's "
                         f"workloads a load), got {g.workloads}")  # fmt: skip
    return g


def _items(flag: str, text: str) -> tuple[str, ...]:
    """The comma-separated items of ``text``; an empty list or item is an InputError (an
    empty option does not mean the default)."""
    items = tuple(x.strip() for x in text.split(","))
    if not all(items):
        raise InputError(f"{flag}: an empty list or item in {text!r}")
    return items


def _floats(flag: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in _items(flag, text))
    except ValueError:
        raise InputError(f"{flag}: not a comma-separated list of numbers: {text!r}") from None


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in _items(flag, text))
    except ValueError:
        raise InputError(f"{flag}: not a comma-separated list of integers: {text!r}") from None


def table_runs(table: str, g: Grid) -> list[Run]:
    """The runs ``table`` is made from."""
    if table in ("main", "size", "tta"):
        return main_runs(g)
    if table == "batch":
        return main_runs(replace(g, policies=BATCH_ROWS))
    if table == "scale":
        return scale_runs(g)
    if table == "solver":
        return [*main_runs(g), *scale_runs(g)]
    if table == "ablation":
        return [r for _, runs in ablation_rows(g) for r in runs]
    if table == "sharing":
        return sharing_runs(g)
    if table == "faithful":
        return faithful_runs(g)
    if table == "fidelity":
        return fidelity_runs(g)
    raise InputError(f"unknown table {table!r}; choose from {', '.join(TABLES)}, all")


def build(table: str, g: Grid, runner: Runner) -> Table:
    """Run what ``table`` needs and make it."""
    res = runner.ensure(table_runs(table, g))
    if table in ("main", "size", "tta"):
        return {"main": table_main, "size": table_size, "tta": table_tta}[table](g, res)
    if table == "batch":
        return table_batch(replace(g, policies=BATCH_ROWS), res)
    if table == "scale":
        return table_scale(g, res)
    if table == "solver":
        return table_solver(g, res)
    if table == "ablation":
        return table_ablation(ablation_rows(g), res)
    if table == "sharing":
        return table_sharing(g, res)
    if table == "faithful":
        return table_faithful(g, res)
    return table_fidelity(g, res)


def evaluate(tables: list[str], g: Grid, runner: Runner, *, out: Path, command: str) -> int:
    """Make each table in turn (printed, and saved under ``out/tables``); 1 when a run failed."""
    (out / "tables").mkdir(parents=True, exist_ok=True)
    for table in tables:
        before = (runner.ran, runner.reused)
        header, rows, raw = build(table, g, runner)
        text = markdown(header, rows)
        commits = ", ".join(sorted(runner.commits))
        note = (f"<!-- {command}: table {table}; {runner.ran - before[0]} run(s) now, "
                f"{runner.reused - before[1]} reused; commits {commits} -->")  # fmt: skip
        print(f"\n### {table}\n\n{note}\n\n{text}\n", flush=True)
        (out / "tables" / f"{table}.md").write_text(f"{note}\n\n{text}\n")
        doc: dict[str, Any] = {"table": table, "command": command, "header": header,
                               "rows": rows, "raw": raw,
                               "commits": sorted(runner.commits)}  # fmt: skip
        (out / "tables" / f"{table}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"runs: {runner.ran} now, {runner.reused} reused, {len(runner.failed)} failed",
          file=sys.stderr)  # fmt: skip
    return 1 if runner.failed else 0
