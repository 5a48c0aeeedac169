"""The elastic data loader: every replica takes its share of one global sequence of
samples, so the data position is a single number (samples consumed in the epoch) that
survives a restart with another process count or per-GPU batch.

The epoch's order is a permutation seeded by (seed, epoch), the same on every rank. A step
takes the next ``world x batch`` indices; rank r gets the r-th of ``world`` near-equal
slices. A remainder smaller than ``world`` is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

if TYPE_CHECKING:
    from launcher.trainer import Trainer


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(size)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=generator)


class ElasticDataLoader:
    """Iterates the current epoch from the trainer's data position with its current batch."""

    def __init__(self, trainer: Trainer, dataset: Dataset[Any], shuffle: bool = True) -> None:
        self.trainer = trainer
        self.dataset = dataset
        self.shuffle = shuffle
        self.size = len(dataset)  # type: ignore[arg-type]

    def __len__(self) -> int:
        t = self.trainer
        left = max(self.size - t.position, 0)
        return -(-left // (t.batch * t.world))

    def fetch(self, indices: torch.Tensor) -> Any:
        if isinstance(self.dataset, TensorDataset):
            return tuple(tensor[indices] for tensor in self.dataset.tensors)
        return default_collate([self.dataset[int(i)] for i in indices])

    def __iter__(self) -> Iterator[Any]:
        t = self.trainer
        order = epoch_order(self.size, t.config.seed, t.epoch, self.shuffle)
        while True:
            t.step_boundary()  # may checkpoint and exit (requeue) on a stop signal
            start, step = t.position, t.batch * t.world
            if self.size - start < t.world:
                t.position = self.size
                return
            indices = order[start : start + step]
            mine = indices.tensor_split(t.world)[t.rank]
            batch = self.fetch(mine)
            t.consumed(len(indices), len(mine))
            yield t.to_device(batch)
