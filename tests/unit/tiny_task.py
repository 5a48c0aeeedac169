"""A four-class task on 8 features and its small MLP, for Trainer tests in one process
(the caller has imported torch, or skipped without it)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset


def data(n: int = 200) -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=gen)
    return TensorDataset(x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long())


def model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
