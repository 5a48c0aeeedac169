"""Time the simulator on a workload, per policy, and split where the time goes.

Prints per policy: wall seconds in all; the process's CPU seconds (user + system: on a
shared machine the figure to compare, wall time depends on the others' load), of which in
``policy.decide`` (the policy's own estimation and optimisation, the same cost production
pays each round), of it in the throughput models' fits (``ProfileHistory.model``: eq 14's
least squares), and the rest (engine, controller tick and reconcile, SQLite store); ticks,
rounds, simulated hours, average JCT.
Targets: a 48-GPU 1x trace in under 20 s, the 960-GPU 20x one in under 5 min.

Usage (the 1x trace of docs/evaluation.md):
    .venv/bin/icefrog trace sample --load 1 --seed 1 --out /tmp/w1.csv
    .venv/bin/python -m benchmarks.simulate --workload /tmp/w1.csv --gpus 48 \\
        --policy standin,lucid+,optimus+,pollux+
Where the time goes at scale (cProfile of simulated hours 3.0-3.6 of the 960-GPU 20x trace,
the busiest stretch: every job has arrived):
    .venv/bin/python -m benchmarks.simulate --workload /tmp/w20.csv --gpus 960 \
        --policy icefrog --batch paper --hours 3.6 --profile-from 3.0 --cprofile /tmp/w20.prof
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from icefrog_slurm.commands.simulate import adapts_batch, make_policy
from icefrog_slurm.core.fit import ProfileHistory
from icefrog_slurm.core.tuner import ThroughputModel
from icefrog_slurm.domain.plan import Policy, PolicyResult
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import read_workload


class FitClock:
    """The CPU seconds spent in ``ProfileHistory.model`` (every job's fits), while on."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self._real = ProfileHistory.model

    def __enter__(self) -> FitClock:
        real = self._real

        def timed(history: ProfileHistory) -> ThroughputModel:
            start = time.process_time()
            try:
                return real(history)
            finally:
                self.cpu += time.process_time() - start

        ProfileHistory.model = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_exc: object) -> None:
        ProfileHistory.model = self._real  # type: ignore[method-assign]


class Timed:
    """A policy wrapped to add up the CPU seconds spent deciding."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.name, self.cpu = inner, inner.name, 0.0

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        start = time.process_time()
        try:
            return self.inner.decide(snapshot, settings=settings)
        finally:
            self.cpu += time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, required=True)
    ap.add_argument("--gpus", type=int, default=48)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--policy", default="standin,lucid+,optimus+,pollux+")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-freeze", action="store_true")
    ap.add_argument("--no-share", action="store_true")
    ap.add_argument("--batch", choices=("paper", "fixed", "tuned"), default="tuned",
                    help="as icefrog simulate --batch (default here: tuned)")  # fmt: skip
    ap.add_argument("--progress", type=float, default=0.0, metavar="S",
                    help="progress to stderr every S wall seconds")  # fmt: skip
    ap.add_argument("--hours", type=float, default=None,
                    help="stop after this many simulated hours (jobs left unfinished)")  # fmt: skip
    ap.add_argument("--cprofile", type=Path, default=None, metavar="FILE",
                    help="run under cProfile, write the stats to FILE (one policy)")  # fmt: skip
    ap.add_argument("--profile-from", type=float, default=0.0, metavar="H",
                    help="with --cprofile: start profiling at the first round after H "
                         "simulated hours")  # fmt: skip
    args = ap.parse_args()
    if args.cprofile and "," in args.policy:
        ap.error("--cprofile profiles one policy: give --policy NAME")
    if args.profile_from and not args.cprofile:
        ap.error("--profile-from needs --cprofile FILE")
    catalog = shipped_catalog()
    workload = read_workload(args.workload, catalog)
    opts = SimOptions(
        gpus=args.gpus, gpus_per_node=args.gpus_per_node, seed=args.seed,
        freeze=not args.no_freeze, share=not args.no_share,
    )  # fmt: skip
    print(f"{args.workload} ({len(workload)} jobs), {args.gpus} GPUs, seed {args.seed}, "
          f"freeze {opts.freeze}, share {opts.share}, batch {args.batch}")  # fmt: skip
    print("| policy | wall s | CPU s | policy CPU s | of it fits CPU s | rest CPU s | ticks "
          "| rounds | sim h | avg JCT h |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.policy.split(","):
        policy = Timed(make_policy(name))
        settings = Settings()
        fixed = args.batch == "fixed" or (
            args.batch == "paper" and not adapts_batch(name, settings)
        )
        started, cpu_started = time.perf_counter(), time.process_time()
        run_opts = replace(opts, fixed_batch=fixed)
        if args.hours is not None:
            run_opts = replace(run_opts, max_sim_s=args.hours * 3600)
        engine = Engine(workload, policy, settings=settings, options=run_opts)
        profiler = cProfile.Profile() if args.cprofile else None
        show = _progress(name, started, args.progress) if args.progress else None
        if profiler is not None and args.profile_from <= 0:
            profiler.enable()
        elif profiler is not None:
            show = _profile_from(profiler, args.profile_from * 3600, show)
        with FitClock() as fits:
            result = engine.run(show)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.cprofile)
            pstats.Stats(str(args.cprofile), stream=sys.stderr).sort_stats(
                "cumulative"
            ).print_stats(40)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        jcts = [j.finish - j.submit for j in result.jobs if j.finish is not None]
        avg = statistics.fmean(jcts) / 3600 if jcts else float("nan")
        print(
            f"| {name} | {wall:.1f} | {cpu:.1f} | {policy.cpu:.1f} | {fits.cpu:.1f} | "
            f"{cpu - policy.cpu:.1f} | "
            f"{result.ticks} | {len(result.rounds)} | {result.end_time / 3600:.1f} | {avg:.2f} |",
            flush=True,
        )


Progress = Callable[[float, int, int], None]


def _profile_from(profiler: cProfile.Profile, start_s: float, then: Progress | None) -> Progress:
    """A progress callback (called after each round) that starts ``profiler`` once."""
    on = [False]

    def show(now: float, done: int, total: int) -> None:
        if not on[0] and now >= start_s:
            on[0] = True
            profiler.enable()
        if then is not None:
            then(now, done, total)

    return show


def _progress(name: str, started: float, every: float) -> Progress:
    last = [started]

    def show(now: float, done: int, total: int) -> None:
        wall = time.perf_counter()
        if wall - last[0] >= every:
            last[0] = wall
            print(f"{name}: wall {wall - started:.0f} s, sim {now / 3600:.2f} h, "
                  f"{done}/{total} jobs done", file=sys.stderr, flush=True)  # fmt: skip

    return show


if __name__ == "__main__":
    main()
