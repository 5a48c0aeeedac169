"""How far the fast throughput fit's numbers are from the finite-difference fit's, in a
simulation.

``fit_ddp_model`` gives scipy's least squares the model's analytic Jacobian
(``DdpThroughputModel.gradients``); without it scipy differentiates by finite differences.
The two end at the same minimum to the solver's tolerance, not bit for bit. This runs one
simulation and refits every DDP fit it makes a second time with finite differences, then
prints over all fits the largest relative difference of the predicted throughput between
the two fits (GPUs 1-16, the fitted batches and 32, 128, the fitted frozen depths, 0 and half
the layers): median, 90th percentile, maximum, and how many fits differ by more than 1e-6,
1e-3, 1e-2. The simulation itself uses the analytic fit, as ``icefrog simulate`` does.

Usage (the 48-GPU 1x trace of docs/evaluation.md):
    .venv/bin/icefrog trace sample --load 1 --seed 1 --out /tmp/w1.csv
    .venv/bin/python -m benchmarks.sim_speed --workload /tmp/w1.csv --gpus 48 --policy icefrog
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icefrog_slurm.commands.simulate import make_policy
from icefrog_slurm.core import fit, parallel_fit
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.throughput import DdpThroughputModel
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import read_workload


class BothFits:
    """While on, every ``fit_ddp_model`` also fits with finite differences and records the
    largest relative difference of the two models' predictions."""

    def __init__(self) -> None:
        self.diffs: list[float] = []
        self._fit, self._params = fit.fit_ddp_model, fit.fit_params

    def __enter__(self) -> BothFits:
        analytic, params = self._fit, self._params

        def finite(*args: Any, **kwargs: Any) -> fit.FitResult:
            return params(*args, **{**kwargs, "jacobian": None})

        def both(
            samples: Sequence[ProfileSample], layers: LayerTable, **kwargs: Any
        ) -> DdpThroughputModel:
            model = analytic(samples, layers, **kwargs)
            fit.fit_params = finite
            try:
                other = analytic(samples, layers, **kwargs)
            finally:
                fit.fit_params = params
            self.diffs.append(_largest(model, other, samples, layers))
            return model

        fit.fit_ddp_model = parallel_fit.fit_ddp_model = both  # type: ignore[attr-defined]
        return self

    def __exit__(self, *_exc: object) -> None:
        fit.fit_ddp_model = parallel_fit.fit_ddp_model = self._fit  # type: ignore[attr-defined]
        fit.fit_params = self._params


def _largest(
    a: DdpThroughputModel,
    b: DdpThroughputModel,
    samples: Sequence[ProfileSample],
    layers: LayerTable,
) -> float:
    batches = sorted({s.batch for s in samples} | {32, 128})
    depths = sorted({0, layers.num_layers // 2, *(s.frozen for s in samples)})
    worst = 0.0
    for g in (1, 2, 4, 8, 16):
        for m in batches:
            for k in depths:
                x = a.throughput(gpus=g, batch=m, frozen=k, layers=layers)
                y = b.throughput(gpus=g, batch=m, frozen=k, layers=layers)
                worst = max(worst, abs(x - y) / y)
    return worst


def summary(diffs: Sequence[float]) -> Mapping[str, float]:
    d = np.asarray(diffs, dtype=float)
    return {
        "fits": len(d),
        "median": float(np.median(d)),
        "p90": float(np.quantile(d, 0.9)),
        "max": float(d.max()),
        "over_1e-6": int((d > 1e-6).sum()),
        "over_1e-3": int((d > 1e-3).sum()),
        "over_1e-2": int((d > 1e-2).sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, required=True)
    ap.add_argument("--gpus", type=int, default=48)
    ap.add_argument("--policy", default="icefrog")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    workload = read_workload(args.workload, shipped_catalog())
    opts = SimOptions(gpus=args.gpus, seed=args.seed, fixed_batch=args.policy != "pollux+")
    with BothFits() as both:
        Engine(workload, make_policy(args.policy), settings=Settings(), options=opts).run()
    print(f"{args.workload}, {args.gpus} GPUs, {args.policy}, seed {args.seed}: relative "
          "difference of predicted throughput, analytic vs finite-difference fit")  # fmt: skip
    print(" ".join(f"{k} {v:.3g}" for k, v in summary(both.diffs).items()))


if __name__ == "__main__":
    main()
