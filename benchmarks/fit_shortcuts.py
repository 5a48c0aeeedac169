"""How far the throughput fits' shortcuts move their answers, in a simulation.

Every fit (``core.fit.fit_params``: the DDP model's and the large models') takes three
shortcuts, each meant to end at the same minimum, none bit for bit:

- ``finite``: the DDP fit is given the model's analytic Jacobian
  (``DdpThroughputModel.gradients``); the reference differentiates by finite differences;
- ``cold``: a refit solves once from the job's last fit (``warm``); the reference solves
  from the cold fit's starts;
- ``unscreened``: a cold fit with several starts solves each to ``fit.SCREEN_TOLERANCE``
  and only those within ``fit.SCREEN_MARGIN`` of the best on to full tolerance; the
  reference solves every start to full tolerance.

This runs one simulation (its fits take every shortcut, as ``icefrog simulate``'s do) and
solves each fit a shortcut touched a second time without it (``--without``), then prints
over those fits: how many, the ratio of the fit's final cost (0.5 x squared residuals, the
prior included) to the reference's (median, min, max, how many above 1.01 and below 0.99),
and the CPU seconds of the fits with and without the shortcut.

Usage (the 48-GPU 1x trace of docs/evaluation.md):
    .venv/bin/icefrog trace sample --load 1 --seed 1 --out W1.csv
    .venv/bin/python -m benchmarks.fit_shortcuts --workload W1.csv --gpus 48 \\
        --policy icefrog --without cold,unscreened,finite
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from icefrog_slurm.commands.simulate import make_policy
from icefrog_slurm.core import fit, parallel_fit
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import read_workload

SHORTCUTS = ("finite", "cold", "unscreened")


@contextmanager
def _unscreened() -> Iterator[None]:
    """Every start solved to scipy's default tolerance (1e-8), all of them solved on."""
    tolerance, margin = fit.SCREEN_TOLERANCE, fit.SCREEN_MARGIN
    fit.SCREEN_TOLERANCE, fit.SCREEN_MARGIN = 1e-8, math.inf
    try:
        yield
    finally:
        fit.SCREEN_TOLERANCE, fit.SCREEN_MARGIN = tolerance, margin


def _touched(shortcut: str, kwargs: dict[str, Any]) -> bool:
    if shortcut == "finite":
        return kwargs.get("jacobian") is not None
    if shortcut == "cold":
        return kwargs.get("warm") is not None
    return kwargs.get("warm") is None and bool(kwargs.get("starts"))


def _reference(shortcut: str, real: Callable[..., fit.FitResult], args: Any, kwargs: Any) -> Any:
    if shortcut == "finite":
        return real(*args, **{**kwargs, "jacobian": None})
    if shortcut == "cold":
        return real(*args, **{**kwargs, "warm": None})
    with _unscreened():
        return real(*args, **kwargs)


class Compared:
    """While on, each fit a shortcut touched is solved again without it."""

    def __init__(self, shortcut: str) -> None:
        self.shortcut = shortcut
        self.ratios: list[float] = []
        self.cpu_with = self.cpu_without = 0.0
        self._real = fit.fit_params

    def __enter__(self) -> Compared:
        real = self._real

        def both(*args: Any, **kwargs: Any) -> fit.FitResult:
            start = time.process_time()
            result = real(*args, **kwargs)
            middle = time.process_time()
            if _touched(self.shortcut, kwargs):
                reference = _reference(self.shortcut, real, args, kwargs)
                self.cpu_with += middle - start
                self.cpu_without += time.process_time() - middle
                self.ratios.append(result.cost / reference.cost if reference.cost else 1.0)
            return result

        fit.fit_params = parallel_fit.fit_params = both  # type: ignore[attr-defined]
        return self

    def __exit__(self, *_exc: object) -> None:
        fit.fit_params = parallel_fit.fit_params = self._real  # type: ignore[attr-defined]


def summary(c: Compared) -> str:
    if not c.ratios:
        return f"without {c.shortcut}: no fit took this shortcut"
    r = np.asarray(c.ratios, dtype=float)
    return (
        f"without {c.shortcut}: {len(r)} fits; cost / reference cost median "
        f"{np.median(r):.5f}, min {r.min():.5f}, max {r.max():.5f}; above 1.01: "
        f"{int((r > 1.01).sum())}, below 0.99: {int((r < 0.99).sum())}; fit CPU s "
        f"{c.cpu_with:.1f} with the shortcut, {c.cpu_without:.1f} without"
    )


def run(workload: Path, gpus: int, policy: str, seed: int, shortcut: str) -> Compared:
    jobs = read_workload(workload, shipped_catalog())
    opts = SimOptions(gpus=gpus, seed=seed, fixed_batch=policy != "pollux+")
    with Compared(shortcut) as compared:
        Engine(jobs, make_policy(policy), settings=Settings(), options=opts).run()
    return compared


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, required=True)
    ap.add_argument("--gpus", type=int, default=48)
    ap.add_argument("--policy", default="icefrog")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--without", default=",".join(SHORTCUTS), help="comma list of " + ", ".join(SHORTCUTS)
    )
    args = ap.parse_args(argv)
    chosen = [s.strip() for s in args.without.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SHORTCUTS))
    if unknown:
        ap.error(f"--without: unknown shortcut(s) {unknown}; known: {', '.join(SHORTCUTS)}")
    print(f"{args.workload}, {args.gpus} GPUs, {args.policy}, seed {args.seed}")
    for shortcut in chosen:  # one simulation each: a reference must not steer the run
        print(summary(run(args.workload, args.gpus, args.policy, args.seed, shortcut)), flush=True)


if __name__ == "__main__":
    main()
