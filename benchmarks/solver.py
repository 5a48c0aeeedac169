"""Solve-time benchmark of IceShare on Philly-trace rounds (docs/solver.md has the table).

Usage: .venv/bin/python -m benchmarks.solver [--sizes 48,240,480,960] [--rounds N] [--seeds N]
       [--mip-limit S] [--partition-gpus N] [--workers N] [--no-mip] [--shared P]
       [--whole-max-gpus N] [--fairness-floor F]

Instances. Jobs are sampled (seeded) from the repository's data/pollux/traces/philly.csv like
the paper's trace: submissions in hours 3-6 of a day, duration >= 60 s, < 1000 GPU-hours;
120 jobs per 48 GPUs (1x load), nodes of 4 GPUs with 80 GB. From each job's GPU request
``g0`` (capped at 32) and duration ``D`` a TTA per option comes from a plausible scaling
model (NOT measured; the Layer Tuner/TTA models replace it in the real system):
- throughput ``X(g) = g / (1 + s*(g-1))``, a serial fraction ``s`` ~ U(0.02, 0.3) a job;
- remaining work ``W = D * u * X(g0)`` with progress left ``u`` ~ U(0.1, 1), age
  ``T_age`` ~ U(0, 3 h); ``T_acc(g) = T_age + W / X(g)`` (eq 16's shape);
- legal counts: powers of two with ``g0/4 <= g <= 2*g0`` (and <= 64);
- jobs with ``g0 <= 2`` get a shared option with probability ``--shared`` (0.6):
  ``T_age + W/(0.9 X(1))`` (lambda = 0.9, eq 8), util ~ U(0.2, 0.7), memory ~ U(5, 50) GB.
Each instance is solved for ``--rounds`` rounds: between rounds every job's remaining work
shrinks by its progress and the previous round's placed allocation becomes ``current``
(so stage 3 and the warm start matter, as in the controller).

Printed per size: median and max solve time of ``auto`` on the whole problem (with its
status: ``optimal`` = proven), of ``auto`` on partitions of ``--partition-gpus``, of the
reference MIP on 48-GPU partitions (the paper's way, first round of each seed) and of the
reference MIP on the whole problem (``--mip-limit`` per stage, up to ``--mip-max-gpus``),
each with its gap to the whole ``auto`` answer on min_share and sum_share. ``fast proven``
counts the rounds ``auto`` answered by the fast path alone (proven optimal, no CBC); the
``cpu`` columns are the process CPU time of the solves (median; the partitions' with
``--workers 1``: in this process), less noisy than wall time on a shared machine. Above
``--whole-max-gpus`` the whole problem is not solved (only the partitions, without a gap).
Every solve holds stage 2 to ``--fairness-floor`` times stage 1's optimum (default: the
controller's, ``solver.fairness_floor``; 1 is the paper's objective).
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import time
from dataclasses import dataclass, replace

from benchmarks import POLLUX
from icefrog_slurm.core.placement import place
from icefrog_slurm.core.solver import (
    Cluster,
    Holding,
    JobRequest,
    Option,
    Problem,
    Solution,
    SolveOptions,
    check_solution,
    solve,
)
from icefrog_slurm.settings import SolverSettings

TRACE = POLLUX / "traces" / "philly.csv"


@dataclass
class SimJob:
    id: str
    g0: int
    serial: float
    work: float  # remaining seconds of work at g0
    age: float
    shared: tuple[float, float] | None  # (util, mem_gb)

    def throughput(self, g: int) -> float:
        return g / (1 + self.serial * (g - 1))

    def options(self) -> tuple[Option, ...]:
        w = self.work * self.throughput(self.g0)
        counts = [g for g in (1, 2, 4, 8, 16, 32, 64) if self.g0 / 4 <= g <= 2 * self.g0]
        opts = [Option(g, self.age + w / self.throughput(g)) for g in counts]
        if self.shared is not None:
            util, mem = self.shared
            tta = self.age + w / (0.9 * self.throughput(1))
            opts.append(Option(1, tta, shared=True, util=util, mem_gb=mem))
        return tuple(opts)


def load_trace() -> list[tuple[float, int]]:
    rows = []
    with TRACE.open() as fh:
        for r in csv.DictReader(fh):
            hour = int(r["timestamp"][11:13])
            dur, gpus = float(r["duration"]), int(r["num_gpus"])
            if 3 <= hour < 6 and dur >= 60 and float(r["gpu_time"]) < 1000 * 3600:
                rows.append((dur, gpus))
    return rows


def make_jobs(
    trace: list[tuple[float, int]], n: int, rng: random.Random, shared_p: float = 0.6
) -> list[SimJob]:
    jobs = []
    # more jobs than the trace window holds (9600 GPUs): drawn with replacement
    drawn = rng.sample(trace, n) if n <= len(trace) else rng.choices(trace, k=n)
    for k, (dur, gpus) in enumerate(drawn):
        g0 = min(max(1, gpus), 32)
        shared = None
        if g0 <= 2 and rng.random() < shared_p:
            shared = (rng.uniform(0.2, 0.7), rng.uniform(5, 50))
        jobs.append(
            SimJob(
                f"j{k}",
                g0,
                rng.uniform(0.02, 0.3),
                dur * rng.uniform(0.1, 1),
                rng.uniform(0, 3 * 3600),
                shared,
            )
        )
    return jobs


def problem_of(jobs: list[SimJob], gpus: int, current: dict[str, Holding]) -> Problem:
    cluster = Cluster(gpus=gpus, gpus_per_node=4, gpu_mem_gb=80)
    reqs = tuple(JobRequest(j.id, j.options(), current=current.get(j.id)) for j in jobs)
    return Problem(cluster, reqs)


def advance(jobs: list[SimJob], sol: Solution, problem: Problem) -> dict[str, Holding]:
    """Five minutes pass: running jobs progress; returns the placed allocations."""
    placement = place(problem, sol)
    current: dict[str, Holding] = {}
    for j in jobs:
        ch = sol.choices[j.id]
        j.age += 300
        if ch.gpus and j.id not in placement.unplaced:
            speed = j.throughput(ch.gpus) / j.throughput(j.g0) * (0.9 if ch.shared else 1)
            j.work = max(60.0, j.work - 300 * speed)
            nodes = tuple(placement.counts(j.id).items())
            current[j.id] = Holding(gpus=ch.gpus, shared=ch.shared, nodes=nodes)
    return current


CPU: dict[str, list[float]] = {}  # process CPU seconds of each timed solve, by column


def timed(problem: Problem, settings: SolveOptions, key: str = "") -> tuple[Solution, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    sol = solve(problem, settings)
    elapsed = time.perf_counter() - t0
    CPU.setdefault(key, []).append(time.process_time() - c0)
    bad = check_solution(problem, sol)
    if bad:
        raise SystemExit(f"invalid solution: {bad}")
    return sol, elapsed


def gap(ref: float, ours: float) -> float:
    """Relative shortfall of ``ours`` against ``ref`` (negative: ours is better)."""
    return 0.0 if ref == ours else (ref - ours) / max(abs(ref), abs(ours))


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.3f} {max(xs):7.3f}" if xs else "      -       -"


def fmt_gap(gs: list[tuple[float, float]]) -> str:
    if not gs:
        return "      -        -"
    return f"{max(g[0] for g in gs):+7.3%} {max(g[1] for g in gs):+8.3%}"


def run_size(
    gpus: int, load: float, args: argparse.Namespace, trace: list[tuple[float, int]]
) -> None:
    n_jobs = round(gpus * 120 / 48 * load)
    fast = SolveOptions(
        method="auto", time_limit_s=args.mip_limit, fairness_floor=args.fairness_floor
    )
    parted = replace(fast, partition_gpus=args.partition_gpus, workers=args.workers)
    mip_parted = replace(fast, method="mip", partition_gpus=48, workers=args.workers)
    mip_whole = replace(fast, method="mip")
    t: dict[str, list[float]] = {k: [] for k in ("fast", "part", "mpart", "mip")}
    CPU.clear()
    proven = 0
    g: dict[str, list[tuple[float, float]]] = {k: [] for k in ("part", "mpart", "mip")}
    statuses: set[str] = set()
    mip_statuses: set[str] = set()
    for seed in range(args.seeds):
        jobs = make_jobs(trace, n_jobs, random.Random(seed * 1000 + gpus), args.shared)
        current: dict[str, Holding] = {}
        whole = gpus <= args.whole_max_gpus
        for rnd in range(args.rounds):
            problem = problem_of(jobs, gpus, current)
            if whole:
                sol, dt = timed(problem, fast, "fast")
                t["fast"].append(dt)
                statuses.add(sol.status)
                proven += sol.solver == "fast" and sol.status == "optimal"
            else:
                sol, dt = timed(problem, parted, "part")
                t["part"].append(dt)
                statuses.add(sol.status)
            runs = [("part", parted, whole and gpus > args.partition_gpus)]
            runs.append(("mpart", mip_parted, gpus > 48 and rnd == 0 and not args.no_mip))
            runs.append(("mip", mip_whole, gpus <= args.mip_max_gpus and (rnd == 0 or gpus <= 48)))
            for key, settings, wanted in runs:
                if wanted:
                    other, dt = timed(problem, settings, key)
                    t[key].append(dt)
                    g[key].append(
                        (gap(sol.min_share, other.min_share), gap(sol.sum_share, other.sum_share))
                    )
                    if key == "mip":
                        mip_statuses.add(other.status)
            current = advance(jobs, sol, problem)

    def cpu(key: str) -> str:
        return f"{statistics.median(CPU[key]):7.3f}" if CPU.get(key) else "      -"

    print(
        f"{gpus:5d} {n_jobs:5d} {len(t['fast']) or len(t['part']):4d} | "
        f"{fmt(t['fast'])} {cpu('fast')} {','.join(sorted(statuses)):8s} {proven:3d} | "
        f"{fmt(t['part'])} {cpu('part')} {fmt_gap(g['part'])} | "
        f"{fmt(t['mpart'])} {fmt_gap(g['mpart'])} | "
        f"{fmt(t['mip'])} {fmt_gap(g['mip'])} {','.join(sorted(mip_statuses)) or '-'}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="48,240,480,960")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--mip-limit", type=float, default=60.0)
    parser.add_argument("--partition-gpus", type=int, default=240)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-mip", action="store_true", help="skip the partitioned MIP")
    parser.add_argument("--mip-max-gpus", type=int, default=240, help="largest whole MIP run")
    parser.add_argument("--loads", default="1", help="jobs per GPU relative to 120/48")
    parser.add_argument("--shared", type=float, default=0.6, help="P(shared option | g0 <= 2)")
    parser.add_argument(
        "--whole-max-gpus", type=int, default=4800, help="largest whole (unpartitioned) solve"
    )
    parser.add_argument(
        "--fairness-floor",
        type=float,
        default=SolverSettings().fairness_floor,
        help="stage 2 keeps this fraction of stage 1's optimum (default: the controller's)",
    )
    args = parser.parse_args()
    trace = load_trace()
    print(f"fairness floor {args.fairness_floor:g}")
    print("times in s (median max); gap = (auto whole - other)/auto whole, min_share and")
    print("sum_share, worst over runs (negative: the other is better)")
    print(
        " GPUs  jobs runs | auto whole, cpu (status, fast proven) | auto partitioned "
        f"{args.partition_gpus}, cpu + gaps        | MIP partitioned 48 + gaps              | "
        "MIP whole + gaps (status)"
    )
    for load in (float(x) for x in args.loads.split(",")):
        print(f"load {load:g}x")
        for size in (int(x) for x in args.sizes.split(",")):
            run_size(size, load, args, trace)


if __name__ == "__main__":
    main()
