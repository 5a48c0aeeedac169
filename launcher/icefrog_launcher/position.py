"""The data position the trainer and its loader share, and nothing else of each other.

The trainer owns one :class:`DataPosition`: it sets the per-GPU batch from the controller's
decision, starts the next epoch, and checkpoints and restores the position. The loader
(icefrog_launcher.data) reads it and moves it forward as it hands out batches. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataPosition:
    """Where the data of the job stands. Every replica takes its share of one global
    sequence of samples, so the position survives a restart with another process count
    or per-GPU batch (icefrog_launcher.data)."""

    epoch: int = 0
    """Epochs finished: the one being read (its order is seeded by it)."""
    samples: int = 0
    """Samples of this epoch consumed, all replicas together (the checkpoint's
    ``position``)."""
    batch: int = 1
    """Per-GPU batch of the next step (the decision's m, within the declared range)."""
