"""What a user declares for a training job, shared by ``icefrog launch`` (job side) and
``icefrog submit`` (scheduler side): the GPU-count and per-GPU batch ranges, the largest
frozen fraction of layers, the validation target, the work budget (``--max-epochs``, in
full-model-equivalent epochs) with an optional cap on physical epochs, the parallelism with
its allocation unit and an optional fixed global batch.

Owns their parsers (``1-8``, ``val_acc>=0.94``, raising :class:`InputError` that names the
option), the argparse options both commands accept, the ``icefrog launch`` options that
carry a declaration into a batch script, and the ``register`` :class:`JobSpec` it makes.
Pure: no I/O, no torch, no subprocess (the job side may import it).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from icefrog_slurm.core.parallelism import DDP, Kind, Parallelism, parse_parallelism
from icefrog_slurm.errors import InputError
from icefrog_slurm.limits import MAX_JOB_GPUS
from icefrog_slurm.protocol import INT32_MAX, MAX_GLOBAL_BATCH, JobSpec

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$", re.ASCII)
_TARGET = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(>=|<=)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Target:
    """A validation target: the job is done when ``metric op value`` holds."""

    metric: str
    op: Literal[">=", "<="]
    value: float

    def reached(self, value: float) -> bool:
        return value >= self.value if self.op == ">=" else value <= self.value

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_target(text: str) -> Target:
    """Parse ``NAME>=NUMBER`` or ``NAME<=NUMBER`` (e.g. ``val_acc>=0.94``, ``val_loss<=0.1``)."""
    match = _TARGET.match(text)
    if match is None:
        if any(op in text for op in ("==", ">", "<", "=")):
            raise InputError(
                f"--target: {text!r}: the operator must be >= or <= "
                "(e.g. 'val_acc>=0.94' or 'val_loss<=0.1')"
            )
        raise InputError(f"--target: {text!r}: expected NAME>=NUMBER or NAME<=NUMBER")
    name, op, raw = match.groups()
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"--target: {text!r}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"--target: {text!r}: the value must be finite")
    return Target(metric=name, op=">=" if op == ">=" else "<=", value=value)


def parse_range(
    text: str, name: str, minimum: int = 1, maximum: int = INT32_MAX
) -> tuple[int, int]:
    """Parse ``N`` or ``LO-HI`` into ``(lo, hi)`` with ``minimum <= lo <= hi <= maximum``."""
    match = _RANGE.match(text)
    if match is None:
        raise InputError(f"--{name}: {text!r}: expected N or LO-HI (e.g. 1-8)")
    if any(len(part) > 12 for part in match.groups("")):
        raise InputError(f"--{name}: {text[:40]!r}: must be <= {maximum}")
    lo = int(match.group(1))
    hi = lo if match.group(2) is None else int(match.group(2))
    if lo < minimum:
        raise InputError(f"--{name}: {text!r}: must be >= {minimum}")
    if hi < lo:
        raise InputError(f"--{name}: {text!r}: {hi} is smaller than {lo}")
    if hi > maximum:
        raise InputError(f"--{name}: {text!r}: must be <= {maximum}")
    return lo, hi


def parse_job_parallelism(text: str, unit: int, gpus: tuple[int, int]) -> Parallelism:
    """``--parallelism`` (ddp, sdp, pp:P, hp:DxP) with ``--gpu-unit``; the GPU count the text
    names (P, D x P) must lie in the ``--gpus`` range."""
    if unit < 1:
        raise InputError(f"--gpu-unit: must be >= 1, got {unit}")
    parallelism, named = parse_parallelism(text, unit)
    if named and not gpus[0] <= named <= gpus[1]:
        raise InputError(
            f"--parallelism: {text!r} uses {named} GPUs, outside --gpus {gpus[0]}-{gpus[1]}"
        )
    return parallelism


def parallelism_option(parallelism: Parallelism, gpus: tuple[int, int]) -> str:
    """The ``--parallelism`` text that :func:`parse_job_parallelism` reads back as
    ``parallelism`` (HP names its smallest legal shape within ``gpus``)."""
    kind = parallelism.kind
    if kind in (Kind.DDP, Kind.SDP):
        return kind.value
    if kind == Kind.PP:
        return f"pp:{parallelism.stages}"
    smallest = min(parallelism.legal_gpu_counts(*gpus), default=parallelism.step)
    return f"hp:{smallest // parallelism.stages}x{parallelism.stages}"


@dataclass(frozen=True)
class Declaration:
    """A job's declared limits (spec section 12: by default at most 90% of the layers frozen)."""

    gpus: tuple[int, int] = (1, 1)
    batch: tuple[int, int] = (32, 32)  # per-GPU batch range
    max_frozen: float = 0.9
    target: Target | None = None
    max_epochs: int = 100  # the work budget: full-model-equivalent epochs (spec section 4)
    parallelism: Parallelism = DDP  # --parallelism and --gpu-unit (spec section 7)
    global_batch: int = 0  # --global-batch: samples an optimizer step; 0 = free
    max_physical_epochs: int = 0  # cap on epochs actually trained, >= max_epochs; 0 = none

    @property
    def accepts_shared(self) -> bool:
        """Only a job that can run on one GPU alone may share one: DDP in units of 1."""
        return self.gpus[0] == 1 and self.parallelism == DDP

    def validate(self) -> None:
        if not 0.0 <= self.max_frozen <= 1.0:
            raise InputError(f"--max-frozen: must be within [0, 1], got {self.max_frozen}")
        if not 1 <= self.max_epochs <= INT32_MAX:
            raise InputError(
                f"--max-epochs: must be within [1, {INT32_MAX}], got {self.max_epochs}"
            )
        cap = self.max_physical_epochs
        if cap and not self.max_epochs <= cap <= INT32_MAX:
            raise InputError(
                f"--max-physical-epochs: must be within [--max-epochs {self.max_epochs}, "
                f"{INT32_MAX}] (0: no cap), got {cap}: a lower cap would end the job before "
                "its budget of full-model-equivalent epochs could be spent"
            )
        if not 0 <= self.global_batch <= MAX_GLOBAL_BATCH:
            raise InputError(
                f"--global-batch: must be within [0, {MAX_GLOBAL_BATCH}] (0: free), "
                f"got {self.global_batch}"
            )
        if not self.parallelism.legal_gpu_counts(*self.gpus):
            raise InputError(
                f"--gpus: no count in {self.gpus[0]}-{self.gpus[1]} is legal for "
                f"{self.parallelism.describe()}"
            )

    def launch_options(self) -> list[str]:
        """The ``icefrog launch`` options that declare exactly this (round trip of
        :func:`add_arguments` and :func:`from_args`)."""
        options = [
            f"--gpus={self.gpus[0]}-{self.gpus[1]}",
            f"--batch={self.batch[0]}-{self.batch[1]}",
            f"--max-frozen={self.max_frozen!r}",
            f"--max-epochs={self.max_epochs}",
            f"--parallelism={parallelism_option(self.parallelism, self.gpus)}",
            f"--gpu-unit={self.parallelism.unit}",
        ]
        if self.global_batch:
            options.append(f"--global-batch={self.global_batch}")
        if self.max_physical_epochs:
            options.append(f"--max-physical-epochs={self.max_physical_epochs}")
        if self.target is not None:
            options.append(f"--target={self.target}")
        return options

    def job_spec(
        self,
        *,
        samples_per_epoch: int,
        layer_flops: Sequence[float] = (),
        layer_param_bytes: Sequence[float] = (),
    ) -> JobSpec:
        """The ``register`` report's payload. A job without a target declares
        ``none >= float max`` (never reached: it runs until its budget is spent); only a DDP job
        in units of one GPU that accepts one GPU may share one."""
        target = self.target
        return JobSpec(
            min_gpus=self.gpus[0],
            max_gpus=self.gpus[1],
            min_batch=self.batch[0],
            max_batch=self.batch[1],
            max_frozen_fraction=self.max_frozen,
            target_metric=target.metric if target else "none",
            target_op=target.op if target else ">=",
            target_value=target.value if target else sys.float_info.max,
            max_epochs=self.max_epochs,
            samples_per_epoch=samples_per_epoch,
            layer_flops=tuple(layer_flops),
            layer_param_bytes=tuple(layer_param_bytes),
            accepts_shared=self.accepts_shared,
            parallelism=self.parallelism,
            global_batch=self.global_batch,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The declaration options of ``icefrog launch`` and ``icefrog submit``."""
    parser.add_argument("--gpus", default="1", help="GPU count range, N or LO-HI (default 1)")
    parser.add_argument("--batch", default="32", help="per-GPU batch range, N or LO-HI")
    parser.add_argument(
        "--max-frozen", type=float, default=0.9, help="largest frozen fraction of layers"
    )
    parser.add_argument("--target", default="", help="validation target, e.g. 'val_acc>=0.94'")
    parser.add_argument(
        "--max-epochs",
        type=int,
        default=100,
        help="the work budget, in full-model-equivalent epochs: a job training with layers "
        "frozen (frozen penalty psi < 1) trains 1/psi physical samples for each (default 100)",
    )
    parser.add_argument(
        "--max-physical-epochs",
        type=int,
        default=0,
        help="optional cap on the epochs actually trained, at least --max-epochs "
        "(default 0: no cap)",
    )
    parser.add_argument(
        "--parallelism",
        default="ddp",
        help="ddp, sdp, pp:P (P pipeline stages) or hp:DxP (D replicas of P stages); default ddp",
    )
    parser.add_argument(
        "--gpu-unit", type=int, default=1, help="every GPU count a multiple of N (LLaMA jobs: 4)"
    )
    parser.add_argument(
        "--global-batch",
        type=int,
        default=0,
        help="samples an optimizer step, kept on any GPU count (per-GPU batch ceil(N/GPUs) "
        "within --batch); default 0: free, the scheduler tunes the per-GPU batch",
    )


def from_args(args: argparse.Namespace) -> Declaration:
    """The validated declaration of parsed :func:`add_arguments` options."""
    gpus = parse_range(args.gpus, "gpus", maximum=MAX_JOB_GPUS)
    declaration = Declaration(
        gpus=gpus,
        batch=parse_range(args.batch, "batch"),
        max_frozen=args.max_frozen,
        target=parse_target(args.target) if args.target else None,
        max_epochs=args.max_epochs,
        parallelism=parse_job_parallelism(args.parallelism, args.gpu_unit, gpus),
        global_batch=args.global_batch,
        max_physical_epochs=args.max_physical_epochs,
    )
    declaration.validate()
    return declaration
