"""The elastic data loader: every replica takes its share of one global sequence of
samples, so the data position is a single number (samples consumed in the epoch) that
survives a restart with another process count or per-GPU batch.

The epoch's order is a permutation seeded by (seed, epoch), the same on every rank. A step
takes the next ``world x batch`` indices; rank r gets the r-th of ``world`` near-equal
slices. A remainder smaller than ``world`` is skipped.

The loader knows the trainer only through the shared
:class:`~icefrog_launcher.position.DataPosition` (which it reads and moves forward) and the
three callables it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import TensorDataset, default_collate

from icefrog_launcher.position import DataPosition


class SizedDataset(Protocol):
    """What the loader needs of a dataset: a length and samples by index (a map-style
    ``torch.utils.data.Dataset`` with ``__len__``, e.g. ``TensorDataset``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(size)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=generator)


def _no_op() -> None:
    return None


def _no_count(global_count: int, local_count: int) -> None:
    return None


def _as_is(batch: Any) -> Any:
    return batch


class ElasticDataLoader:
    """Iterates the current epoch from ``position`` with its current per-GPU batch.

    ``before_step`` runs before each step (the trainer may checkpoint and exit there);
    ``on_step(global_count, local_count)`` after a step's indices are taken and the
    position moved past them; ``to_device`` moves the batch this rank yields."""

    def __init__(
        self,
        dataset: SizedDataset,
        position: DataPosition,
        *,
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        before_step: Callable[[], None] = _no_op,
        on_step: Callable[[int, int], None] = _no_count,
        to_device: Callable[[Any], Any] = _as_is,
    ) -> None:
        self.dataset = dataset
        self.position = position
        self.rank, self.world, self.seed = rank, world, seed
        self.shuffle = shuffle
        self.size = len(dataset)
        self._before_step = before_step
        self._on_step = on_step
        self._to_device = to_device

    def __len__(self) -> int:
        at = self.position
        left = max(self.size - at.samples, 0)
        return -(-left // (at.batch * self.world))

    def fetch(self, indices: torch.Tensor) -> Any:
        if isinstance(self.dataset, TensorDataset):
            return tuple(tensor[indices] for tensor in self.dataset.tensors)
        return default_collate([self.dataset[int(i)] for i in indices])

    def __iter__(self) -> Iterator[Any]:
        at = self.position
        order = epoch_order(self.size, self.seed, at.epoch, self.shuffle)
        while True:
            self._before_step()  # may checkpoint and exit (requeue) on a stop signal
            start, step = at.samples, at.batch * self.world
            if self.size - start < self.world:
                at.samples = self.size
                return
            indices = order[start : start + step]
            mine = indices.tensor_split(self.world)[self.rank]
            batch = self.fetch(mine)
            at.samples += len(indices)
            self._on_step(len(indices), len(mine))
            yield self._to_device(batch)
