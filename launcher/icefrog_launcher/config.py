"""The job's declared limits and paths, and how they travel from ``icefrog launch`` to the
trainer processes (environment variables set by the launcher, read once by the trainer).

Pure: no torch, no subprocess. The declared limits (ranges, target) and their parsers are
icefrog_slurm.declaration's, shared with ``icefrog submit``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from icefrog_launcher.budget import WorkBudget
from icefrog_slurm.core.parallelism import DDP, Parallelism
from icefrog_slurm.declaration import Declaration, Target, parse_range, parse_target
from icefrog_slurm.errors import InputError
from icefrog_slurm.runfiles import DECISION_FILE

__all__ = ["ENV_PREFIX", "JobConfig", "Target", "parse_range", "parse_target"]

# Environment variables the launcher sets for the trainer (one place, documented in docs/).
ENV_PREFIX = "ICEFROG_"


@dataclass(frozen=True)
class JobConfig:
    """Everything the trainer needs to know that is not in the training script itself."""

    gpus: tuple[int, int] = (1, 1)
    batch: tuple[int, int] = (32, 32)  # per-GPU batch range
    max_frozen: float = 0.9  # fraction of the layers that may be frozen (spec section 12)
    target: Target | None = None
    max_epochs: int = 100  # the work budget, full-model-equivalent epochs (icefrog_launcher.budget)
    max_physical_epochs: int = 0  # cap on epochs actually trained; 0 = none
    workdir: str = "."  # checkpoints live in <workdir>/checkpoints (shared filesystem)
    inbox: str = ""  # reports go to <inbox>/<slurm_job_id>/; "" = do not report
    decision: str = ""  # path of decision.json; "" = <workdir>/decision.json
    job_name: str = "job"
    slurm_job_id: str = "0"
    seed: int = 0
    parallelism: Parallelism = DDP  # --parallelism and --gpu-unit (spec section 7)
    global_batch: int = 0  # --global-batch: samples an optimizer step; 0 = free
    # submitted with icefrog submit (the launcher's MANAGED_ENV): False = an unmanaged job
    # (a plain sbatch), which trains on the allocation Slurm gave it and reads no decision
    managed: bool = True

    @property
    def decision_path(self) -> str:
        return self.decision or f"{self.workdir.rstrip('/')}/{DECISION_FILE}"

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.workdir.rstrip('/')}/checkpoints"

    def budget(self, samples_per_epoch: int) -> WorkBudget:
        """The work budget of an epoch of ``samples_per_epoch`` samples."""
        return WorkBudget(self.max_epochs, samples_per_epoch, self.max_physical_epochs)

    def to_env(self) -> dict[str, str]:
        """The variables ``icefrog launch`` exports for the trainer processes."""
        env = {
            "GPUS": f"{self.gpus[0]}-{self.gpus[1]}",
            "BATCH": f"{self.batch[0]}-{self.batch[1]}",
            "MAX_FROZEN": repr(self.max_frozen),
            "MAX_EPOCHS": str(self.max_epochs),
            "MAX_PHYSICAL_EPOCHS": str(self.max_physical_epochs),
            "WORKDIR": self.workdir,
            "INBOX": self.inbox,
            "DECISION": self.decision,
            "JOB_NAME": self.job_name,
            "SEED": str(self.seed),
            "PARALLELISM": json.dumps(self.parallelism.to_json()),
            "GLOBAL_BATCH": str(self.global_batch),
            "MANAGED": "1" if self.managed else "0",
        }
        if self.target is not None:
            env["TARGET"] = str(self.target)
        return {ENV_PREFIX + k: v for k, v in env.items()}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobConfig:
        """Read the launcher's variables (and SLURM_JOB_ID)."""

        def get(key: str, default: str) -> str:
            return env.get(ENV_PREFIX + key, default)

        try:
            max_frozen = float(get("MAX_FROZEN", "0.9"))
            max_epochs = int(get("MAX_EPOCHS", "100"))
            max_physical_epochs = int(get("MAX_PHYSICAL_EPOCHS", "0"))
            seed = int(get("SEED", "0"))
            global_batch = int(get("GLOBAL_BATCH", "0"))
        except ValueError as exc:
            raise InputError(f"{ENV_PREFIX}*: {exc}") from None
        target_text = get("TARGET", "")
        managed = get("MANAGED", "1")  # unset: a trainer started without the launcher
        if managed not in ("0", "1"):
            raise InputError(f"{ENV_PREFIX}MANAGED: must be 0 or 1, got {managed!r}")
        config = cls(
            gpus=parse_range(get("GPUS", "1"), "gpus"),
            batch=parse_range(get("BATCH", "32"), "batch"),
            max_frozen=max_frozen,
            target=parse_target(target_text) if target_text else None,
            max_epochs=max_epochs,
            max_physical_epochs=max_physical_epochs,
            workdir=get("WORKDIR", "."),
            inbox=get("INBOX", ""),
            decision=get("DECISION", ""),
            job_name=get("JOB_NAME", "job"),
            slurm_job_id=env.get("SLURM_JOB_ID", "0"),
            seed=seed,
            parallelism=_env_parallelism(get("PARALLELISM", "")),
            global_batch=global_batch,
            managed=managed == "1",
        )
        config.validate()
        return config

    @property
    def declaration(self) -> Declaration:
        return Declaration(
            gpus=self.gpus,
            batch=self.batch,
            max_frozen=self.max_frozen,
            target=self.target,
            max_epochs=self.max_epochs,
            parallelism=self.parallelism,
            global_batch=self.global_batch,
            max_physical_epochs=self.max_physical_epochs,
        )

    @property
    def accepts_shared(self) -> bool:
        return self.declaration.accepts_shared

    def validate(self) -> None:
        self.declaration.validate()
        if not self.slurm_job_id.isdigit():
            raise InputError(f"SLURM_JOB_ID: must be a number, got {self.slurm_job_id!r}")


def _env_parallelism(text: str) -> Parallelism:
    if not text:
        return DDP
    try:
        doc = json.loads(text)
    except ValueError:
        raise InputError(f"{ENV_PREFIX}PARALLELISM: not JSON: {text!r}") from None
    return Parallelism.from_json(doc, f"{ENV_PREFIX}PARALLELISM")
