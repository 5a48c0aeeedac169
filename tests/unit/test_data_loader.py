"""The elastic data loader on its own: it reads and moves only the shared DataPosition, and
a position saved mid-epoch resumes the same order with another process count and batch."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import TensorDataset  # noqa: E402

from icefrog_launcher.data import ElasticDataLoader, epoch_order  # noqa: E402
from icefrog_launcher.position import DataPosition  # noqa: E402

pytestmark = pytest.mark.torch

SIZE = 23


def _dataset() -> TensorDataset:
    return TensorDataset(torch.arange(SIZE))


def _take(position: DataPosition, world: int, steps: int | None = None) -> list[list[int]]:
    """Every rank's samples, step by step, over one shared copy of the position each."""
    ranks: list[list[int]] = []
    for rank in range(world):
        at = dataclasses.replace(position)
        loader = ElasticDataLoader(_dataset(), at, rank=rank, world=world, seed=5)
        seen: list[int] = []
        for n, (x,) in enumerate(loader):
            seen += x.tolist()
            if steps is not None and n + 1 == steps:
                break
        ranks.append(seen)
    return ranks


def test_the_loader_moves_the_shared_position_and_skips_a_short_remainder() -> None:
    at = DataPosition(epoch=2, samples=0, batch=4)
    counts: list[tuple[int, int]] = []
    boundaries: list[int] = []
    loader = ElasticDataLoader(
        _dataset(),
        at,
        rank=1,
        world=3,
        seed=5,
        before_step=lambda: boundaries.append(at.samples),
        on_step=lambda g, m: counts.append((g, m)),
    )
    assert len(loader) == 2  # 23 samples, 12 a step
    batches = [x.tolist() for (x,) in loader]
    order = epoch_order(SIZE, 5, 2, True).tolist()
    assert batches == [order[4:8], order[16:20]]  # rank 1's slice of each step (11 = 4+4+3)
    assert counts == [(12, 4), (11, 4)] and boundaries == [0, 12, 23]
    assert at == DataPosition(epoch=2, samples=SIZE, batch=4)
    short = DataPosition(epoch=2, samples=SIZE - 2, batch=4)  # 2 left, fewer than world
    assert list(ElasticDataLoader(_dataset(), short, world=3, seed=5)) == []
    assert short.samples == SIZE


def test_a_position_saved_mid_epoch_resumes_the_order_with_another_world_and_batch() -> None:
    before = _take(DataPosition(epoch=1, samples=0, batch=3), world=2, steps=2)
    after = _take(DataPosition(epoch=1, samples=12, batch=5), world=3)
    seen = sorted(i for rank in before + after for i in rank)
    assert seen == list(range(SIZE))  # every sample once: 12 before, 11 after
    assert sum(map(len, before)) == 12
