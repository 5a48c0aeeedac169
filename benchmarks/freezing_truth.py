"""How much layer freezing can cut one job's time to its target in the simulator's hidden
truth, per catalog task: the numbers in docs/evaluation.md, "The freezing truth against
published measurements".

    .venv/bin/python -m benchmarks.freezing_truth [--seeds 1 2 3] [--task T ...] [--gpus N]

One job alone, unshared, on its task's smallest legal GPU count (1 GPU; the LLaMA tasks 4,
their allocation unit; ``--gpus N``: its largest legal count up to N) at its default
per-GPU batch, trained by the truth
(``sim/truth.py``: ``TaskTruth.throughput`` for speed, ``TrainingRun.advance`` for
progress, ψ's effect included). Its gain is

    TTA never freezing / TTA of the best freezing schedule,

the best over two families, depth l up to 90 % of the layers (the spec's cap), progress
points on a 0.1 grid:

- ``once``: freeze the first l layers when progress reaches p;
- ``ramp``: freeze layers one by one, the first at progress p0, the l-th by p1 (FreezeOut's,
  Egeria's and AutoFreeze's shape: front layers first, more as training goes on).

The best schedule is chosen on the mean TTA over three job seeds (a job's own noise), per
truth seed (the hidden parameters drawn for it); the table gives min-max over the truth
seeds. It knows the truth, so it is an upper bound on what any freezing rule that only
adds frozen layers reaches. ``half at 0.2``: the gain of freezing half the layers at
progress 0.2, as is -> with every frozen layer thawed for one step (1 % of the progress)
in ten: the truth records a layer's variance anew each time it is frozen, so a brief thaw
forgives the signal it missed while frozen. The last column
is what the Layer Tuner's rule (eq 15 with the *true* throughput and the job's observed
gradient statistics, re-tuned every epoch: ``freeze_diagnosis.myopic_run``) reaches, where
the job runs on 1 GPU.

Truth-side analysis only: it reads the hidden truth, which the policies never do.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.freeze_diagnosis import myopic_run
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import DEFAULT_MAX_FROZEN_FRACTION, shipped_catalog
from icefrog_slurm.sim.truth import TaskTruth, build_truths

STEPS = 100  # samples-to-target / STEPS per step: the truth's progress quantum (1 %)
RUN_SEEDS = (1, 2, 3)
GRID = tuple(round(0.1 * i, 1) for i in range(10))  # 0.0 .. 0.9
MAX_DEPTHS = 10  # depths tried: every one up to the cap, or this many spread over it

Schedule = Callable[[float], int]


@dataclass(frozen=True)
class Best:
    gain: float  # never-freeze TTA / this schedule's TTA (means over RUN_SEEDS)
    name: str  # "once l=.. p=.." or "ramp l=.. p=..-.."
    depth: int  # the schedule's largest depth
    base_s: float  # never-freeze TTA, seconds
    half: tuple[float, float]  # gain of half the layers frozen at 0.2: as is, thawed


def tta(t: TaskTruth, schedule: Schedule, *, gpus: int, batch: int, run_seed: int) -> float:
    """Seconds to the target of one job of ``t`` alone on ``gpus`` GPUs at per-GPU
    ``batch``, frozen to ``schedule(progress)`` layers, trained by the truth. The last step
    is cut where progress crosses 1, so the step size does not bias the ratio."""
    rate = [t.throughput(gpus=gpus, batch=batch, frozen=k) for k in range(t.layers.num_layers + 1)]
    run, spent = t.start_run(seed=run_seed), 0.0
    step = t.samples_to_target(gpus * batch) / STEPS
    while not run.reached:
        k = schedule(run.progress)
        if k != run.frozen:
            run.set_frozen(k)
        gained = run.advance(samples=step, global_batch=gpus * batch)
        used = step if run.progress <= 1.0 else step * (1 - (run.progress - 1.0) / gained)
        spent += used / rate[k]
    return spent


def once(depth: int, at: float) -> Schedule:
    return lambda p: depth if p >= at else 0


def ramp(depth: int, start: float, end: float) -> Schedule:
    """Layer i (1..depth) frozen from progress start + (end - start) (i - 1) / depth (the
    share rounded, so a boundary on the grid is not lost to floating point)."""

    def frozen(p: float) -> int:
        return (
            0 if p < start else min(depth, int(round((p - start) / (end - start) * depth, 9)) + 1)
        )

    return frozen


def thawed(schedule: Schedule) -> Schedule:
    """``schedule`` with nothing frozen during the first step of every tenth of progress."""
    return lambda p: 0 if int(p * STEPS) % 10 == 0 else schedule(p)


def schedules(num_layers: int) -> list[tuple[str, int, Schedule]]:
    cap = int(DEFAULT_MAX_FROZEN_FRACTION * num_layers)
    depths = sorted({max(1, round(cap * i / MAX_DEPTHS)) for i in range(1, MAX_DEPTHS + 1)})
    out: list[tuple[str, int, Schedule]] = []
    for k in depths:
        out += [(f"once l={k} p={p}", k, once(k, p)) for p in GRID]
        out += [
            (f"ramp l={k} p={p0}-{p1}", k, ramp(k, p0, p1))
            for p0 in GRID[:-1]
            for p1 in (round(p0 + 0.1 * j, 1) for j in range(1, 11))
            if p1 <= 1.0
        ]
    return out


def best_schedule(t: TaskTruth, *, gpus: int, batch: int) -> Best:
    def mean_tta(schedule: Schedule) -> float:
        runs = [tta(t, schedule, gpus=gpus, batch=batch, run_seed=s) for s in RUN_SEEDS]
        return statistics.fmean(runs)

    base = mean_tta(lambda _p: 0)
    timed = [(mean_tta(s), name, k) for name, k, s in schedules(t.layers.num_layers)]
    spent, name, depth = min(timed)
    half = once(t.layers.num_layers // 2, 0.2)
    halves = (base / mean_tta(half), base / mean_tta(thawed(half)))
    return Best(base / spent, name, depth, base, halves)


def myopic_gain(t: TaskTruth) -> float:
    """Never freezing / eq 15 with the true throughput re-tuned every epoch (1 GPU)."""
    base, _ = myopic_run(t, None)
    spent, _ = myopic_run(t, float(t.task.samples_per_epoch))
    return base / spent


def span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="truth seeds")
    ap.add_argument("--task", nargs="+", help="catalog tasks (default: every available one)")
    ap.add_argument("--gpus", type=int, help="largest legal GPU count up to this (default: min)")
    args = ap.parse_args()
    catalog, calibration = shipped_catalog(), shipped_calibration()
    truths = {s: build_truths(catalog, calibration, seed=s) for s in args.seeds}
    names = args.task or list(truths[args.seeds[0]])
    unknown = sorted(set(names) - set(truths[args.seeds[0]]))
    if args.gpus is not None and args.gpus < 1:
        ap.error(f"--gpus: must be at least 1, got {args.gpus}")
    if unknown:
        ap.error(f"unknown or unavailable task(s): {', '.join(unknown)}")
    print(
        f"Single-job TTA gain from freezing in the truth, truth seeds {args.seeds}"
        f" (min-max), job seeds {list(RUN_SEEDS)} averaged; best schedule of seed"
        f" {args.seeds[0]}"
    )
    print(
        "| task | GPUs x batch | never-freeze TTA h | best-freeze gain | best schedule |"
        " T(l)/T(0) there | half at 0.2 | eq 15, true T |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for name in names:
        first = truths[args.seeds[0]][name]
        task = first.task
        legal = [g for g in task.gpu_counts() if args.gpus is None or g <= args.gpus]
        if not legal:
            print(f"| {name} | no legal GPU count up to {args.gpus} | | | | | | |")
            continue
        gpus, batch = legal[-1] if args.gpus else legal[0], task.default_batch
        bests = [best_schedule(truths[s][name], gpus=gpus, batch=batch) for s in args.seeds]
        b = bests[0]
        speed = first.throughput(gpus=gpus, batch=batch, frozen=b.depth) / first.throughput(
            gpus=gpus, batch=batch, frozen=0
        )
        myopic = span([myopic_gain(truths[s][name]) for s in args.seeds]) if gpus == 1 else "-"
        print(
            f"| {name} | {gpus} x {batch} | {b.base_s / 3600:.2f} |"
            f" {span([x.gain for x in bests])} | {b.name} ({b.depth}/{first.layers.num_layers})"
            f" | {speed:.2f} | {span([x.half[0] for x in bests])} ->"
            f" {span([x.half[1] for x in bests])} | {myopic} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
