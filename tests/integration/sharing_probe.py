"""A training script for the sharing-failure test: a small MLP on random data whose forward
raises ``torch.cuda.OutOfMemoryError`` at step PROBE_OOM_AT (counted from the run's start;
unset: never), as a job running past its CUDA MPS memory limit does. CPU only."""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from icefrog_launcher import Trainer


class RunsOutOfMemory(nn.Module):
    """The MLP's forward, failing as CUDA does at call ``fail_at`` (0: never)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.calls = fail_at, 0
        self.inner = nn.Linear(16, 32)
        self.outer = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.training and self.calls == self.fail_at:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.outer(torch.relu(self.inner(x)))


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    model = RunsOutOfMemory(int(os.environ.get("PROBE_OOM_AT", "0")))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, optimizer, data, layers=[model.inner, model.outer])
    for _epoch in trainer.epochs():
        for x, y in trainer.loader:
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()
            optimizer.step()
        trainer.report_metric(0.0)


if __name__ == "__main__":
    main()
