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

SUM_CELLS = 1 << 20
"""The most (job, column, layer) cells :func:`trainable_sums` holds at once."""


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
    grad_var: Sequence[float] | FloatArray,
    grad_sqr: Sequence[float] | FloatArray,
    frozen_candidates: Sequence[int] | npt.NDArray[np.int64],
) -> tuple[FloatArray, FloatArray]:
    """(var, sqr) summed over the layers that train at each frozen count l (l.. of the
    per-layer lists, added in layer order): :func:`efficiency_of_sums`'s columns, computed
    once a job's statistics for all the batches it is asked about. Leading dimensions
    broadcast, so many jobs are summed in one call: the lists (..., layers) and the frozen
    counts (..., columns) give (..., columns). The columns are summed a block at a time so
    that the working arrays stay within ``SUM_CELLS`` (a job may declare thousands of
    layers and depths)."""
    var, sqr = np.asarray(grad_var, dtype=float), np.asarray(grad_sqr, dtype=float)
    frozen = np.asarray(frozen_candidates, dtype=np.int64)
    layers = var.shape[-1]
    leading = np.broadcast_shapes(var.shape[:-1], sqr.shape[:-1], frozen.shape[:-1])
    out_var = np.zeros((*leading, frozen.shape[-1]))
    out_sqr = np.zeros(out_var.shape)
    if layers == 0 or out_var.size == 0:
        return out_var, out_sqr
    columns = frozen.shape[-1]
    block = max(1, SUM_CELLS // (layers * max(1, out_var.size // columns)))
    for start in range(0, columns, block):
        at = frozen[..., start : start + block, None] + np.arange(layers)  # l, l + 1, ...
        inside = at < layers
        at = np.minimum(at, layers - 1)
        for x, out in ((var, out_var), (sqr, out_sqr)):
            picked = np.take_along_axis(x[..., None, :], at, axis=-1)
            # a running sum adds in order, as a loop over the layers would (and, as it
            # would, overflows to inf without a word: a job's statistics may be huge)
            with np.errstate(over="ignore"):
                running = np.cumsum(np.where(inside, picked, 0.0), axis=-1)
            out[..., start : start + block] = running[..., -1]
    return out_var, out_sqr


def efficiency_of_sums(
    *,
    var: FloatArray,
    sqr: FloatArray,
    global_batches: Sequence[float] | FloatArray,
    base_batch: float | FloatArray,
) -> FloatArray:
    """:func:`efficiency_grid` from :func:`trainable_sums`: one row a global batch, one
    column a frozen count. Leading dimensions broadcast, so many jobs are judged in one
    call: ``var`` and ``sqr`` (..., columns), ``global_batches`` (..., rows), ``base_batch``
    a number or (...) give (..., rows, columns); each element is the float the one-job call
    gives."""
    v, q = var[..., None, :], sqr[..., None, :]
    batch = np.asarray(global_batches, dtype=float)[..., :, None]
    base = np.asarray(base_batch, dtype=float)[..., None, None]
    ok = (v > 0) & (q > 0) & (batch > 0) & (base > 0)
    scale = np.where(batch > 0, batch, 1.0) / np.where(base > 0, base, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = (v + q) / (v / scale + q) / scale
    out: FloatArray = np.where(ok, eff, 1.0)
    return out
