"""The user guide's quickstart: an ordinary PyTorch loop (a map-style Dataset read by
DataLoader workers, an LR scheduler) made a managed icefrog job. The lines marked
``# icefrog`` are the whole change; ``quickstart.sbatch`` submits it."""

import argparse

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from icefrog_launcher import Trainer  # icefrog


class Blobs(Dataset):
    """Points around four centres, labelled by their centre."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 4, (n,), generator=g)
        centres = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [2.0, -2.0], [-2.0, -2.0]])
        self.x = centres[self.y] + torch.randn(n, 2, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def accuracy(model: nn.Module, data: Blobs) -> float:
    with torch.no_grad():
        return (model(data.x).argmax(1) == data.y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(
        nn.Sequential(nn.Linear(2, 32), nn.ReLU()),
        nn.Sequential(nn.Linear(32, 32), nn.ReLU()),
        nn.Linear(32, 4),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)
    train, val = Blobs(4096, seed=1), Blobs(1024, seed=2)
    # was: loader = DataLoader(train, batch_size=64, shuffle=True, num_workers=2)
    trainer = Trainer(  # icefrog
        model, optimizer, train, scheduler=scheduler, loader_args={"num_workers": 2}
    )
    for _epoch in trainer.epochs():  # icefrog: was `for epoch in range(20)`
        for x, y in trainer.loader:  # icefrog: was `loader`
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()  # icefrog: trainer.model
            optimizer.step()
        scheduler.step()
        trainer.report_metric(accuracy(model, val))  # icefrog


if __name__ == "__main__":
    main()
