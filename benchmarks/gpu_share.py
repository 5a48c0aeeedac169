"""Two training processes on one CUDA GPU: does eq 8's admissibility rule hold on a real card?

Spec section 8: a pair may share a GPU when their predicted peak memories (x 1.1) fit the
card and their GPU utilisations sum to at most 100 %; the scheduler then counts each at
lambda = 0.9 of its exclusive speed. This measures, per pair of ResNet-style CIFAR-size jobs
(``benchmarks/models.py``, the trainer benchmark's model; random data already on the GPU, SGD):

- each job alone: samples/s, NVML utilisation (``torch.cuda.utilization``, sampled every
  0.1 s while it trains) and peak memory (``torch.cuda.max_memory_allocated``);
- both at once, as two processes (what Slurm's shard GRES gives two jobs): each one's
  samples/s, and its ratio to alone (the real lambda);
- eq 8's verdict from the alone figures, beside the measured lambdas.

    .venv/bin/python -m benchmarks.gpu_share --seconds 8    # needs CUDA; prints a markdown table
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import threading
import time
from typing import Any

import torch
from torch.nn import functional as F

from benchmarks.models import resnet

SAFETY = 1.1  # eq 8's memory safety factor


def train(width: int, batch: int, seconds: float, go: Any, out: Any) -> None:
    """One job: warm up, meet the others at the barrier ``go``, train for ``seconds``, put
    (samples/s, peak bytes)."""
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    model = resnet(width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    go.wait()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
        if steps % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    out.put((steps * batch / wall, float(torch.cuda.max_memory_allocated())))


def phase(jobs: list[tuple[int, int]], seconds: float) -> tuple[list[tuple[float, float]], float]:
    """Run ``jobs`` (width, batch) at once; their (samples/s, peak bytes) and the median
    NVML utilisation while they trained."""
    ctx = mp.get_context("spawn")
    go = ctx.Barrier(len(jobs) + 1)
    queues = [ctx.Queue() for _ in jobs]
    procs = [
        ctx.Process(target=train, args=(w, b, seconds, go, q))
        for (w, b), q in zip(jobs, queues, strict=True)
    ]
    for p in procs:
        p.start()
    go.wait(timeout=300)  # every job built and warmed up (CUDA context, cuDNN autotune)
    samples: list[int] = []
    stop = threading.Event()

    def sample_util() -> None:
        while not stop.is_set():
            samples.append(torch.cuda.utilization())
            time.sleep(0.1)

    sampler = threading.Thread(target=sample_util)
    sampler.start()
    results = [q.get(timeout=seconds + 120) for q in queues]
    stop.set()
    sampler.join()
    for p in procs:
        p.join()
    util = statistics.median(samples[len(samples) // 5 :]) / 100 if samples else -1.0
    return results, util


def _job(text: str) -> tuple[int, int]:
    width, batch = text.split("x")
    return int(width), int(batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--pairs", default="16x32+16x32,32x64+64x128,64x128+64x128,64x256+64x256")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_share: needs CUDA")
    card = torch.cuda.get_device_properties(0).total_memory
    print(f"{torch.cuda.get_device_name(0)}, {card / 1e9:.0f} GB, torch {torch.__version__}")
    print(
        "| pair (width x batch) | alone samples/s | alone util | alone peak GB | eq 8 admits? "
        "| shared samples/s | measured lambda |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    alone: dict[tuple[int, int], tuple[float, float, float]] = {}  # rate, util, peak
    for pair in args.pairs.split(","):
        jobs = [_job(text) for text in pair.split("+")]
        for job in jobs:
            if job not in alone:
                [(rate, peak)], util = phase([job], args.seconds)
                alone[job] = (rate, util, peak)
        together, util_both = phase(jobs, args.seconds)
        figures = [alone[j] for j in jobs]
        utils = sum(f[1] for f in figures)
        memory = SAFETY * sum(f[2] for f in figures)
        admits = utils <= 1.0 and memory <= card
        lambdas = [t[0] / f[0] for t, f in zip(together, figures, strict=True)]
        print(
            f"| {pair} | {' / '.join(f'{f[0]:.0f}' for f in figures)} "
            f"| {' / '.join(f'{f[1]:.2f}' for f in figures)} (sum {utils:.2f}) "
            f"| {' / '.join(f'{f[2] / 1e9:.2f}' for f in figures)} "
            f"| {'yes' if admits else 'no'} "
            f"| {' / '.join(f'{t[0]:.0f}' for t in together)} (util {util_both:.2f}) "
            f"| {' / '.join(f'{v:.2f}' for v in lambdas)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
