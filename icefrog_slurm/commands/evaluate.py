"""``icefrog evaluate``: the evaluation tables of docs/evaluation.md, one command each.

    icefrog evaluate TABLE [TABLE ...] [--out DIR] [--jobs N] [--quick] [--no-run] \\
        [--loads 1,2,3] [--seeds 1,2,3] [--gpus N] [--policies P,...] [--base-jobs N] \\
        [--tasks T,...] [--max-scale GPUS] [--ablation-load W] [--ablation-seeds 1,2,3] \\
        [--workloads N] [--set SECTION.KEY=VALUE ...] [--philly CSV] [--pollux DIR]

TABLE is one of main, size, tta, solver, scale, sharing, ablation, batch, faithful, fidelity,
or all
(``icefrog_slurm/evaluation``). Every simulation is an ``icefrog simulate`` process whose
``summary.json`` under ``--out`` is reused by later commands (resumable); ``--no-run`` makes
the tables from the runs already there. ``--pollux`` (the folder holding
``workloads-{0.5,1.5,2.0}`` and, for ``fidelity``, Pollux's published
``results-jobload``) defaults to the repository's ``data/pollux``
in a source checkout and must be given otherwise; ``--philly`` defaults to the trace
``icefrog trace sample`` ships. Bad arguments exit 2 before anything is written
(:func:`check_inputs`), and a trace job that a run's policy could never start exits 2
before any simulation (:func:`check_requests`); a failed simulation makes the exit 1.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

from icefrog_slurm.commands import simulate
from icefrog_slurm.commands.trace import HOURS, task_gpu_seconds
from icefrog_slurm.errors import InputError
from icefrog_slurm.evaluation.driver import TABLES, evaluate, grid_from, table_runs
from icefrog_slurm.evaluation.grid import POLICIES, Grid
from icefrog_slurm.evaluation.runs import (
    GPUS_PER_NODE,
    Run,
    Runner,
    Trace,
    repo_pollux,
    source_checkout,
)
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import SimOptions, check_steps
from icefrog_slurm.sim.trace import in_window, packaged_philly, parse_hours, read_philly
from icefrog_slurm.sim.workload import TraceJob, read_workload


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("tables", nargs="+", metavar="TABLE", help=f"{'|'.join(TABLES)}|all")
    ap.add_argument("--out", type=Path, default=None,
                    help="runs, traces and tables (default: results/eval in the source "
                         "checkout, else in the current folder)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2, help="simulations at once (2)")
    ap.add_argument("--quick", action="store_true", help="16 GPUs, 0.25 load, 1 seed (smoke)")
    ap.add_argument("--no-run", action="store_true",
                    help="run nothing: tables from the runs in --out (- if missing)")  # fmt: skip
    ap.add_argument("--loads", help="main: load factors, e.g. 1,2,3")
    ap.add_argument("--seeds", help="main: seeds, e.g. 1,2,3")
    ap.add_argument("--gpus", type=int, help="main/ablation: GPUs (48)")
    ap.add_argument("--policies", help=f"main/scale: policies ({','.join(POLICIES)})")
    ap.add_argument("--base-jobs", type=int, default=120, help="trace jobs at 1x load (120)")
    ap.add_argument("--tasks", default="", help="trace sample --tasks (default: its own)")
    ap.add_argument("--max-scale", type=int, default=960, help="scale: largest GPUs (960)")
    ap.add_argument("--ablation-load", type=float, help="ablation: load factor (2: the paper's)")
    ap.add_argument("--ablation-seeds", help="ablation: seeds, e.g. 1,2,3 (1,2,3)")
    ap.add_argument(
        "--workloads", type=int, help="faithful/fidelity: workloads per load (3; Pollux has 8)"
    )
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="passed to every simulation (part of the run key)")  # fmt: skip
    ap.add_argument(
        "--philly",
        type=Path,
        default=None,
        help="Philly trace CSV for trace sample (default: trace sample's own)",
    )
    ap.add_argument("--pollux", type=Path, default=None,
                    help="folder holding workloads-{0.5,1.5,2.0} and results-jobload "
                         "(faithful, fidelity; default: the "
                         "repository's data/pollux)")  # fmt: skip


def tables_from(names: list[str]) -> list[str]:
    """The tables asked for (``all``: every one); an unknown name is an InputError."""
    tables = list(TABLES) if "all" in names else names
    bad = [t for t in tables if t not in TABLES]
    if bad:
        raise InputError(f"unknown table(s) {', '.join(bad)}; choose from {', '.join(TABLES)}, all")
    return tables


def command_line(args: argparse.Namespace) -> str:
    """The command as given (tables, then each option not left at its default)."""
    words = ["icefrog", "evaluate", *args.tables]
    for dest, value in vars(args).items():
        if dest in ("tables", "command") or dest.startswith("_") or value in (None, False, []):
            continue
        if (dest, value) in (("jobs", 2), ("base_jobs", 120), ("max_scale", 960), ("tasks", "")):
            continue
        flag = "--" + dest.replace("_", "-")
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [w for v in value for w in (flag, str(v))]
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    tables = tables_from(args.tables)
    command = command_line(args)
    if args.jobs < 1:
        raise InputError(f"--jobs: must be >= 1, got {args.jobs}")
    if args.pollux is None:
        args.pollux = repo_pollux()
        if args.pollux is None and {"faithful", "fidelity"} & set(tables):
            raise InputError(
                "--pollux: no data/pollux in a source checkout here; give --pollux DIR "
                "(the folder holding workloads-0.5, workloads-1.5 and workloads-2.0)"
            )
    g = grid_from(args)
    if "icefrog" not in g.policies:
        raise InputError("--policies: must include icefrog (the speedups are over it)")
    root = source_checkout()
    out = args.out or (root or Path.cwd()) / "results" / "eval"
    runner = Runner(out, args.jobs, run_missing=not args.no_run)
    check_inputs(tables, g, runner)
    runner.check = lambda runs: check_requests(runner, runs)
    return evaluate(tables, g, runner, out=out, command=command)


def check_inputs(tables: Sequence[str], g: Grid, runner: Runner) -> None:
    """What every simulation and trace of the tables needs, checked before anything is
    written (an InputError naming the option, exit 2, where 54 runs failed one by one):
    each run's settings (the ``--set`` overrides on the defaults) and simulate options
    (``--gpus`` and the rest), ``--tasks``, ``--philly`` and the jobs each trace to sample
    draws from its window (``--loads`` x ``--base-jobs``), and Pollux's workload files."""
    runs = list({r.key: r for t in tables for r in table_runs(t, g)}.values())
    parser = argparse.ArgumentParser(prog="icefrog simulate")
    simulate.add_arguments(parser)
    for gpus, seed, policy, extra in sorted({(r.gpus, r.seed, r.policy, r.extra) for r in runs}):
        one = Run("check", Path("workload.csv"), policy, gpus, seed, extra)
        args = parser.parse_args([*one.argv(Path("workload.csv"))[1:], "--out", "out"])
        check_steps(simulate.sim_settings(args), simulate.sim_options(args))
    traces = {r.workload for r in runs if isinstance(r.workload, Trace)}
    if traces:
        catalog = shipped_catalog()
        task_gpu_seconds(g.tasks, catalog)
        if g.philly is not None and not g.philly.is_file():
            what = "is a folder" if g.philly.is_dir() else "no such file"
            raise InputError(f"--philly {g.philly}: {what}")
        to_sample = [t for t in traces if not runner.trace_path(t).with_suffix(".json").is_file()]
        if to_sample and runner.run_missing:
            philly = g.philly if g.philly is not None else packaged_philly()
            window = len(in_window(read_philly(philly), parse_hours(HOURS)))
            for t in sorted(to_sample, key=lambda t: (t.load, t.base_jobs)):
                count = round(t.base_jobs * t.load)
                if not 1 <= count <= window:
                    raise InputError(
                        f"--loads/--base-jobs: load {t.load:g} x {t.base_jobs} jobs asks "
                        f"{count} jobs of the Philly window (hours {HOURS}), which holds "
                        f"{window}"
                    )
    workloads = {r.workload for r in runs if isinstance(r.workload, Path)}
    if workloads and runner.run_missing:
        catalog = shipped_catalog()
        for path in sorted(workloads):
            if not path.is_file():
                raise InputError(f"--pollux {g.pollux}: no workload {path}")
            read_workload(path, catalog)


def check_requests(runner: Runner, runs: Sequence[Run]) -> None:
    """Once the traces are sampled, before a run starts: a job of a trace that Lucid+ or
    plain Slurm could never start on a run's GPUs (``simulate.check_requests``) is an
    InputError naming the trace's row and the run's ``--gpus``."""
    catalog = shipped_catalog()
    read: dict[Path, list[TraceJob]] = {}
    for r in runs:
        if r.policy not in simulate.ON_REQUEST or not isinstance(r.workload, Trace):
            continue
        if "v100" in r.extra:  # Pollux's applications' ranges: simulate checks them itself
            continue
        path = runner.trace_path(r.workload)
        if path not in read:
            read[path] = read_workload(path, catalog)
        options = SimOptions(gpus=r.gpus, gpus_per_node=GPUS_PER_NODE)
        simulate.check_requests(path, read[path], [r.policy], options, catalog, {})
