"""Why freezing does not pay in the simulator: the numbers in docs/evaluation.md,
"Ablation: freezing".

    .venv/bin/python -m benchmarks.freeze_diagnosis oracle [--task T]
    .venv/bin/python -m benchmarks.freeze_diagnosis myopic [--task T]
    .venv/bin/python -m benchmarks.freeze_diagnosis toy [--policy P] [--batch paper|tuned]
        [--freezing penalty|freezeout] [--jobs N] [--gpus G] [--tuner-batch run]

``oracle``: one job alone on one GPU at its default batch, trained by the hidden truth
(``sim/truth.py``) under "freeze l layers once progress reaches p": time to the target
relative to never freezing. The best any single freeze can do.

``myopic``: the same job under the Layer Tuner's rule (eq 15: argmax psi(l) x T(l), psi from
the job's *observed* noisy statistics, eq 3) with the TRUE throughput, re-tuned every epoch
(the spec's trainer, section 9 step 3) or every 300 s (a controller round).

``toy``: N one-GPU jobs of the task, 600 s apart, on G GPUs through the real engine and
policy, with and without freezing; per decision the Layer Tuner's predicted throughput gain
of the chosen depth against the truth's at the batch the job really runs. ``--tuner-batch
run`` (with ``--batch paper``) lets the Layer Tuner consider only the per-GPU batch the job
will really run at each GPU count (its fixed global batch split over the GPUs, as
``SimJob.batch_for``): what the estimator would do if jobs declared their fixed global batch.

Truth-side analysis only: it reads the hidden truth, which the policies never do.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import replace

import icefrog_slurm.policies.estimate as estimate
from icefrog_slurm.commands.simulate import make_policy
from icefrog_slurm.core.penalty import PenaltyTable
from icefrog_slurm.core.tuner import TunerChoice
from icefrog_slurm.protocol import Decision
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim import jobs as simjobs
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.truth import TaskTruth, build_truths
from icefrog_slurm.sim.workload import TraceJob


def _truth(task: str, seed: int) -> TaskTruth:
    return build_truths(shipped_catalog(), shipped_calibration(), seed=seed)[task]


def _time(t: TaskTruth, schedule: Callable[[float], int], run_seed: int = 3) -> float:
    m = t.task.default_batch
    run, spent, step = t.start_run(seed=run_seed), 0.0, t.samples_to_target(m) / 2000
    while not run.reached:
        k = schedule(run.progress)
        if k != run.frozen:
            run.set_frozen(k)
        run.advance(samples=step, global_batch=m)
        spent += step / t.throughput(gpus=1, batch=m, frozen=k)
    return spent


def oracle(args: argparse.Namespace) -> None:
    t = _truth(args.task, args.seed)
    n, m = t.layers.num_layers, t.task.default_batch
    t0 = t.throughput(gpus=1, batch=m, frozen=0)
    ratios = [t.throughput(gpus=1, batch=m, frozen=k) / t0 for k in range(n + 1)]
    print(f"{args.task}: true T(l)/T(0), 1 GPU, batch {m}:", " ".join(f"{r:.2f}" for r in ratios))
    base = _time(t, lambda _p: 0)
    depths = list(range(1, n, max(1, n // 8)))
    print("| freeze at p | " + " | ".join(f"l={k}" for k in depths) + " |")
    print("| ---: |" + " ---: |" * len(depths))
    for p0 in (0.0, 0.1, 0.2, 0.3, 0.5, 0.7):
        cells = [_time(t, lambda p, k=k, p0=p0: k if p >= p0 else 0) / base for k in depths]
        print(f"| {p0} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


def retune_due(since: float, interval: float | None) -> bool:
    """Whether the myopic rule re-tunes now, ``since`` samples after it last did;
    ``interval`` None never re-tunes (the never-freeze baseline: an infinite interval would
    compare ``inf >= inf`` once the count since the start is infinite, and freeze once)."""
    return interval is not None and since >= interval


def myopic_run(
    t: TaskTruth, interval: float | None, run_seed: int = 3
) -> tuple[float, list[tuple[float, int]]]:
    """Seconds to the target alone on 1 GPU at the default batch under eq 15 with the TRUE
    throughput, re-tuned every ``interval`` samples (None: never, nothing frozen); and the
    first moves (progress, depth)."""
    n, m = t.layers.num_layers, t.task.default_batch
    cap, epoch = int(0.9 * n), t.task.samples_per_epoch
    rate = [t.throughput(gpus=1, batch=m, frozen=k) for k in range(n + 1)]
    r, spent, since = t.start_run(seed=run_seed), 0.0, 0.0 if interval is None else interval
    stats, moves, e = None, [], 0
    while not r.reached:
        if retune_due(since, interval) and stats is not None:
            psi = PenaltyTable(stats.grad_var).psi
            k = max(range(cap + 1), key=lambda k: (psi(k) * rate[k], -abs(k - r.frozen)))
            if k != r.frozen:
                r.set_frozen(k)
                moves.append((round(r.progress, 2), k))
            since = 0.0
        r.advance(samples=epoch, global_batch=m)
        spent += epoch / rate[r.frozen]
        since += epoch
        e += 1
        stats = r.observe_grad_stats(epoch=e, base_batch=m)
    return spent, moves


def myopic(args: argparse.Namespace) -> None:
    t = _truth(args.task, args.seed)
    m, epoch = t.task.default_batch, t.task.samples_per_epoch
    base, never = myopic_run(t, None)
    assert not never, "the never-freeze baseline froze"
    print(f"{args.task}, 1 GPU, batch {m}: never freezing {base:.0f} s")
    per_300s = 300 * t.throughput(gpus=1, batch=m, frozen=0)
    for name, interval in (("every epoch", epoch), ("every 300 s", per_300s)):
        spent, moves = myopic_run(t, float(interval))
        print(f"eq 15 with true T, re-tuned {name}: {spent / base:.3f} x; first moves {moves[:8]}")


def toy(args: argparse.Namespace) -> None:
    catalog = shipped_catalog()
    default = catalog.get(args.task).default_batch
    settings = Settings()
    settings = replace(settings, policy=replace(settings.policy, freezing=args.freezing))
    chosen: dict[tuple[str, int, int], TunerChoice] = {}
    rows: list[str] = []
    current: list[str] = [""]
    gpus_now: list[int] = [0]
    orig_candidates, orig_mop, orig_tune = (
        estimate.Estimator.candidates, estimate.measured_or_predicted, estimate.tune,
    )  # fmt: skip

    def candidates(self: estimate.Estimator, job: object, **kw: object) -> object:
        current[0] = job.job.name  # type: ignore[attr-defined]
        return orig_candidates(self, job, **kw)  # type: ignore[arg-type]

    def mop(**kw: object) -> object:
        gpus_now[0] = int(kw["gpus"])  # type: ignore[call-overload]
        return orig_mop(**kw)  # type: ignore[arg-type]

    def tune(**kw: object) -> TunerChoice | None:
        if args.tuner_batch == "run":
            sizes = tuple(kw["batch_sizes"])  # type: ignore[call-overload]
            kw["batch_sizes"] = (min(max(-(-default // gpus_now[0]), sizes[0]), sizes[-1]),)
        best = orig_tune(**kw)  # type: ignore[arg-type]
        if best is not None and kw.get("lam", 1.0) == 1.0:
            t0 = kw["throughput"](best.batch, 0)  # type: ignore[operator]
            chosen[current[0], gpus_now[0], best.frozen] = replace(best, throughput=t0)
        return best

    orig_decision = simjobs.SimJob.on_decision

    def on_decision(self: simjobs.SimJob, d: Decision) -> None:
        orig_decision(self, d)
        c = chosen.get((self.job.name, d.gpus, d.frozen))
        if d.frozen == 0 or c is None or d.shared:
            return
        run_batch = self.batch_for(d.gpus, d.batch)[0]

        def gain(batch: int) -> float:
            t = self.truth
            f = t.throughput(gpus=d.gpus, batch=batch, frozen=d.frozen)
            return f / t.throughput(gpus=d.gpus, batch=batch, frozen=0)

        rows.append(
            f"| {self.job.name} | {self.run.progress:.2f} | {d.gpus} | {d.frozen} | {c.psi:.2f}"
            f" | {c.batch} | {c.throughput and (c.effective_progress / c.psi) / c.throughput:.2f}"
            f" | {gain(c.batch):.2f} | {run_batch} | {gain(run_batch):.2f} |"
        )

    estimate.Estimator.candidates = candidates  # type: ignore[method-assign]
    estimate.measured_or_predicted = mop  # type: ignore[assignment]
    estimate.tune = tune  # type: ignore[assignment]
    simjobs.SimJob.on_decision = on_decision  # type: ignore[method-assign]
    jobs = [TraceJob(f"j{i}", 600.0 * i, args.task, 1, default) for i in range(args.jobs)]
    for freeze in (False, True):
        opts = SimOptions(
            gpus=args.gpus, gpus_per_node=4, seed=args.seed, freeze=freeze,
            fixed_batch=args.batch == "paper",
        )  # fmt: skip
        rows.clear()
        res = Engine(jobs, make_policy(args.policy), settings=settings, options=opts).run()
        jct = [j.finish - j.submit for j in res.jobs if j.finish is not None]
        realloc = sum(j.reallocations for j in res.jobs)
        print(f"freeze {freeze}: avg JCT {statistics.fmean(jct):.0f} s, reallocations {realloc}")
        for name, trace in sorted(res.frozen.items()):
            print(f"  {name} frozen over time (s from submit, layers):",
                  [(round(t - jobs[int(name[1:])].submit_s), k) for t, k in trace])  # fmt: skip
    print("\nDecisions that froze (last run): predicted vs true throughput gain T(l)/T(0)")
    print("| job | progress | GPUs | l | psi | tuner batch | predicted | true there |"
          " batch run | true as run |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("oracle", "myopic", "toy"))
    ap.add_argument("--task", default="resnet18-cifar10")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", default="icefrog")
    ap.add_argument("--batch", choices=("paper", "tuned"), default="paper")
    ap.add_argument("--freezing", choices=("penalty", "freezeout"), default="penalty")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--tuner-batch", choices=("any", "run"), default="any")
    args = ap.parse_args()
    {"oracle": oracle, "myopic": myopic, "toy": toy}[args.what](args)


if __name__ == "__main__":
    main()
