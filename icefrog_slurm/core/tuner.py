"""The Layer Tuner (spec section 9 step 3, eq 15): the best per-GPU batch and freezing depth.

Given the GPU count ``a`` and sharing state ``s`` the scheduler offers a job, the tuner
enumerates the legal (m, l) — batch sizes (the powers of two in the job's range) times the
frozen counts the job allows (0..max, default 90 % of the layers, at allowed boundaries,
see :meth:`LayerTable.candidates`) — and returns

    (m*, l*) = argmax_{m, l} E(a, s, m, l) = psi(l) x T(a, s, m, l)      (eq 15, eq 2)

with its psi, T and E. Throughput of a configuration that was measured is used as it was
measured; any other is predicted by the fitted model (``throughput.py``).
Ties (equal E) go to the current freezing depth, then to fewer frozen layers, then to the
smaller batch, so the tuner does not move a job for nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.errors import InputError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ThroughputFn = Callable[[int, int], float]
"""(per-GPU batch m, frozen l) -> samples a second at the tuner's GPU count, alone (lambda 1)."""

_TIE = 1e-9


class ThroughputModel(Protocol):
    """A fitted throughput model: the DDP one (``throughput.py``, eq 4-7) or a large-model
    one (``parallel.py``: SDP eq 9-10, PP/HP eq 11-13), whichever the job declared."""

    def throughput(self, *, gpus: int, batch: int, frozen: int, layers: LayerTable) -> float: ...

    def throughputs(
        self, *, gpus: int | IntArray, batch: FloatArray, frozen: IntArray, layers: LayerTable
    ) -> FloatArray:
        """``throughput`` for arrays of GPU counts, batches and frozen counts (broadcast), in
        one call."""
        ...


@dataclass(frozen=True)
class TunerChoice:
    """The chosen configuration and its numbers: E = psi x T (eq 2)."""

    batch: int
    frozen: int
    psi: float
    throughput: float  # T(a, s, m, l), samples/s, lambda included
    effective_progress: float  # E = psi x T (x the batch's efficiency, when given one)


@functools.lru_cache(maxsize=256)
def powers_of_two(min_batch: int, max_batch: int) -> tuple[int, ...]:
    """The powers of two m with min_batch <= m <= max_batch (the tuner's batch sizes);
    remembered for the ranges last asked (every job asks every round)."""
    if min_batch < 1 or max_batch < min_batch:
        raise InputError(f"batch range: need 1 <= min <= max, got {min_batch}..{max_batch}")
    out: list[int] = []
    m = 1
    while m <= max_batch:
        if m >= min_batch:
            out.append(m)
        m *= 2
    if not out:
        raise InputError(f"batch range: no power of two within {min_batch}..{max_batch}")
    return tuple(out)


def legal_frozen(
    layers: LayerTable, max_frozen: int, restrict: Iterable[int] | None = None
) -> tuple[int, ...]:
    """Frozen counts l <= max_frozen at allowed boundaries, optionally restricted further."""
    if not 0 <= max_frozen <= layers.num_layers:
        raise InputError(f"max_frozen: {max_frozen} is outside 0..{layers.num_layers}")
    allowed = layers.candidates(max_frozen)
    if restrict is None:
        return allowed
    wanted = set(restrict)
    return tuple(k for k in allowed if k in wanted)


MAX_DEPTHS = 128
"""Frozen depths a job is tuned over at most: a table that allows more (thousands of layers,
each one a boundary) is tuned over this many of them, spread evenly from 0 to its deepest,
so the grids one declaration costs every round stay bounded (the shipped tasks allow 6-34)."""


def spread_depths(
    depths: tuple[int, ...], keep: int | None = None, most: int = MAX_DEPTHS
) -> tuple[int, ...]:
    """At most ``most`` of the sorted ``depths``, evenly spread, the first and the last
    among them, and ``keep`` (the depth a job trains at now) when it is one of them."""
    n = len(depths)
    if n <= most:
        return depths
    picked = {depths[round(i * (n - 1) / (most - 1))] for i in range(most)}
    if keep in depths:
        picked.add(keep)
    return tuple(sorted(picked))


def measured_or_predicted(
    *,
    gpus: int,
    measured: Mapping[tuple[int, int, int], float],
    model: ThroughputModel | None,
    layers: LayerTable,
) -> ThroughputFn:
    """T(a, m, l) alone: the measured samples/s of (gpus, m, l) when there is one, else the
    model's prediction (eq 4-7, or 9-13 for a large-model job), for l > 0 at most
    T(a, m, 0) x :func:`max_freeze_speedup`; 0 (not selectable) when neither exists."""

    def throughput(batch: int, frozen: int) -> float:
        grid = measured_or_predicted_grid(
            gpus=gpus,
            batch_sizes=(batch,),
            frozen_candidates=(frozen,),
            measured=measured,
            model=model,
            layers=layers,
        )
        return float(grid[0, 0])

    return throughput


BACKWARD_PER_FORWARD = 2.0
"""Backward FLOPs per forward FLOP of a trainable layer (weight and input gradients)."""


def max_freeze_speedup(layers: LayerTable, frozen: int) -> float:
    """The most a freeze of ``frozen`` layers can speed an iteration up by compute:
    (1 + B) / (1 + B x theta_l), B = :data:`BACKWARD_PER_FORWARD` (the forward pass stays,
    backward shrinks to the trainable FLOPs share theta_l). A *predicted* frozen throughput
    is capped at the unfrozen one times this: a fit from unfrozen samples alone can put an
    iteration's time near zero at deep freezes (docs/evaluation.md, "Ablation: freezing").
    Sync saved beyond compute is not counted, so the cap is conservative for jobs whose
    unfrozen iteration is dominated by synchronisation; measured values are never capped."""
    return float(_freeze_cap(np.float64(layers.theta(frozen))))


def _freeze_cap(theta: FloatArray | np.float64) -> FloatArray:
    """(1 + B) / (1 + B x theta) of :func:`max_freeze_speedup`, elementwise over theta_l."""
    b = BACKWARD_PER_FORWARD
    return np.asarray((1.0 + b) / (1.0 + b * theta), dtype=np.float64)


def measured_or_predicted_grid(
    *,
    gpus: int,
    batch_sizes: Sequence[int],
    frozen_candidates: Sequence[int],
    measured: Mapping[tuple[int, int, int], float],
    model: ThroughputModel | None,
    layers: LayerTable,
) -> FloatArray:
    """:func:`measured_or_predicted` over the whole grid at once: an array with one row a
    batch size and one column a frozen count (:func:`measured_or_predicted_grids` of one
    GPU count)."""
    return measured_or_predicted_grids(
        configs=((gpus, tuple(batch_sizes)),),
        frozen_candidates=frozen_candidates,
        measured=measured,
        model=model,
        layers=layers,
    )[0]


def measured_or_predicted_grids(
    *,
    configs: Sequence[tuple[int, Sequence[int]]],
    frozen_candidates: Sequence[int],
    measured: Mapping[tuple[int, int, int], float],
    model: ThroughputModel | None,
    layers: LayerTable,
) -> list[FloatArray]:
    """The T(a, m, l) grids of several (GPU count a, batch sizes) configurations, the model
    evaluated once for all of them: one array per configuration, one row a batch size and
    one column a frozen count. A predicted frozen cell (l > 0) is at most T(a, m, 0) x
    :func:`max_freeze_speedup` (T(a, m, 0) measured when it was); measured cells are used
    as measured."""
    frozen = np.array(frozen_candidates, dtype=np.int64)
    widths = [len(batches) for _, batches in configs]
    if model is None or not (configs and max(widths) and frozen.size):
        grids: list[FloatArray] = [np.zeros((w, frozen.size)) for w in widths]
    else:
        # Pad every configuration's batches to the longest with its own last batch, and
        # evaluate the unfrozen column too when it is not a candidate: one call.
        width = max(widths)
        batch: FloatArray = np.array(
            [[*b, *[b[-1] if b else 1] * (width - len(b))] for _, b in configs], dtype=np.float64
        )
        gpus = np.array([g for g, _ in configs], dtype=np.int64)
        zero = int(np.flatnonzero(frozen == 0)[0]) if (frozen == 0).any() else frozen.size
        columns = frozen if zero < frozen.size else np.append(frozen, 0)
        pred: FloatArray = np.array(
            model.throughputs(
                gpus=gpus[:, None, None],
                batch=batch[:, :, None],
                frozen=columns[None, None, :],
                layers=layers,
            ),
            dtype=np.float64,
        ).reshape(len(configs), width, columns.size)
        base = pred[:, :, zero].copy()
        for c, (g, batches) in enumerate(configs):
            for i, m in enumerate(batches):
                base[c, i] = measured.get((g, m, 0), base[c, i])
        caps = np.where(frozen > 0, _freeze_cap(layers.fractions[0][frozen]), np.inf)
        grid = pred[:, :, : frozen.size]
        if (frozen > 0).any():
            grid = np.minimum(grid, base[:, :, None] * caps[None, None, :])
        grids = [grid[c, :w].copy() for c, w in enumerate(widths)]
    where: dict[int, list[int]] = {}
    for c, (g, _) in enumerate(configs):
        where.setdefault(g, []).append(c)
    rows = [{m: i for i, m in enumerate(batches)} for _, batches in configs]
    cols = {k: j for j, k in enumerate(frozen_candidates)}
    for (g, m, k), value in measured.items():
        for c in where.get(g, ()):
            if m in rows[c] and k in cols:
                grids[c][rows[c][m], cols[k]] = value
    return grids


def tune(
    *,
    batch_sizes: Iterable[int],
    frozen_candidates: Iterable[int],
    psi: Callable[[int], float],
    throughput: ThroughputFn,
    lam: float = 1.0,
    current_frozen: int | None = None,
) -> TunerChoice | None:
    """argmax over (m, l) of E = psi(l) x T(a, s, m, l) (eq 15), T = throughput(m, l) x lam.

    ``lam``: the sharing factor of eq 8 (1 alone, 0.9 shared, 0 not selectable). Returns
    None when no candidate has E > 0 (e.g. lam = 0: the shared branch is not selectable).
    """
    batches, frozen = tuple(batch_sizes), tuple(frozen_candidates)
    return tune_grid(
        batch_sizes=batches,
        frozen_candidates=frozen,
        psi=np.array([psi(k) for k in frozen], dtype=float),
        throughput=np.array([[throughput(m, k) for k in frozen] for m in batches], dtype=float),
        lam=lam,
        current_frozen=current_frozen,
    )


def tune_grid(
    *,
    batch_sizes: Sequence[int],
    frozen_candidates: Sequence[int],
    psi: FloatArray,
    throughput: FloatArray,
    lam: float = 1.0,
    current_frozen: int | None = None,
    efficiency: FloatArray | None = None,
) -> TunerChoice | None:
    """:func:`tune` on arrays: ``psi[j]`` = psi(frozen_candidates[j]) and ``throughput[i, j]``
    = T alone at (batch_sizes[i], frozen_candidates[j]) (see
    :func:`measured_or_predicted_grid`). The same choice, ties included.

    ``efficiency[i, j]``, when given, is the statistical efficiency of the global batch at
    (batch_sizes[i], frozen_candidates[j]) (``core/goodput.py``): the tuner then maximises
    the goodput psi x T x efficiency, so a larger batch must pay for the extra samples it
    needs (``[policy] batch_scaling``, spec section 15's batch elasticity)."""
    return tune_rows(
        [TuneRow(batch_sizes, frozen_candidates, psi, throughput, efficiency, lam, current_frozen)]
    )[0]


class TuneRow(NamedTuple):
    """One configuration for :func:`tune_rows`: ``throughput[i, j]`` = T alone at
    (batch_sizes[i], frozen_candidates[j]), ``psi[j]`` = psi(frozen_candidates[j]), the
    efficiency grid when batch scaling weighs E (None: E alone), lambda, and the job's
    current depth (the tie-break)."""

    batch_sizes: Sequence[int]
    frozen_candidates: Sequence[int]
    psi: FloatArray
    throughput: FloatArray
    efficiency: FloatArray | None = None
    lam: float = 1.0
    current_frozen: int | None = None


def tune_rows(rows: Sequence[TuneRow]) -> list[TunerChoice | None]:
    """:func:`tune_grid` for many configurations at once, of one job or of many: the rows of
    one shape (batches x depths) stacked into one array, E = psi x (T x lambda) (x the
    efficiency) in one pass (a NaN counts as -inf), then each row's best with
    :func:`tune_grid`'s tie-break. The same choices and the same floats as one
    :func:`tune_grid` call a row; no row is padded to another's size, so memory is that of
    the rows themselves."""
    for row in rows:
        if not (0 <= row.lam <= 1 and math.isfinite(row.lam)):
            raise InputError(f"lambda: must be within [0, 1], got {row.lam}")
    out: list[TunerChoice | None] = [None] * len(rows)
    shapes: dict[tuple[int, int], list[int]] = {}
    for c, row in enumerate(rows):
        shapes.setdefault((len(row.batch_sizes), len(row.frozen_candidates)), []).append(c)
    for (width, depth), members in shapes.items():
        if width and depth:
            chosen = _tune_shape([rows[c] for c in members], width, depth)
            for c, choice in zip(members, chosen, strict=True):
                out[c] = choice
    return out


def _tune_shape(rows: Sequence[TuneRow], width: int, depth: int) -> list[TunerChoice | None]:
    """:func:`tune_rows` of rows that all have ``width`` batches and ``depth`` depths."""
    n = len(rows)
    t, psi, eff = np.empty((n, width, depth)), np.empty((n, depth)), np.ones((n, width, depth))
    for c, r in enumerate(rows):
        t[c] = r.throughput
        psi[c] = r.psi
        if r.efficiency is not None:  # x 1 elsewhere: the same floats as no factor
            eff[c] = r.efficiency
    rate = t * np.array([r.lam for r in rows], dtype=float)[:, None, None]
    e = psi[:, None, :] * rate * eff
    stacked = np.where(np.isnan(e), -math.inf, e)
    best_e = stacked.max(axis=(1, 2))
    near = stacked >= (best_e * (1 - _TIE))[:, None, None]
    ties = np.count_nonzero(near, axis=(1, 2))
    at_i, at_j = np.unravel_index(stacked.reshape(n, -1).argmax(axis=1), (width, depth))
    for c in np.flatnonzero((ties > 1) & (best_e > 0)).tolist():  # break the tie
        r = rows[c]
        at_i[c], at_j[c] = min(
            np.argwhere(near[c]).tolist(),
            key=lambda ij: (
                r.frozen_candidates[ij[1]] != r.current_frozen,
                r.frozen_candidates[ij[1]],
                r.batch_sizes[ij[0]],
            ),
        )
    every = np.arange(n)
    rates, progress = rate[every, at_i, at_j].tolist(), stacked[every, at_i, at_j].tolist()
    psis, chosen = psi[every, at_j].tolist(), (best_e > 0).tolist()
    return [
        TunerChoice(r.batch_sizes[i], r.frozen_candidates[j], psis[c], rates[c], progress[c])
        if chosen[c]
        else None
        for c, (r, i, j) in enumerate(zip(rows, at_i.tolist(), at_j.tolist(), strict=True))
    ]
