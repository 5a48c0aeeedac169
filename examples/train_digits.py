"""Train a small model on scikit-learn's bundled digits (offline, 1797 8x8 images) with the
icefrog Model Trainer. Run under ``icefrog launch`` or plain torchrun, e.g.

    ICEFROG_TARGET='val_acc>=0.95' ICEFROG_WORKDIR=/tmp/d torchrun --nproc-per-node 2 \
        examples/train_digits.py --model cnn

The lines marked ``# icefrog`` are what the trainer adds to an ordinary loop.
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from icefrog_launcher import Trainer


def digits(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    xs = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    ys = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(ys), generator=torch.Generator().manual_seed(seed))
    train, val = order[:1500], order[1500:]
    return TensorDataset(xs[train], ys[train]), TensorDataset(xs[val], ys[val])


def make_model(kind: str) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Sequential(nn.Linear(64, 128), nn.ReLU()),
            nn.Sequential(nn.Linear(128, 128), nn.ReLU()),
            nn.Sequential(nn.Linear(128, 64), nn.ReLU()),
            nn.Linear(64, 10),
        )
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Flatten()),
        nn.Sequential(nn.Linear(32 * 16, 64), nn.ReLU()),
        nn.Linear(64, 10),
    )


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    device = next(model.parameters()).device  # the trainer moved the model (CUDA when present)
    with torch.no_grad():
        x, y = (t.to(device) for t in data.tensors)
        correct = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return correct


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--step-delay", type=float, default=0.0,
        help="seconds to sleep after each step: a slower job, as a bigger model would be",
    )  # fmt: skip
    args = parser.parse_args()
    torch.manual_seed(0)  # the same initial weights on every rank
    train, val = digits()
    model = make_model(args.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    trainer = Trainer(model, optimizer, train)  # icefrog
    for _epoch in trainer.epochs():  # icefrog
        for x, y in trainer.loader:  # icefrog
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()  # icefrog: trainer.model
            optimizer.step()
            time.sleep(args.step_delay)
        trainer.report_metric(accuracy(model, val))  # icefrog


if __name__ == "__main__":
    main()
