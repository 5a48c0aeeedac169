"""Print what the simulator's hidden ground truth does, for docs/simulator.md.

1. Work to the target when half / a quarter / three quarters of the layers are frozen at a
   given point of training (relative to unfrozen training), per task.
2. How well the core's DDP model (eq 4-7) learns each task's truth from noisy profile
   samples: fit on 60 % of a grid of (GPUs, batch, frozen), throughput APE on the rest
   against the noise-free truth.
3. Eq 3's psi against the true progress rate along a run frozen at 50 % of the work.
4. Statistical efficiency of a larger global batch, per task: the truth's (samples to the
   target at the task's smallest calibrated batch M0 over those at M, the calibrated
   convergence curve) against Pollux's formula (``core/goodput.py``) on the gradient
   statistics the simulated jobs report (their mean over 200 reports at a run's start),
   what the goodput tuners (ICEFROG's default, Pollux+) choose a batch by.

Usage: .venv/bin/python -m benchmarks.sim_truth [--seed N]
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

import numpy as np

from icefrog_slurm.core.fit import ape, fit_ddp_model
from icefrog_slurm.core.goodput import efficiency
from icefrog_slurm.core.penalty import PenaltyTable
from icefrog_slurm.sim.calibration import TaskCalibration, shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.truth import TaskTruth, build_truths


def needed(t: TaskTruth, freeze_at: float | None, fraction: float, seed: int) -> float:
    run, used = t.start_run(seed=seed), 0.0
    step = t.samples_to_target(t.task.default_batch) / 400
    frozen = int(fraction * t.layers.num_layers)
    while not run.reached:
        if freeze_at is not None and run.frozen == 0 and run.progress >= freeze_at:
            run.set_frozen(frozen)
        run.advance(samples=step, global_batch=t.task.default_batch)
        used += step
    return used


def inflation(all_truths: dict[str, TaskTruth], seed: int) -> None:
    print("Samples to the target relative to unfrozen (same job), freezing at progress p:")
    print("| task | frozen | p = 0.02 | p = 0.2 | p = 0.5 | p = 0.8 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, t in all_truths.items():
        base = needed(t, None, 0.0, seed)
        for fraction in (0.25, 0.5, 0.75):
            cells = [needed(t, p, fraction, seed) / base for p in (0.02, 0.2, 0.5, 0.8)]
            print(f"| {name} | {fraction:.0%} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


def learnability(all_truths: dict[str, TaskTruth], seed: int) -> None:
    print("\nCore DDP model fitted to noisy truth profiles, APE on held-out configurations:")
    print("| task | fitted | held out | mean APE % | max APE % | speedup at 75 % frozen, 8 GPUs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, t in all_truths.items():
        rng = np.random.default_rng(seed)
        n = t.layers.num_layers
        depths = sorted({0, n // 4, n // 2, (3 * n) // 4, int(0.9 * n)})
        grid = [(g, m, k) for g in (1, 2, 4, 8, 16) for m in t.task.batch_sizes() for k in depths]
        order = rng.permutation(len(grid))
        cut = int(0.6 * len(grid))
        train, test = [grid[i] for i in order[:cut]], [grid[i] for i in order[cut:]]
        obs = [t.observe_profile(rng, gpus=g, batch=m, frozen=k) for g, m, k in train]
        model = fit_ddp_model(obs, t.layers)
        pred = [model.throughput(gpus=g, batch=m, frozen=k, layers=t.layers) for g, m, k in test]
        true = [t.throughput(gpus=g, batch=m, frozen=k) for g, m, k in test]
        e = ape(pred, true)
        m0 = t.task.default_batch
        speedup = t.throughput(gpus=8, batch=m0, frozen=(3 * n) // 4) / t.throughput(
            gpus=8, batch=m0, frozen=0
        )
        print(f"| {name} | {len(train)} | {len(test)} | {e.mean():.1f} | {e.max():.1f} |"
              f" {speedup:.2f}x |")  # fmt: skip


def psi_vs_truth(all_truths: dict[str, TaskTruth], seed: int) -> None:
    print("\nResNet18: eq 3 psi from observed statistics vs the true progress rate, 50 % frozen")
    print("at progress 0.3 (one row per 10 % of the work):")
    print("| progress | psi (observed stats) | psi (true variances) | true progress rate |")
    print("| ---: | ---: | ---: | ---: |")
    t = all_truths["resnet18-cifar10"]
    run = t.start_run(seed=seed)
    step = t.samples_to_target(128) / 1000
    printed = 0.0
    while not run.reached:
        if run.frozen == 0 and run.progress >= 0.3:
            run.set_frozen(t.layers.num_layers // 2)
        if run.frozen and run.progress >= printed:
            stats = run.observe_grad_stats(epoch=0, base_batch=128)
            psi_obs = PenaltyTable(stats.grad_var).psi(run.frozen)
            psi = run.true_psi()
            print(
                f"| {run.progress:.2f} | {psi_obs:.3f} | {psi:.3f} | {t.progress_rate(psi):.3f} |"
            )
            printed = run.progress + 0.1
        run.advance(samples=step, global_batch=128)


SCALES = (2, 4, 8, 16, 32)


def batch_efficiency(
    all_truths: dict[str, TaskTruth], calibration: Mapping[str, TaskCalibration], seed: int
) -> None:
    print("\nEfficiency of M = s x M0 (1 at M0): the truth's / the reported statistics'")
    print("(their mean over 200 reports at the start of a run):")
    print("| task | M0 | " + " | ".join(f"s = {s}" for s in SCALES) + " |")
    print("| --- | ---: | " + " | ".join("---" for _ in SCALES) + " |")
    for name, t in sorted(all_truths.items()):
        m0 = float(calibration[name].batches[0])
        run = t.start_run(seed=seed)
        reports = [run.observe_grad_stats(epoch=0, base_batch=int(m0)) for _ in range(200)]
        var = float(np.mean([sum(r.grad_var) for r in reports]))
        sqr = float(np.mean([sum(r.grad_sqr) for r in reports]))
        cells = []
        for s in SCALES:
            truth = t.samples_to_target(m0) / t.samples_to_target(s * m0)
            reported = efficiency(var=var, sqr=sqr, batch=s * m0, base_batch=m0)
            cells.append(f"{truth:.2f} / {reported:.2f}")
        print(f"| {name} | {m0:.0f} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    calibration = shipped_calibration()
    all_truths = build_truths(shipped_catalog(), calibration, seed=args.seed)
    inflation(all_truths, args.seed)
    learnability(all_truths, args.seed)
    psi_vs_truth(all_truths, args.seed)
    batch_efficiency(all_truths, calibration, args.seed)


if __name__ == "__main__":
    main()
