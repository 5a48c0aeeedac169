"""Per-layer tables of a model and the fractions freezing leaves to train.

A model is L ordered layers (input side first). Freezing ``l`` means the first ``l`` layers
get no gradient, no backward work and no gradient synchronisation. Two fractions describe
what remains (spec section 6):

- ``theta_l = sum(flops[l:]) / sum(flops)``: the unfrozen share of FLOPs (eq 6);
- ``omega_l = sum(param_bytes[l:]) / sum(param_bytes)``: the unfrozen share of parameter
  bytes, i.e. of the data all-reduced each step (eq 7).

Freezing may be allowed only at some boundaries (e.g. the end of a residual block):
``boundaries`` lists the legal values of ``l`` (0 is always legal).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from icefrog_slurm.errors import InputError


def _check_values(values: Sequence[float], name: str) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    for i, v in enumerate(out):
        if not math.isfinite(v) or v < 0:
            raise InputError(f"{name}[{i}]: must be a finite number >= 0, got {v!r}")
    if sum(out) <= 0:
        raise InputError(f"{name}: the layers' total must be > 0")
    return out


@dataclass(frozen=True)
class LayerTable:
    """FLOPs and parameter bytes of each of a model's ``L`` ordered layers.

    ``boundaries``: the legal frozen-prefix lengths, sorted, within ``[0, L]``; 0 is added
    when missing. Empty means every ``l`` in ``0..L`` is legal.
    """

    flops: tuple[float, ...]
    param_bytes: tuple[float, ...]
    boundaries: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    _theta: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _omega: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        flops = _check_values(self.flops, "layer_flops")
        params = _check_values(self.param_bytes, "layer_param_bytes")
        if len(flops) != len(params):
            raise InputError(
                f"layer_param_bytes: has {len(params)} layers but layer_flops has {len(flops)}"
            )
        if self.names and len(self.names) != len(flops):
            raise InputError(f"names: has {len(self.names)} entries for {len(flops)} layers")
        n = len(flops)
        bounds = sorted(set(self.boundaries) | {0}) if self.boundaries else list(range(n + 1))
        for b in bounds:
            if not 0 <= b <= n:
                raise InputError(f"boundaries: {b} is outside 0..{n}")
        object.__setattr__(self, "flops", flops)
        object.__setattr__(self, "param_bytes", params)
        object.__setattr__(self, "boundaries", tuple(bounds))
        object.__setattr__(self, "_theta", _suffix_fractions(flops))
        object.__setattr__(self, "_omega", _suffix_fractions(params))

    @classmethod
    def uniform(cls, num_layers: int, boundaries: Sequence[int] = ()) -> LayerTable:
        """Every layer the same FLOPs and bytes: theta_l = omega_l = 1 - l/L."""
        if num_layers < 1:
            raise InputError(f"layers: must be >= 1, got {num_layers}")
        ones = (1.0,) * num_layers
        return cls(flops=ones, param_bytes=ones, boundaries=tuple(boundaries))

    @property
    def num_layers(self) -> int:
        return len(self.flops)

    def theta(self, frozen: int) -> float:
        """theta_l: fraction of FLOPs in the trainable suffix after freezing ``frozen`` layers."""
        return self._theta[self._check_frozen(frozen)]

    def omega(self, frozen: int) -> float:
        """omega_l: fraction of parameter bytes in the trainable suffix (eq 7)."""
        return self._omega[self._check_frozen(frozen)]

    @cached_property
    def fractions(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(theta_l, omega_l) for l = 0..L as read-only arrays indexed by l (for evaluating a
        model over many frozen counts at once); the same values as :meth:`theta`/:meth:`omega`."""
        theta, omega = np.array(self._theta), np.array(self._omega)
        theta.flags.writeable = omega.flags.writeable = False
        return theta, omega

    def max_frozen_from_fraction(self, fraction: float) -> int:
        """The largest l with l <= fraction x L (the paper's default fraction is 0.9)."""
        if not 0.0 <= fraction <= 1.0:
            raise InputError(f"max_frozen: a fraction must be within [0, 1], got {fraction}")
        return math.floor(fraction * self.num_layers + 1e-9)

    def candidates(self, max_frozen: int) -> tuple[int, ...]:
        """The legal frozen counts ``l`` with ``l <= max_frozen`` (always includes 0)."""
        return tuple(b for b in self.boundaries if b <= max_frozen)

    def _check_frozen(self, frozen: int) -> int:
        if not 0 <= frozen <= self.num_layers:
            raise InputError(f"frozen: {frozen} is outside 0..{self.num_layers}")
        return frozen


def _suffix_fractions(values: tuple[float, ...]) -> tuple[float, ...]:
    """out[l] = sum(values[l:]) / sum(values), for l = 0..L (out[0] = 1, out[L] = 0)."""
    total = math.fsum(values)
    out = [0.0] * (len(values) + 1)
    running = 0.0
    for i in range(len(values) - 1, -1, -1):
        running += values[i]
        out[i] = running / total
    out[0] = 1.0
    return tuple(out)
