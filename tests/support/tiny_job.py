"""A one-process training job for the trainer's tests: a small regression set, an MLP of
three layers, a job config with its inbox in a test folder, and the ordinary loop."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from icefrog_launcher import Trainer
    from icefrog_launcher.config import JobConfig


def tiny_job(
    folder: Path, *, samples: int, batch: tuple[int, int], max_epochs: int, job_id: str
) -> tuple[Any, JobConfig]:
    """(dataset, config): ``samples`` random (8 inputs, 1 target) pairs, seeded, and a job
    whose reports go to ``folder / "inbox"``."""
    import torch

    from icefrog_launcher.config import JobConfig

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    config = JobConfig(
        batch=batch, workdir=str(folder), max_epochs=max_epochs, inbox=str(folder / "inbox"),
        slurm_job_id=job_id,
    )  # fmt: skip
    return data, config


def tiny_mlp() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def train(trainer: Trainer, optimizer: Any) -> int:
    """The user's loop until the trainer ends it; the optimizer steps taken."""
    import torch

    steps = 0
    for _ in trainer.epochs():
        for x, y in trainer.loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(trainer.model(x), y).backward()
            optimizer.step()
            steps += 1
        trainer.report_metric(0.5)
    return steps
