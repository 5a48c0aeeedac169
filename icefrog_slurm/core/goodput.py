"""Statistical efficiency of a global batch (Pollux, Qiao et al., OSDI 2021; AdaptDL's
``goodput.py``): how much one sample at global batch M is worth against one at the job's
base batch M0.

    scale = M / M0
    gain = (var + sqr) / (var / scale + sqr)      (var, sqr: gradient variance and squared norm)
    efficiency = gain / scale                      (1 at M = M0, falling above it)

var and sqr are sums of the per-layer statistics the trainer reports over the layers that
train: var the variance of a base-batch (M0-sample) gradient, tr(Sigma) / M0, as Pollux's
traces record it (the Model Trainer measures per-sample tr(Sigma) and reports it / M0),
sqr the true gradient's squared norm. The Layer Tuner weighs E by it (goodput) for
Pollux+ always and for ICEFROG with ``[policy] batch_scaling`` (the paper's
batch-elasticity ablation, spec section 15; the default), so the per-GPU batch it picks at
each GPU count is the one of the best goodput.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def efficiency(*, var: float, sqr: float, batch: float, base_batch: float) -> float:
    """The efficiency of global batch ``batch`` (module docstring); 1 when a statistic or a
    batch is not positive (nothing to judge it by)."""
    grid = efficiency_grid(
        grad_var=(var,), grad_sqr=(sqr,), frozen_candidates=(0,), global_batches=(batch,),
        base_batch=base_batch,
    )  # fmt: skip
    return float(grid[0, 0])


def efficiency_grid(
    *,
    grad_var: Sequence[float],
    grad_sqr: Sequence[float],
    frozen_candidates: Sequence[int],
    global_batches: Sequence[float],
    base_batch: float,
) -> FloatArray:
    """:func:`efficiency` with one row a global batch and one column a frozen count l, the
    statistics summed over the layers that train at l (l.. of the per-layer lists)."""
    var, sqr = trainable_sums(grad_var, grad_sqr, frozen_candidates)
    return efficiency_of_sums(
        var=var, sqr=sqr, global_batches=global_batches, base_batch=base_batch
    )


def trainable_sums(
    grad_var: Sequence[float], grad_sqr: Sequence[float], frozen_candidates: Sequence[int]
) -> tuple[FloatArray, FloatArray]:
    """(var, sqr) summed over the layers that train at each frozen count l (l.. of the
    per-layer lists): :func:`efficiency_of_sums`'s columns, computed once a job's statistics
    for all the batches it is asked about."""
    var = np.array([sum(grad_var[k:]) for k in frozen_candidates], dtype=float)
    sqr = np.array([sum(grad_sqr[k:]) for k in frozen_candidates], dtype=float)
    return var, sqr


def efficiency_of_sums(
    *, var: FloatArray, sqr: FloatArray, global_batches: Sequence[float], base_batch: float
) -> FloatArray:
    """:func:`efficiency_grid` from :func:`trainable_sums`: one row a global batch, one
    column a frozen count."""
    v, q = var[None, :], sqr[None, :]
    batch = np.array(global_batches, dtype=float)[:, None]
    ok = (v > 0) & (q > 0) & (batch > 0) & (base_batch > 0)
    scale = np.where(batch > 0, batch, 1.0) / (base_batch if base_batch > 0 else 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = (v + q) / (v / scale + q) / scale
    out: FloatArray = np.where(ok, eff, 1.0)
    return out
