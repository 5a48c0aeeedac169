"""Fit the DDP throughput model (eq 5-7) to measured profiles and print its accuracy.

1. Pollux's measured unfrozen profiles (the repository's ``data/pollux/traces/{cifar10,
   imagenet}/placements.csv``: placement = per-node GPU counts, per-GPU batch, step time,
   the synchronisation part of it): fit on a seeded 75 % of the rows, report the absolute
   percentage error (APE) of the predicted throughput on the 25 % held back, and again
   holding back whole placements (configurations the fit never saw).
2. Synthetic recovery: profiles drawn from a known model with 5 % noise on each time; APE on
   held-back configurations against the noise-free truth and against noisy measurements.

Usage: .venv/bin/python -m benchmarks.fit_pollux [--data DIR] [--seeds N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks import POLLUX
from icefrog_slurm.core.fit import ape, fit_ddp_model
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.throughput import (
    DdpThroughputModel,
    FreezeParams,
    LinearCurve,
    SyncCurve,
)
from icefrog_slurm.sim.pollux import read_placements

ONE_LAYER = LayerTable.uniform(1)


def load_placements(path: Path) -> list[tuple[ProfileSample, int]]:
    """Rows as (sample, nodes): compute time = step - sync goes to t_bwd (no forward split)."""
    return read_placements(path.parent)


def evaluate(
    train: list[tuple[ProfileSample, int]], test: list[tuple[ProfileSample, int]]
) -> tuple[np.ndarray, float]:
    """(APE of throughput on ``test`` after fitting ``train``, fit seconds)."""
    start = time.perf_counter()
    model = fit_ddp_model([s for s, _ in train], ONE_LAYER, nodes=[n for _, n in train])
    seconds = time.perf_counter() - start
    predicted = [
        model.throughput(gpus=s.gpus, batch=s.batch, frozen=0, layers=ONE_LAYER, nodes=n)
        for s, n in test
    ]
    return ape(predicted, [s.samples_per_s for s, _ in test]), seconds


def pollux(data: Path, seeds: int) -> None:
    print(f"Pollux placements.csv, throughput APE on held-back rows ({seeds} seeds pooled):")
    print("| workload | rows | held back | mean APE % | median % | p95 % | max APE % | fit s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for app in ("cifar10", "imagenet"):
        rows = load_placements(data / app / "placements.csv")
        for mode in ("25% of rows", "25% of (GPUs, nodes) pairs"):
            results = []
            for seed in range(seeds):
                rng = np.random.default_rng(seed)
                if mode == "25% of rows":
                    held = set(rng.permutation(len(rows))[: len(rows) // 4].tolist())
                    test = [r for i, r in enumerate(rows) if i in held]
                    train = [r for i, r in enumerate(rows) if i not in held]
                else:
                    labels = sorted({_label(s, n) for s, n in rows})
                    out = set(rng.permutation(labels)[: len(labels) // 4].tolist())
                    test = [r for r in rows if _label(*r) in out]
                    train = [r for r in rows if _label(*r) not in out]
                results.append(evaluate(train, test))
            e = np.concatenate([r[0] for r in results])
            secs = np.mean([r[1] for r in results])
            print(
                f"| {app} | {len(rows)} | {mode} | {e.mean():.1f} | {np.median(e):.1f} |"
                f" {np.percentile(e, 95):.1f} | {e.max():.1f} | {secs:.2f} |"
            )


def _label(sample: ProfileSample, nodes: int) -> str:
    return f"{sample.gpus}/{nodes}"


TRUE = DdpThroughputModel(
    forward=LinearCurve(0.004, 0.0002),
    backward=LinearCurve(0.008, 0.0004),
    sync=SyncCurve(0.02, 0.002, 0.06, 0.006),
    freeze=FreezeParams(alpha_flop=0.01, gamma_flop=0.7, alpha_sync=0.005, gamma=2.0),
)
SYN_LAYERS = LayerTable(
    flops=tuple(float(x) for x in np.linspace(2.0, 1.0, 20)),
    param_bytes=tuple(float(x) for x in np.linspace(0.2, 3.0, 20)),
)


def _draw(rng: np.random.Generator, noise: float, g: int, m: int, k: int) -> ProfileSample:
    """A profile of the known model with Gaussian noise of ``noise`` on each time."""
    f = 1 + noise * rng.standard_normal(3)
    return TRUE.profile_sample(
        gpus=g, batch=m, frozen=k, layers=SYN_LAYERS, noise=(f[0], f[1], f[2])
    )


def synthetic(seeds: int, noise: float = 0.05) -> None:
    configs = [
        (g, m, k)
        for g in (1, 2, 4, 8, 16)
        for m in (16, 32, 64, 128, 256)
        for k in (0, 4, 8, 12, 16)
    ]
    vs_truth, vs_obs = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)

        order = rng.permutation(len(configs))
        held = [configs[i] for i in order[:25]]
        model = fit_ddp_model([_draw(rng, noise, *configs[i]) for i in order[25:]], SYN_LAYERS)
        pred = [model.throughput(gpus=g, batch=m, frozen=k, layers=SYN_LAYERS) for g, m, k in held]
        truth = [TRUE.throughput(gpus=g, batch=m, frozen=k, layers=SYN_LAYERS) for g, m, k in held]
        vs_truth.append(ape(pred, truth))
        vs_obs.append(ape(pred, [_draw(rng, noise, *c).samples_per_s for c in held]))
    t, o = np.concatenate(vs_truth), np.concatenate(vs_obs)
    print(
        f"\nSynthetic recovery ({seeds} seeds, {len(configs) - 25} configurations fitted,"
        f" 25 held back, {noise:.0%} noise on t_fwd, t_bwd, t_iter):"
    )
    print("| compared with | mean APE % | max APE % |")
    print("| --- | ---: | ---: |")
    print(f"| noise-free truth | {t.mean():.1f} | {t.max():.1f} |")
    print(f"| noisy measurement | {o.mean():.1f} | {o.max():.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=POLLUX / "traces")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    pollux(args.data, args.seeds)
    synthetic(args.seeds)


if __name__ == "__main__":
    main()
