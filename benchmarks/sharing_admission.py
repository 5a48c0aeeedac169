"""The sharing rule (eq 8) against the simulator's truth: which pairs it admits, and what the
truth gives those pairs.

For every task a simulated job may share a GPU with (DDP, one GPU legal) and two
configurations of each (its default per-GPU batch with nothing frozen, and with about half
its layers frozen, as the paper's MobileNetV2 motivation pair), every unordered pair of
two such jobs on one GPU (a job with itself included):

- utilisation: what the job's profiler reports in expectation (the truth's busy share; the
  reports add zero-mean noise), and the peak memory;
- admitted: ``sum(memory) x 1.1 <= 80 GB`` and ``sum(lambda x util) <= 1``
  (``core.sharing.credited_util``) for lambda = 1 (eq 8 word for word) and the given
  ``--lambdas`` (the solver's ``sharing.speed_factor``);
- the truth's combined speed-up: the two jobs' shared speeds added (each relative to the
  job alone on the GPU): > 1 means running them together beats one after the other.

Prints a summary (pairs by the truth's combined speed-up, admitted or not at each lambda),
the MobileNetV2 pairs, and with ``--all`` every pair.

Usage:
    .venv/bin/python -m benchmarks.sharing_admission [--seed 1] [--lambdas 0.9,0.7] [--all]
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

from icefrog_slurm.core.parallelism import DDP
from icefrog_slurm.core.sharing import DEFAULT_MEMORY_SAFETY, credited_util
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.truth import GPU_MEMORY_BYTES, TaskTruth, build_truths

BINS = ((0.0, 1.0), (1.0, 1.2), (1.2, 1.5), (1.5, 99.0))


@dataclass(frozen=True)
class Config:
    task: str
    truth: TaskTruth
    batch: int
    frozen: int

    @property
    def util(self) -> float:
        return self.truth.utilisation(batch=self.batch, frozen=self.frozen)

    @property
    def memory(self) -> float:
        return self.truth.memory(batch=self.batch, frozen=self.frozen)

    @property
    def label(self) -> str:
        return f"{self.task} m={self.batch} l={self.frozen}/{self.truth.layers.num_layers}"


def configs(seed: int) -> list[Config]:
    catalog = shipped_catalog()
    out = []
    for name, truth in sorted(build_truths(catalog, shipped_calibration(), seed=seed).items()):
        task = catalog.get(name)
        if task.min_gpus != 1 or task.parallelism != DDP:
            continue
        layers = truth.layers
        legal = layers.candidates(layers.max_frozen_from_fraction(0.9))
        half = min(legal, key=lambda k: (abs(k - layers.num_layers / 2), k))
        for frozen in (0, half):
            out.append(Config(name, truth, task.default_batch, frozen))
    return out


def combined(a: Config, b: Config) -> float:
    """The truth's speed of a and of b on one GPU together, added (1 = one after the other)."""
    sa = a.truth.shared_speed(
        batch=a.batch, frozen=a.frozen, partners=[(b.truth, b.batch, b.frozen)]
    )
    sb = b.truth.shared_speed(
        batch=b.batch, frozen=b.frozen, partners=[(a.truth, a.batch, a.frozen)]
    )
    return sa + sb


def admitted(a: Config, b: Config, lam: float) -> bool:
    memory_ok = (a.memory + b.memory) * DEFAULT_MEMORY_SAFETY <= GPU_MEMORY_BYTES
    return memory_ok and credited_util(a.util, lam) + credited_util(b.util, lam) <= 1.0 + 1e-12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="seed of the hidden truth (1)")
    ap.add_argument("--lambdas", default="0.9,0.7", help="speed factors besides 1 (0.9,0.7)")
    ap.add_argument("--all", action="store_true", help="print every pair")
    args = ap.parse_args()
    lams = (1.0, *(float(x) for x in args.lambdas.split(",") if x))
    cfgs = configs(args.seed)
    pairs = [
        (a, b, a.util + b.util, combined(a, b))
        for a, b in itertools.combinations_with_replacement(cfgs, 2)
    ]
    print(f"truth seed {args.seed}: {len(cfgs)} configurations, {len(pairs)} pairs")
    heads = " | ".join(f"admitted at lambda {lam:g}" for lam in lams)
    print(f"\n| truth's combined speed-up | pairs | util sum (min-max) | {heads} |")
    print("| --- | ---: | --- |" + " ---: |" * len(lams))
    for lo, hi in BINS:
        got = [p for p in pairs if lo <= p[3] < hi]
        if not got:
            continue
        sums = [p[2] for p in got]
        counts = " | ".join(str(sum(admitted(a, b, lam) for a, b, _, _ in got)) for lam in lams)
        span = f"{lo:g}-{hi:g}x" if hi < 99 else f">= {lo:g}x"
        print(f"| {span} | {len(got)} | {min(sums):.2f}-{max(sums):.2f} | {counts} |")
    shown = [p for p in pairs if args.all or p[0].task == p[1].task == "mobilenetv2-cifar10"]
    print("\n| pair | util | util sum | memory GB | truth's combined speed-up | " + heads + " |")
    print("| --- | --- | ---: | ---: | ---: |" + " --- |" * len(lams))
    for a, b, total, gain in shown:
        mem = (a.memory + b.memory) / 1e9
        marks = " | ".join("yes" if admitted(a, b, lam) else "no" for lam in lams)
        print(
            f"| {a.label} + {b.label} | {a.util:.2f} + {b.util:.2f} | {total:.2f} | {mem:.1f} "
            f"| {gain:.2f}x | {marks} |"
        )


if __name__ == "__main__":
    main()
