"""Print what the simulator's hidden ground truth does, for docs/simulator.md.

1. Work to the target when half / a quarter / three quarters of the layers are frozen at a
   given point of training (relative to unfrozen training), per task.
2. How well the core's DDP model (eq 4-7) learns each task's truth from noisy profile
   samples: fit on 60 % of a grid of (GPUs, batch, frozen), throughput APE on the rest
   against the noise-free truth.
3. Eq 3's psi against the true progress rate along a run frozen at 50 % of the work.

Usage: .venv/bin/python -m benchmarks.sim_truth [--seed N]
"""

from __future__ import annotations

import argparse

import numpy as np

from icefrog_slurm.core.fit import ape, fit_ddp_model
from icefrog_slurm.core.penalty import PenaltyTable
from icefrog_slurm.sim.calibration import shipped_calibration
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
            stats = run.observe_grad_stats(epoch=0)
            psi_obs = PenaltyTable(stats.grad_var).psi(run.frozen)
            psi = run.true_psi()
            print(
                f"| {run.progress:.2f} | {psi_obs:.3f} | {psi:.3f} | {t.progress_rate(psi):.3f} |"
            )
            printed = run.progress + 0.1
        run.advance(samples=step, global_batch=128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    all_truths = build_truths(shipped_catalog(), shipped_calibration(), seed=args.seed)
    inflation(all_truths, args.seed)
    learnability(all_truths, args.seed)
    psi_vs_truth(all_truths, args.seed)


if __name__ == "__main__":
    main()
