"""Cost of the trainer's gradient accumulation and of the check that a registered object's
state loads with ``weights_only=True``, on the CPU, one process.

    .venv/bin/python -m benchmarks.accumulation

Speed: samples/s of the ResNet-style model of benchmarks.trainer (width --width, CIFAR-sized
random input, SGD with momentum) trained three ways, --rounds interleaved rounds of
--steps optimizer steps each, the best round of each kept:

- plain: a PyTorch loop accumulating by hand (loss / k, step and zero_grad every k
  micro-batches of m), no trainer;
- trainer k=1: the Trainer without a global batch at the per-GPU batch m (a step per
  micro-batch);
- trainer k: the Trainer with ``--global-batch k x m`` (k micro-steps an optimizer step,
  gradient hooks, held steps);
- trainer k, no hooks: the same without the gradient-scaling hooks (wrong gradients, k
  times too large: it only isolates what the hooks cost).

Check: milliseconds of ``checkpoint.check_loadable`` on a copy of the model's state_dict
(an EMA's state) against ``torch.save`` of the same state into memory, median of 5.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from benchmarks.models import resnet
from icefrog_launcher import checkpoint
from icefrog_launcher.config import JobConfig
from icefrog_launcher.trainer import Trainer


def _data(n: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, 10, (n,)))


def plain(args: argparse.Namespace, data: TensorDataset) -> Callable[[], float]:
    torch.manual_seed(0)
    model = resnet(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x_all, y_all = data.tensors
    m, k = args.batch, args.k

    def run() -> float:
        start = time.perf_counter()
        for step in range(args.steps):
            optimizer.zero_grad()
            for j in range(k):
                at = ((step * k + j) * m) % (len(data) - m)
                x, y = x_all[at : at + m], y_all[at : at + m]
                (F.cross_entropy(model(x), y) / k).backward()
            optimizer.step()
        return float(args.steps * k * m / (time.perf_counter() - start))

    return run


def trainer(
    args: argparse.Namespace, data: TensorDataset, k: int, workdir: str, hooks: bool = True
) -> Callable[[], float]:
    torch.manual_seed(0)
    model = resnet(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    m = args.batch
    config = JobConfig(
        batch=(m, m), workdir=workdir, global_batch=k * m if k > 1 else 0, max_epochs=10**6
    )
    t = Trainer(model, optimizer, data, config=config, env={}, stats_every=8)
    epochs = t.epochs()
    next(epochs)  # registers, applies the batch and k; the loop below is the user's
    if not hooks:
        t.accumulation.steps = 1  # watch() then removes the hooks; micro-steps stay k
        t.accumulation.watch([])
        t.accumulation.steps = k

    def run() -> float:
        start = time.perf_counter()
        done = 0
        while done < args.steps * k:
            t.position = 0
            for x, y in t.loader:
                optimizer.zero_grad()
                F.cross_entropy(t.model(x), y).backward()
                optimizer.step()
                done += 1
                if done == args.steps * k:
                    break
        return float(args.steps * k * m / (time.perf_counter() - start))

    return run


def check_cost(args: argparse.Namespace) -> tuple[float, float]:
    state = copy.deepcopy(resnet(args.width).state_dict())
    checks, saves = [], []
    for _ in range(5):
        start = time.perf_counter()
        checkpoint.check_loadable("ema", state)
        checks.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.save(state, io.BytesIO())
        saves.append(time.perf_counter() - start)
    return statistics.median(checks) * 1e3, statistics.median(saves) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32, help="per-GPU batch m")
    parser.add_argument("--k", type=int, default=4, help="micro-steps an optimizer step")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    data = _data(args.batch * args.k * 16)
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "plain": plain(args, data),
            "trainer k=1": trainer(args, data, 1, os.path.join(tmp, "k1")),
            f"trainer k={args.k}": trainer(args, data, args.k, os.path.join(tmp, "k")),
            f"k={args.k} no hooks": trainer(args, data, args.k, os.path.join(tmp, "n"), False),
        }
        for _ in range(args.rounds):
            for name, run in runs.items():
                best[name] = max(best.get(name, 0.0), run())
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    print(f"width {args.width}, m {args.batch}, k {args.k}, {args.steps} steps x {args.rounds}")
    for name, rate in best.items():
        print(f"{name:>14}: {rate:8.1f} samples/s ({rate / best['plain']:.3f} of plain)")
    check_ms, save_ms = check_cost(args)
    print(
        f"check_loadable of the model's state_dict: {check_ms:.3f} ms (torch.save {save_ms:.1f} ms)"
    )


if __name__ == "__main__":
    main()
