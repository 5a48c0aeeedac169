"""A training script for the torchrun tests: the digits MLP of examples/train_digits.py with
probes that record what the tests check. PROBE_MODE selects the scenario:

- ``freeze``: epoch 0 trains everything; the script then writes a decision freezing the
  first two layers (epoch 1), then one unfreezing them (epoch 2). Records gradients,
  boundary activations, parameters and Adam state of the frozen layers.
- ``resize``: at the end of epoch PROBE_RESIZE_AT rank 0 writes a decision asking for one
  GPU and a per-GPU batch of 64 (the same global batch), so the trainer checkpoints and
  exits 75; run again with one process to finish.
- ``plain``: no decisions.

Results go to PROBE_OUT (JSON, rank 0).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

from icefrog_launcher import Trainer
from icefrog_slurm.protocol import Decision
from icefrog_slurm.security import write_atomic

_spec = importlib.util.spec_from_file_location(
    "train_digits", Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"
)
assert _spec is not None and _spec.loader is not None
digits_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(digits_example)


def frozen_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, list]:
    params = list(model[1].parameters()) + list(model[2].parameters())
    return {
        "params": [p.detach().clone().flatten().tolist() for p in params],
        "exp_avg": [optimizer.state[p]["exp_avg"].flatten().tolist() for p in params],
        "step": [float(optimizer.state[p]["step"]) for p in params],
    }


def main() -> None:
    mode = os.environ.get("PROBE_MODE", "plain")
    workdir = Path(os.environ["ICEFROG_WORKDIR"])
    torch.manual_seed(0)
    train, val = digits_example.digits()
    model = digits_example.make_model("mlp")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(model, optimizer, train, stats_every=4)
    out: dict[str, object] = {"epochs": [], "rank": trainer.rank, "world": trainer.world}
    boundary: list[bool] = []
    # the output of the last layer of the frozen prefix (layer index 2)
    model[2].register_forward_hook(lambda m, i, o: boundary.append(bool(o.requires_grad)))
    decisions = {0: Decision(1, trainer.world, 32, 3), 1: Decision(2, trainer.world, 32, 0)}
    resize_at = int(os.environ.get("PROBE_RESIZE_AT", "-1"))
    for epoch in trainer.epochs():
        record: dict[str, object] = {"epoch": epoch, "frozen": trainer.frozen}
        boundary.clear()
        numel0 = trainer.synced_numel
        grads_none = []
        first_step = None
        for x, y in trainer.loader:
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()
            grads_none.append([p.grad is None for p in model.parameters()])
            if mode == "freeze" and epoch == 2 and first_step is None:
                first_step = {"grad": [p.grad.flatten().tolist() for p in model[1].parameters()]}
            optimizer.step()
            if first_step is not None and "after" not in first_step:
                first_step["after"] = frozen_state(model, optimizer)
        record["steps"] = len(grads_none)
        record["grad_none"] = [all(col) for col in zip(*grads_none, strict=True)]
        record["boundary_requires_grad"] = sorted(set(boundary))
        record["synced_per_step"] = (trainer.synced_numel - numel0) / max(len(grads_none), 1)
        record["trainable_numel"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if mode == "freeze" and epoch in (0, 1):
            record["state"] = frozen_state(model, optimizer)
        if first_step is not None:
            record["first_step"] = first_step
        acc = digits_example.accuracy(model, val)
        record["val_acc"] = acc
        out["epochs"].append(record)  # type: ignore[attr-defined]
        decision = decisions.get(epoch) if mode == "freeze" else None
        if mode == "resize" and epoch == resize_at:
            decision = Decision(10, 1, 64, 0)
        if decision is not None and trainer.rank == 0:
            write_atomic(Path(trainer.config.decision_path), decision.to_json().encode())
        out.update(samples_done=trainer.samples_done, effective=trainer.effective_done)
        if trainer.rank == 0:
            Path(os.environ["PROBE_OUT"]).write_text(json.dumps(out))
        trainer.report_metric(acc)
    out.update(
        finished=trainer.finished,
        samples_done=trainer.samples_done,
        effective=trainer.effective_done,
        final_acc=digits_example.accuracy(model, val),
        grad_stats=[trainer.stats.last_var, trainer.stats.frozen_var],
    )
    if trainer.rank == 0:
        Path(os.environ["PROBE_OUT"]).write_text(json.dumps(out))
    del workdir
    sys.exit(0)


if __name__ == "__main__":
    main()
