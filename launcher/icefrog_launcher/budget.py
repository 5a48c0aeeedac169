"""The work budget of a training job and the rule that ends it on its budget (spec sections
4-5). Pure: no torch, no I/O; the trainer applies it at every epoch end.

``--max-epochs N`` is a budget of full-model-equivalent epochs: the controller's remaining
work P starts at N x samples per epoch, and a sample trained with the first l layers
frozen advances it by psi(l) <= 1 (eq 2-3), so a job that trains at psi < 1 needs 1/psi
physical samples for each full-model one. The budget is spent when

    effective epochs = physical epochs - (samples done - effective samples done) / samples per epoch

reaches N: the physical epochs less the samples' worth that freezing withheld, (1 - psi)
x each sample trained under psi. With nothing ever frozen the two sample counts are equal
(both integers, summed exactly) and the job ends after exactly N physical epochs, as a job
that counts epochs. Samples of an epoch that were not trained at all (the loader's
remainder smaller than the process count, or a loop that leaves the epoch early) count as
trained at psi = 1, so they never lengthen the job.

``--max-physical-epochs C`` (optional, C >= N) caps the physical epochs whatever psi says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from icefrog_slurm.errors import InputError

Limit = Literal["max_epochs", "max_physical_epochs"]
"""The limit that ended a job, named as its option: ``max_epochs`` (the budget of
full-model-equivalent epochs is spent) or ``max_physical_epochs`` (the cap on physical
epochs)."""


@dataclass(frozen=True)
class WorkBudget:
    """``max_epochs`` full-model-equivalent epochs of ``samples_per_epoch`` samples, and an
    optional cap of ``max_physical_epochs`` physical epochs (0: none)."""

    max_epochs: int
    samples_per_epoch: int
    max_physical_epochs: int = 0

    def __post_init__(self) -> None:
        if self.max_epochs < 1:
            raise InputError(f"--max-epochs: must be >= 1, got {self.max_epochs}")
        if self.max_physical_epochs < 0:
            raise InputError(
                f"--max-physical-epochs: must be >= 1 (0: no cap), got {self.max_physical_epochs}"
            )
        if self.samples_per_epoch < 1:
            raise InputError("the training set is empty: no samples per epoch")

    @property
    def samples(self) -> int:
        """P_0 = max_epochs x samples_per_epoch, the full-model-equivalent samples to train."""
        return self.max_epochs * self.samples_per_epoch

    def effective_epochs(self, *, epochs: int, samples_done: int, effective_done: float) -> float:
        """Physical ``epochs`` less the epochs' worth freezing withheld
        (``samples_done - effective_done``, the sum of (1 - psi) over the samples trained)."""
        return epochs - (samples_done - effective_done) / self.samples_per_epoch

    def ended_by(self, *, epochs: int, samples_done: int, effective_done: float) -> Limit | None:
        """The limit that ends the job after ``epochs`` finished epochs, or None to go on.
        When both hold, ``max_epochs``: the job did all its work."""
        done = self.effective_epochs(
            epochs=epochs, samples_done=samples_done, effective_done=effective_done
        )
        if done >= self.max_epochs:
            return "max_epochs"
        if self.max_physical_epochs and epochs >= self.max_physical_epochs:
            return "max_physical_epochs"
        return None
