"""A training script for the torchrun tests: the digits MLP of examples/train_digits.py with
probes that record what the tests check. PROBE_MODE selects the scenario:

- ``freeze``: epoch 0 trains everything; the script then writes a decision freezing the
  first two layers (epoch 1), then one unfreezing them (epoch 2). Records gradients,
  boundary activations, parameters and Adam state of the frozen layers.
- ``resize``: at the end of epoch PROBE_RESIZE_AT rank 0 writes a decision asking for one
  GPU and a per-GPU batch of 64 (the same global batch), so the trainer checkpoints and
  exits 75; run again with one process to finish.
- ``plain``: no decisions.
- ``objects``: SGD with a per-epoch CosineAnnealingLR (``scheduler=``), a
  ``torch.amp.GradScaler`` on the CPU (``scaler=``, growing its scale every 40 steps) and a
  user's step counter (``register_state``); with PROBE_RESIZE_AT as ``resize``. Records
  each epoch's learning rate, scaler state and count; after the loop, with several
  processes, an all-reduce (the group outlives the loop), then rank 0 works 2 s longer.
- ``global``: SGD with momentum, the loop of every mode, for a job declaring
  ``--global-batch``; records the optimizer steps, the all-reduced elements and the final
  parameters.

Results go to PROBE_OUT (JSON, rank 0).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
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


class StepCounter:
    """A user's object in the checkpoint: optimizer steps seen."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def main() -> None:
    mode = os.environ.get("PROBE_MODE", "plain")
    workdir = Path(os.environ["ICEFROG_WORKDIR"])
    torch.manual_seed(0)
    train, val = digits_example.digits()
    model = digits_example.make_model("mlp")
    optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = scaler = None
    counter = StepCounter()
    if mode in ("objects", "global"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if mode == "objects":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=6)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=40)
    trainer = Trainer(model, optimizer, train, stats_every=4, scheduler=sched, scaler=scaler)
    if mode == "objects":
        trainer.register_state("counter", counter)
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
        record["lr"] = optimizer.param_groups[0]["lr"]
        for x, y in trainer.loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(trainer.model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                counter.steps += 1
                grads_none.append([])
                continue
            loss.backward()
            grads_none.append([p.grad is None for p in model.parameters()])
            if mode == "freeze" and epoch == 2 and first_step is None:
                first_step = {"grad": [p.grad.flatten().tolist() for p in model[1].parameters()]}
            optimizer.step()
            if first_step is not None and "after" not in first_step:
                first_step["after"] = frozen_state(model, optimizer)
        if sched is not None:
            sched.step()
        if scaler is not None:
            record.update(scaler=scaler.state_dict(), counter=counter.steps)
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
        if mode in ("resize", "objects") and epoch == resize_at:
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
        optimizer_steps=trainer.step,
        synced_numel=trainer.synced_numel,
        trainable_numel=sum(p.numel() for p in model.parameters() if p.requires_grad),
        params=[p.detach().flatten().tolist() for p in model.parameters()],
    )
    if mode == "objects" and torch.distributed.is_initialized():
        # the group is still there after the loop; rank 0 then works on while the others
        # go to their exit first, which waits for it (the trainer's end of the run)
        total = torch.tensor([float(trainer.rank + 1)])
        torch.distributed.all_reduce(total)
        out["after_loop_sum"] = float(total)
        if trainer.rank == 0:
            time.sleep(2.0)
    if trainer.rank == 0:
        Path(os.environ["PROBE_OUT"]).write_text(json.dumps(out))
    del workdir
    sys.exit(0)


if __name__ == "__main__":
    main()
