"""Epoch time of the elastic loader (icefrog_launcher.data) against a plain
``torch.utils.data.DataLoader`` with the same workers and batch.

    .venv/bin/python -m benchmarks.data_loading
    .venv/bin/python -m benchmarks.data_loading --samples 2048 --batch 32 --io-ms 1.5 \\
        --workers 0 4 --epochs 9 --threads 1

I/O-bound: each ``__getitem__`` sleeps ``--io-ms`` (a read from disk or the network) and
returns a CIFAR-sized sample; one epoch = one full pass of one replica, worker start
included (and without it: persistent workers, from the second epoch on). In memory: a
``TensorDataset`` of ``--tensor-samples`` CIFAR-sized samples, no workers, read by the
elastic loader's direct path (one gather a tensor), by a plain DataLoader, and by the
elastic loader through its DataLoader. The loaders take turns, an epoch each, so that a
shared machine's load falls on all of them alike: epoch times are medians of ``--epochs``
epochs, ratios the median of each turn's ratio (elastic / plain).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate

from icefrog_launcher.data import ElasticDataLoader
from icefrog_launcher.position import DataPosition

SHAPE = (3, 32, 32)


class SlowReads(Dataset[tuple[torch.Tensor, int]]):
    """``size`` samples, each taking ``io_s`` seconds to read (sleeping: no CPU used)."""

    def __init__(self, size: int, io_s: float) -> None:
        self.size, self.io_s = size, io_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.io_s)
        return torch.full(SHAPE, float(index)), index % 10


def epoch_seconds(loader: Iterable[Any]) -> float:
    start = time.perf_counter()
    for batch in loader:
        batch[0].sum()  # the loop touches its batch
    return time.perf_counter() - start


def elastic(dataset: Any, batch: int, **loader_args: Any) -> Callable[[], Iterable[Any]]:
    """An epoch of the elastic loader, one replica, its position at the epoch start."""
    at = DataPosition(batch=batch)
    loader = ElasticDataLoader(dataset, at, loader_args=loader_args)

    def epoch() -> Iterable[Any]:
        at.epoch, at.samples = at.epoch + 1, 0
        return loader

    return epoch


def plain(dataset: Any, batch: int, **loader_args: Any) -> Callable[[], Iterable[Any]]:
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, **loader_args)
    return lambda: loader


def epoch_times(
    loaders: dict[str, Callable[[], Iterable[Any]]], epochs: int
) -> dict[str, list[float]]:
    """Epoch seconds of each loader; they take turns, one epoch each, in a rotating order
    (no loader always runs first)."""
    times: dict[str, list[float]] = {name: [] for name in loaders}
    names = list(loaders)
    for n in range(epochs):
        for name in names[n % len(names) :] + names[: n % len(names)]:
            times[name].append(epoch_seconds(loaders[name]()))
    return times


def ratio(times: dict[str, list[float]], name: str, base: str) -> float:
    """Median over the turns of name's epoch time over base's in the same turn."""
    return statistics.median(a / b for a, b in zip(times[name], times[base], strict=True))


def io_bound(args: argparse.Namespace) -> None:
    data = SlowReads(args.samples, args.io_ms / 1e3)
    print(
        f"I/O-bound: {args.samples} samples of {args.io_ms} ms each, batch {args.batch}, "
        f"median of {args.epochs} epochs"
    )
    print("| workers | persistent | plain DataLoader s | elastic s | elastic / plain |")
    print("|---:|---|---:|---:|---:|")
    for workers in args.workers:
        for persistent in (False, True) if workers else (False,):
            extra: dict[str, Any] = {"num_workers": workers}
            if persistent:
                extra["persistent_workers"] = True
            loaders = {
                "plain": plain(data, args.batch, **extra),
                "elastic": elastic(data, args.batch, **extra),
            }
            if persistent:  # start the workers before timing
                epoch_times(loaders, 1)
            times = epoch_times(loaders, args.epochs)
            t = {name: statistics.median(v) for name, v in times.items()}
            print(
                f"| {workers} | {'yes' if persistent else 'no'} | {t['plain']:.3f} | "
                f"{t['elastic']:.3f} | {ratio(times, 'elastic', 'plain'):.3f} |"
            )


def in_memory(args: argparse.Namespace) -> None:
    n = args.tensor_samples
    data = TensorDataset(torch.randn(n, *SHAPE), torch.randint(0, 10, (n,)))
    loaders = {
        "direct": elastic(data, args.batch),
        "plain": plain(data, args.batch),
        "through": elastic(data, args.batch, collate_fn=default_collate),
    }
    times = epoch_times(loaders, args.epochs)
    t = {name: statistics.median(v) for name, v in times.items()}
    print(
        f"In memory: TensorDataset of {n} samples {SHAPE}, batch {args.batch}, no workers, "
        f"median of {args.epochs} epochs"
    )
    print("| loader | epoch s | / plain DataLoader |")
    print("|---|---:|---:|")
    for name, label in (
        ("plain", "plain DataLoader"),
        ("through", "elastic through its DataLoader"),
        ("direct", "elastic, TensorDataset indexed in one go"),
    ):
        print(f"| {label} | {t[name]:.3f} | {ratio(times, name, 'plain'):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--io-ms", type=float, default=1.5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--tensor-samples", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    # the workers mostly sleep: more of them than cores is the point, not a mistake
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    io_bound(args)
    in_memory(args)


if __name__ == "__main__":
    main()
