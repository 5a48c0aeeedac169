"""Benchmark of the Model Trainer on the CPU: step time versus frozen layers for a small
ResNet-style model, the backward-time model of spec eq 6 fitted to it, and the cost of the
gradient statistics.

    .venv/bin/python -m benchmarks.trainer                        # one process
    .venv/bin/torchrun --nproc-per-node 2 --standalone -m benchmarks.trainer --skip-sweep

Eq 6: T_bwd(l) = a_flop + b_flop * theta_l ** g_flop * T_bwd(0), theta_l the unfrozen share
of the FLOPs (measured by torch.utils.flop_counter on the model), fitted with
scipy.optimize.least_squares; APE = |fit - measured| / measured per frozen count.
Timings are the trainer's own (forward; backward to the last gradient; exposed sync),
averaged over --steps steps after 3 warm-up steps, per frozen count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch
from scipy.optimize import least_squares
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from benchmarks.models import resnet
from icefrog_launcher.config import JobConfig
from icefrog_launcher.trainer import Trainer


def make_trainer(args: argparse.Namespace, workdir: str) -> Trainer:
    torch.manual_seed(0)
    n = args.batch * 64
    data = TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))
    model = resnet(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    config = JobConfig(batch=(args.batch, args.batch), max_frozen=1.0, workdir=workdir)
    return Trainer(
        model, optimizer, data, config=config, env=dict(os.environ), stats_every=0, profile_every=1
    )


def run_steps(trainer: Trainer, steps: int) -> float:
    """Train ``steps`` steps through the trainer's loader; return the wall time."""
    start = time.perf_counter()
    done = 0
    while done < steps:
        trainer.position = 0
        for x, y in trainer.loader:
            trainer.optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()
            trainer.optimizer.step()
            done += 1
            if done == steps:
                break
    return time.perf_counter() - start


def sweep(trainer: Trainer, steps: int, repeats: int) -> list[tuple[int, float, dict[str, float]]]:
    """Per frozen count, the trainer's mean timings; over ``repeats`` interleaved sweeps the
    smallest mean of each part (the machine is shared: interference only adds time)."""
    best: dict[int, dict[str, float]] = {}
    for _ in range(repeats):
        for frozen in range(trainer.table.num_layers):
            trainer.set_frozen(frozen)
            run_steps(trainer, 3)
            trainer.timer.take()
            run_steps(trainer, steps)
            means = trainer.timer.take()
            assert means is not None
            old = best.get(frozen, means)
            best[frozen] = {k: min(v, old[k]) for k, v in means.items()}
    return [(f, trainer.table.theta(f), best[f]) for f in sorted(best)]


def fit_eq6(thetas: np.ndarray, t_bwd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """T_bwd(l) = a + b * theta_l**g * T_bwd(0)   (spec eq 6); returns (a, b, g), APE."""

    def residual(p: np.ndarray) -> np.ndarray:
        return (p[0] + p[1] * thetas ** p[2] * t_bwd[0] - t_bwd) / t_bwd

    fit = least_squares(residual, x0=[0.0, 1.0, 1.0], bounds=([0, 0, 0.05], [np.inf, 10, 5]))
    return fit.x, np.abs(residual(fit.x))


class _Clock:
    """Seconds spent inside the statistics code (wraps the collector's two entry points)."""

    def __init__(self, trainer: Trainer) -> None:
        self.seconds = 0.0
        for name in ("finish_step", "add_local"):
            inner = getattr(trainer.stats, name)
            setattr(trainer.stats, name, self._timed(inner))

    def _timed(self, inner: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return call


def overhead(trainer: Trainer, steps: int, rounds: int) -> dict[str, float]:
    """Statistics cost two ways: A/B median step time with statistics every k steps
    (k = 0: off), interleaved; and the time measured inside the statistics code / the
    step time with k = 8 (robust to the noise of a shared machine)."""
    trainer.set_frozen(0)
    clock = _Clock(trainer)
    times: dict[int, list[float]] = {0: [], 8: [], 1: []}
    inside: list[float] = []
    run_steps(trainer, 5)
    for _ in range(rounds):
        for every in times:
            trainer.stats.every = every
            clock.seconds = 0.0
            wall = run_steps(trainer, steps)
            times[every].append(wall / steps)
            if every == 8:
                inside.append(clock.seconds / wall)
    trainer.stats.every = 0
    out = {f"step_{k}": statistics.median(v) for k, v in times.items()}
    out["inside_8"] = statistics.median(inside)
    return out


def print_sweep(trainer: Trainer, args: argparse.Namespace) -> None:
    rows = sweep(trainer, args.steps, args.repeats)
    thetas = np.array([r[1] for r in rows])
    t_bwd = np.array([r[2]["bwd"] for r in rows])
    (a, b, g), ape = fit_eq6(thetas, t_bwd)
    if trainer.rank != 0:
        return
    print(
        f"ResNet-style, {trainer.table.num_layers} layers, batch {args.batch}, width "
        f"{args.width}, {trainer.world} process(es), {args.threads} thread(s)"
    )
    print("| frozen l | theta_l | fwd ms | bwd ms | eq 6 fit ms | APE % | iter ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for (frozen, theta, m), err in zip(rows, ape, strict=True):
        fit = a + b * theta**g * t_bwd[0]
        cells = [m["fwd"] * 1e3, m["bwd"] * 1e3, fit * 1e3, err * 100, m["iter"] * 1e3]
        print(f"| {frozen} | {theta:.3f} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    print(
        f"eq 6 fit: a_flop={a * 1e3:.2f} ms b_flop={b:.3f} g_flop={g:.3f}; "
        f"APE max {ape.max() * 100:.1f}% mean {ape.mean() * 100:.1f}%"
    )


def print_overhead(trainer: Trainer, args: argparse.Namespace) -> None:
    cost = overhead(trainer, args.steps, args.rounds)
    if trainer.rank != 0:
        return
    base, k8, k1 = cost["step_0"], cost["step_8"], cost["step_1"]
    print(
        f"{trainer.world} process(es); median step time, statistics off: {base * 1e3:.1f} ms; "
        f"every 8 steps (default): {k8 * 1e3:.1f} ms ({(k8 / base - 1) * 100:+.1f}%); "
        f"every step: {k1 * 1e3:.1f} ms ({(k1 / base - 1) * 100:+.1f}%)"
    )
    print(f"time inside the statistics code, every 8 steps: {cost['inside_8'] * 100:.2f}% of steps")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as workdir:
        trainer = make_trainer(args, workdir)
        if not args.skip_sweep:
            print_sweep(trainer, args)
        print_overhead(trainer, args)


if __name__ == "__main__":
    main()
