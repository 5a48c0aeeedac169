"""What a job declares about its parallelism: DDP, SDP, PP with p stages, HP with d replicas
of p stages, and its allocation unit (spec section 7).

Owns :class:`Parallelism` (its strict JSON form, its legal GPU counts, replicas and global
batch) and :func:`parse_parallelism`, the command-line form ``ddp|sdp|pp:P|hp:DxP``. Kept
apart from the models (``parallel.py``) so that the wire protocol can carry it without
importing them: this module needs only ``errors`` and ``jsonio``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import expect_object, get_int, get_str, reject_unknown


class Kind(StrEnum):
    """How a job spreads over its GPUs."""

    DDP = "ddp"
    SDP = "sdp"
    PP = "pp"
    HP = "hp"


@dataclass(frozen=True)
class Parallelism:
    """A job's declared parallelism.

    ``stages``: p, the pipeline stages (PP, HP; 1 otherwise). ``unit``: the allocation unit,
    every GPU count a multiple of it (4 for the paper's LLaMA jobs). For HP the number of
    replicas is not declared but follows from the allocation: d = a / p.
    """

    kind: Kind
    stages: int = 1
    unit: int = 1

    def __post_init__(self) -> None:
        if self.unit < 1:
            raise InputError(f"parallelism.unit: must be >= 1, got {self.unit}")
        pipelined = self.kind in (Kind.PP, Kind.HP)
        if pipelined and self.stages < 2:
            raise InputError(f"parallelism.stages: {self.kind} needs >= 2, got {self.stages}")
        if not pipelined and self.stages != 1:
            raise InputError(f"parallelism.stages: {self.kind} has no stages, got {self.stages}")
        if self.kind is Kind.PP and self.stages % self.unit:
            raise InputError(
                f"parallelism: pure PP uses {self.stages} GPUs, not a multiple of the unit "
                f"{self.unit}"
            )

    @property
    def step(self) -> int:
        """The spacing of legal GPU counts: the unit, or lcm(unit, p) for HP."""
        return math.lcm(self.unit, self.stages) if self.kind is Kind.HP else self.unit

    def legal_gpu_counts(self, min_gpus: int, max_gpus: int) -> tuple[int, ...]:
        """The GPU counts a in [min_gpus, max_gpus] this job can run on (0, waiting, excluded).

        DDP, SDP: multiples of the unit; PP: exactly p; HP: multiples of lcm(unit, p).
        """
        if min_gpus < 1 or max_gpus < min_gpus:
            raise InputError(f"gpus: need 1 <= min <= max, got [{min_gpus}, {max_gpus}]")
        if self.kind is Kind.PP:
            return (self.stages,) if min_gpus <= self.stages <= max_gpus else ()
        first = -(-min_gpus // self.step) * self.step
        return tuple(range(first, max_gpus + 1, self.step))

    def replicas(self, gpus: int) -> int:
        """Data-parallel replicas on ``gpus``: a (DDP, SDP), 1 (PP), d = a / p (HP)."""
        if gpus < 1 or gpus % self.step or (self.kind is Kind.PP and gpus != self.stages):
            raise InputError(f"gpus: {gpus} is not a legal count for {self.describe()}")
        if self.kind is Kind.PP:
            return 1
        return gpus // self.stages

    def global_batch(self, gpus: int, batch: int) -> int:
        """M(a, m) of eq 4: replicas x m, with m the batch of one replica (GPU or pipeline)."""
        return self.replicas(gpus) * batch

    def describe(self) -> str:
        stages = f"(p={self.stages})" if self.stages > 1 else ""
        return f"{self.kind.value.upper()}{stages} in units of {self.unit} GPUs"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "stages": self.stages, "unit": self.unit}

    @classmethod
    def from_json(cls, doc: Any, where: str = "parallelism") -> Parallelism:
        obj = expect_object(doc, where)
        reject_unknown(obj, ("kind", "stages", "unit"), where)
        kind = get_str(obj, "kind", where)
        if kind not in {k.value for k in Kind}:
            raise InputError(f"{where}.kind: must be one of ddp, sdp, pp, hp; got {kind!r}")
        return cls(
            kind=Kind(kind),
            stages=get_int(obj, "stages", where, default=1, minimum=1),
            unit=get_int(obj, "unit", where, default=1, minimum=1),
        )


DDP = Parallelism(Kind.DDP)
"""The default: plain data parallelism in units of one GPU."""


def parse_parallelism(text: str, unit: int = 1) -> tuple[Parallelism, int]:
    """The command-line form ``ddp``, ``sdp``, ``pp:P`` or ``hp:DxP`` with allocation unit
    ``unit``, as (parallelism, the GPU count the text names: P for PP, D x P for HP, 0 for
    DDP and SDP). For HP, D is the shape the job is written for; the scheduler may run it on
    any d = a / p whose a is a legal count (:meth:`Parallelism.legal_gpu_counts`)."""
    where = "--parallelism"
    kind, _, rest = text.strip().lower().partition(":")
    if kind in ("ddp", "sdp"):
        if rest:
            raise InputError(f"{where}: {text!r}: {kind} takes no ':' part")
        return Parallelism(Kind(kind), unit=unit), 0
    if kind == "pp":
        stages = _count(rest, text, "pp:P, e.g. pp:4")
        return Parallelism(Kind.PP, stages=stages, unit=unit), stages
    if kind == "hp":
        d, sep, p = rest.partition("x")
        if not sep:
            raise InputError(f"{where}: {text!r}: expected hp:DxP, e.g. hp:2x4")
        replicas, stages = _count(d, text, "hp:DxP"), _count(p, text, "hp:DxP")
        hybrid = Parallelism(Kind.HP, stages=stages, unit=unit)
        if (replicas * stages) % hybrid.step:
            raise InputError(
                f"{where}: {text!r}: {replicas * stages} GPUs is not a multiple of "
                f"{hybrid.step} ({hybrid.describe()})"
            )
        return hybrid, replicas * stages
    raise InputError(f"{where}: {text!r}: expected ddp, sdp, pp:P or hp:DxP")


def _count(raw: str, text: str, form: str) -> int:
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9 or int(raw) < 1:
        raise InputError(f"--parallelism: {text!r}: expected {form} with positive integers")
    return int(raw)
