"""The job's declared limits and paths, and how they travel from ``icefrog launch`` to the
trainer processes (environment variables set by the launcher, read once by the trainer).

Pure: no torch, no subprocess. Owns the target-expression parser (``val_acc>=0.94``) and the
range parser (``1-8``), both raising :class:`InputError` naming the problem.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from icefrog_slurm.core.parallelism import DDP, Kind, Parallelism, parse_parallelism
from icefrog_slurm.errors import InputError

_TARGET = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(>=|<=)\s*(\S+)\s*$")

# Environment variables the launcher sets for the trainer (one place, documented in docs/).
ENV_PREFIX = "ICEFROG_"


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


def parse_range(text: str, name: str, minimum: int = 1) -> tuple[int, int]:
    """Parse ``N`` or ``LO-HI`` into ``(lo, hi)`` with ``minimum <= lo <= hi``."""
    parts = text.strip().split("-")
    if not 1 <= len(parts) <= 2 or not all(p.strip().isdigit() for p in parts):
        raise InputError(f"--{name}: {text!r}: expected N or LO-HI (e.g. 1-8)")
    lo, hi = int(parts[0]), int(parts[-1])
    if lo < minimum:
        raise InputError(f"--{name}: {text!r}: must be >= {minimum}")
    if hi < lo:
        raise InputError(f"--{name}: {text!r}: {hi} is smaller than {lo}")
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


def _env_parallelism(text: str) -> Parallelism:
    if not text:
        return DDP
    try:
        doc = json.loads(text)
    except ValueError:
        raise InputError(f"{ENV_PREFIX}PARALLELISM: not JSON: {text!r}") from None
    return Parallelism.from_json(doc, f"{ENV_PREFIX}PARALLELISM")


@dataclass(frozen=True)
class JobConfig:
    """Everything the trainer needs to know that is not in the training script itself."""

    gpus: tuple[int, int] = (1, 1)
    batch: tuple[int, int] = (32, 32)  # per-GPU batch range
    max_frozen: float = 0.9  # fraction of the layers that may be frozen (spec section 12)
    target: Target | None = None
    max_epochs: int = 100
    workdir: str = "."  # checkpoints live in <workdir>/checkpoints (shared filesystem)
    inbox: str = ""  # reports go to <inbox>/<slurm_job_id>/; "" = do not report
    decision: str = ""  # path of decision.json; "" = <workdir>/decision.json
    job_name: str = "job"
    slurm_job_id: str = "0"
    seed: int = 0
    parallelism: Parallelism = DDP  # --parallelism and --gpu-unit (spec section 7)

    @property
    def decision_path(self) -> str:
        return self.decision or f"{self.workdir.rstrip('/')}/decision.json"

    @property
    def accepts_shared(self) -> bool:
        """Only a job that can run on one GPU alone may share one: DDP in units of 1."""
        return self.gpus[0] == 1 and self.parallelism == Parallelism(Kind.DDP)

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.workdir.rstrip('/')}/checkpoints"

    def to_env(self) -> dict[str, str]:
        """The variables ``icefrog launch`` exports for the trainer processes."""
        env = {
            "GPUS": f"{self.gpus[0]}-{self.gpus[1]}",
            "BATCH": f"{self.batch[0]}-{self.batch[1]}",
            "MAX_FROZEN": repr(self.max_frozen),
            "MAX_EPOCHS": str(self.max_epochs),
            "WORKDIR": self.workdir,
            "INBOX": self.inbox,
            "DECISION": self.decision,
            "JOB_NAME": self.job_name,
            "SEED": str(self.seed),
            "PARALLELISM": json.dumps(self.parallelism.to_json()),
        }
        if self.target is not None:
            env["TARGET"] = str(self.target)
        return {ENV_PREFIX + k: v for k, v in env.items()}

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: object) -> JobConfig:
        """Read the launcher's variables (and SLURM_JOB_ID); keyword overrides win."""

        def get(key: str, default: str) -> str:
            return env.get(ENV_PREFIX + key, default)

        try:
            max_frozen = float(get("MAX_FROZEN", "0.9"))
            max_epochs = int(get("MAX_EPOCHS", "100"))
            seed = int(get("SEED", "0"))
        except ValueError as exc:
            raise InputError(f"{ENV_PREFIX}*: {exc}") from None
        target_text = get("TARGET", "")
        values: dict[str, object] = {
            "gpus": parse_range(get("GPUS", "1"), "gpus"),
            "batch": parse_range(get("BATCH", "32"), "batch"),
            "max_frozen": max_frozen,
            "target": parse_target(target_text) if target_text else None,
            "max_epochs": max_epochs,
            "workdir": get("WORKDIR", "."),
            "inbox": get("INBOX", ""),
            "decision": get("DECISION", ""),
            "job_name": get("JOB_NAME", "job"),
            "slurm_job_id": env.get("SLURM_JOB_ID", "0"),
            "seed": seed,
            "parallelism": _env_parallelism(get("PARALLELISM", "")),
        }
        values.update(overrides)
        config = cls(**values)  # type: ignore[arg-type]
        config.validate()
        return config

    def validate(self) -> None:
        if not 0.0 <= self.max_frozen <= 1.0:
            raise InputError(f"--max-frozen: must be within [0, 1], got {self.max_frozen}")
        if self.max_epochs < 1:
            raise InputError(f"--max-epochs: must be >= 1, got {self.max_epochs}")
        if not self.parallelism.legal_gpu_counts(*self.gpus):
            raise InputError(
                f"--gpus: no count in {self.gpus[0]}-{self.gpus[1]} is legal for "
                f"{self.parallelism.describe()}"
            )
        if not self.slurm_job_id.isdigit():
            raise InputError(f"SLURM_JOB_ID: must be a number, got {self.slurm_job_id!r}")
