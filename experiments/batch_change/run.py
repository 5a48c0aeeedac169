"""Batch elasticity on the CPU: does a job whose global batch the controller changes twice
mid-run reach its target in no more effective epochs than the fixed-batch run, and with
which learning-rate rule (icefrog_launcher.lr)?

Model and data: the digits MLP of examples/train_digits.py (or its CNN, ``--model cnn``;
scikit-learn's bundled digits, 1500 training and 297 validation images, offline), SGD with
momentum 0.9 (or Adam, ``--optimizer adam``) at the learning rate tuned for the base batch
(``--lr``, README.md), the real Model Trainer in this process
(one process, so the global batch is the per-GPU batch). For each seed:

- the fixed run trains at the base batch B0 (``--base``) throughout;
- a changed run per schedule of ``--changes`` and rule (none, linear, sqrt, adascale):
  the "controller" writes a new decision.json (protocol.Decision, the file the trainer
  reads at each epoch end, as the real controller does) at the schedule's two epochs,
  changing the per-GPU batch (by default 16 -> 32 -> 64, 16 -> 64 -> 128 and 16 -> 64 ->
  32: up as GPUs are added, and down again);
- both end at the target (``train_loss <= --target``, the cross-entropy over the whole
  training set, reported with ``trainer.report_metric``: the trainer's own end rule,
  checked at epoch ends) or the work budget (``--max-epochs``). Besides, the loop
  measures it every ``--probe`` of an epoch, so "epochs to target" is the first fraction
  of an epoch at which it held (finer than the trainer's epoch ends).

No layer is frozen here, so effective (full-model-equivalent) epochs are epochs trained.
It prints a line a run and a table per schedule, and writes experiments/batch_change/results.md
(results-cnn.md with ``--model cnn``) unless ``--no-doc``. ``--changes`` with no schedule
runs the fixed runs alone: the sweep that tunes ``--lr`` for the base batch.
Not part of the test suite. From the repository root:

    PYTHONPATH=.:launcher nice -n 10 python experiments/batch_change/run.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from icefrog_launcher import Trainer
from icefrog_launcher.config import JobConfig
from icefrog_launcher.lr import RULES
from icefrog_slurm.declaration import parse_target
from icefrog_slurm.protocol import Decision
from icefrog_slurm.security import write_atomic

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "train_digits", REPO / "examples" / "train_digits.py"
)
assert _spec is not None and _spec.loader is not None
digits_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(digits_example)


@dataclass
class Result:
    run: str
    seed: int
    reached: float | None  # epochs (fractional, by the probes) to the target; None: never
    epochs: int  # epochs the trainer trained before it ended
    effective: float  # full-model-equivalent epochs at the end (trainer's count)
    steps: int  # optimizer steps to the end
    finished: str
    final_acc: float  # validation accuracy at the end


OPTIMIZERS = {"sgd": "SGD momentum 0.9", "adam": "Adam"}
MODELS = {"mlp": "MLP", "cnn": "CNN"}


def train(args: argparse.Namespace, seed: int, rule: str, changes: dict[int, int]) -> Result:
    torch.manual_seed(seed)
    train_set, val = digits_example.digits(seed)
    model = digits_example.make_model(args.model)
    optimizer: torch.optim.Optimizer
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    hi = max([args.base, *changes.values()])
    with tempfile.TemporaryDirectory() as work:
        config = JobConfig(
            batch=(args.base, hi),
            target=parse_target(f"train_loss<={args.target}"),
            max_epochs=args.max_epochs,
            workdir=work,
            seed=seed,
        )
        decision = Path(config.decision_path)
        write_atomic(decision, Decision(0, 1, args.base, 0).to_json().encode())
        trainer = Trainer(model, optimizer, train_set, config=config, env={}, lr_rule=rule)
        size, probe_every = len(train_set), max(1, int(len(train_set) * args.probe))
        reached: float | None = None
        seen = 0
        for epoch in trainer.epochs():
            for x, y in trainer.loader:
                optimizer.zero_grad()
                F.cross_entropy(trainer.model(x), y).backward()
                optimizer.step()
                seen += len(y)
                probe = reached is None and seen % probe_every < len(y)
                if probe and train_loss(model, train_set) <= args.target:
                    reached = seen / size
            loss = train_loss(model, train_set)
            if reached is None and loss <= args.target:
                reached = seen / size
            trainer.report_metric(loss)
            if epoch + 1 in changes:  # the controller's next decision (a new round)
                batch = changes[epoch + 1]
                write_atomic(decision, Decision(epoch + 1, 1, batch, 0).to_json().encode())
        return Result(
            run=rule if changes else "fixed",
            seed=seed,
            reached=reached,
            epochs=trainer.epoch,
            effective=trainer.effective_done / size,
            steps=trainer.step,
            finished=trainer.finished,
            final_acc=digits_example.accuracy(model, val),
        )


def train_loss(model: torch.nn.Module, data: torch.utils.data.TensorDataset) -> float:
    """The mean cross-entropy over the whole training set (the target's metric: smoother
    than the accuracy of 297 validation images, which moves by 0.0034 an image)."""
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        loss = float(F.cross_entropy(model(x), y))
    model.train()
    return loss


def parse_changes(text: str) -> dict[int, int]:
    out = {}
    for part in text.split(","):
        epoch, batch = part.split(":")
        out[int(epoch)] = int(batch)
    return out


def _fmt(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--target", type=float, default=0.05, help="training loss")
    parser.add_argument(
        "--lr", type=float, default=0.04, help="the user's lr, tuned for --base (fixed run)"
    )
    parser.add_argument("--base", type=int, default=16, help="base batch B0")
    parser.add_argument(
        "--changes",
        nargs="*",
        default=["2:32,4:64", "2:64,4:128", "2:64,4:32"],
        help="schedules of the controller's decisions, each epoch:batch,epoch:batch "
        "(none: the fixed runs alone)",
    )
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--probe", type=float, default=0.25, help="loss probe, epochs")
    parser.add_argument("--rules", nargs="+", default=list(RULES))
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="sgd: momentum 0.9; adam: torch's defaults but the lr")  # fmt: skip
    parser.add_argument("--model", choices=MODELS, default="mlp")
    parser.add_argument("--no-doc", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.monotonic()
    results: dict[str, list[Result]] = {}
    fixed_runs: list[Result] = []
    for seed in args.seeds:
        fixed = train(args, seed, "none", {})
        fixed_runs.append(fixed)
        _say("fixed", fixed)
        for schedule in args.changes:
            results.setdefault(schedule, []).append(fixed)
            for rule in args.rules:
                result = train(args, seed, rule, parse_changes(schedule))
                results[schedule].append(result)
                _say(schedule, result)
    seconds = time.monotonic() - start
    lines = [
        f"Digits {MODELS[args.model]}, {OPTIMIZERS[args.optimizer]}, lr {args.lr} for the base "
        f"batch {args.base}; "
        f"target: training loss <= {args.target} (at most {args.max_epochs} epochs); seeds "
        f"{' '.join(map(str, args.seeds))}; {seconds:.0f} s.",
    ]
    for schedule, rows in results.items():
        lines += ["", *summary(rows, args, schedule)]
    if not args.changes:
        lines += ["", *summary(fixed_runs, args, "")]
    print("\n".join(lines))
    if not args.no_doc:
        name = "results.md" if args.model == "mlp" else f"results-{args.model}.md"
        (REPO / "experiments" / "batch_change" / name).write_text("\n".join(lines) + "\n")


def _say(schedule: str, r: Result) -> None:
    print(
        f"seed {r.seed} {schedule:11s} {r.run:9s} to target {_fmt(r.reached)} epochs; "
        f"trainer: {r.epochs} epochs, {r.effective:.2f} effective, {r.steps} steps, "
        f"{r.finished}, final val acc {r.final_acc:.3f}",
        flush=True,
    )


def summary(results: list[Result], args: argparse.Namespace, schedule: str) -> list[str]:
    """The table of one schedule's runs ("": the fixed runs alone)."""
    runs = ["fixed", *args.rules] if schedule else ["fixed"]
    base = {r.seed: r for r in results if r.run == "fixed"}
    title = (
        f"Decisions after epochs {schedule} (epoch:per-GPU batch; from {args.base}):"
        if schedule
        else f"The fixed runs alone (per-GPU batch {args.base} throughout):"
    )
    lines = [
        title,
        "",
        "| run | effective epochs at the end (trainer), mean (min-max) | <= fixed (seeds) | "
        "epochs to target by the probe, mean | vs fixed | optimizer steps | val acc |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        rows = [r for r in results if r.run == run]
        eff = [r.effective for r in rows if r.finished == "target_reached"]
        span = f"{statistics.mean(eff):.2f} ({min(eff):.0f}-{max(eff):.0f})" if eff else "-"
        within = sum(
            r.finished == "target_reached" and r.effective <= base[r.seed].effective + 1e-9
            for r in rows
        )
        got = [r.reached for r in rows if r.reached is not None]
        ratios = [
            r.reached / fixed
            for r in rows
            if r.reached is not None and (fixed := base[r.seed].reached)
        ]
        probe = f"{statistics.mean(got):.2f}" if got else "-"
        ratio = f"{statistics.mean(ratios):.2f}" if ratios else "-"
        lines.append(
            f"| {run} | {span} | {within}/{len(rows)} | {probe} | {ratio} | "
            f"{statistics.mean(r.steps for r in rows):.0f} | "
            f"{statistics.mean(r.final_acc for r in rows):.3f} |"
        )
    return lines


if __name__ == "__main__":
    main()
