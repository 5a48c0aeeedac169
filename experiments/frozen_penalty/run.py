"""The spec's section 5 check at small scale on the CPU: is the psi-compensated budget (eq 3)
enough for a job frozen mid-training to reach its target, when the unfrozen budget is not?

Model and data: a 8-layer CNN on scikit-learn's bundled digits (1797 8x8 images, offline),
plain SGD. For each seed:

1. train all layers until the validation accuracy first reaches the target: N_full
   iterations (evaluated every ``--eval-every`` iterations), in epoch E_full; E_full is the
   job's ``--max-epochs``, the budget a user who knew it would declare;
2. from the checkpoint at the freeze epoch (N_f iterations) train two branches with the
   first 25% and 50% of the layers frozen (no gradient, no backward work), measuring the
   per-layer gradient variance with the trainer's own estimator (icefrog_launcher.stats) and
   psi with eq 3 (icefrog_slurm.core.penalty) at every epoch end, as the trainer does;
3. unfrozen budget = E_full epochs trained (``--max-physical-epochs E_full``, the
   uncompensated count); psi-compensated budget = the epoch end at which the Model
   Trainer's own stop rule (icefrog_launcher.budget, ``--max-epochs E_full``) ends the job:
   its samples counted psi times each (effective progress, spec section 4) make E_full
   full-model-equivalent epochs.

It prints a table and writes docs/frozen_penalty.md (table, plot, command) and
docs/frozen_penalty.png. Not part of the test suite. Run from the repository root:

    PYTHONPATH=. python experiments/frozen_penalty/run.py
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

from icefrog_launcher.budget import WorkBudget
from icefrog_launcher.stats import GradStatsCollector

REPO = Path(__file__).resolve().parents[2]


def digits(
    seed: int,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    x, y = load_digits(return_X_y=True)
    xs = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    ys = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(ys), generator=torch.Generator().manual_seed(seed))
    train, val = order[:1400], order[1400:]
    return (xs[train], ys[train]), (xs[val], ys[val])


def make_model() -> nn.Sequential:
    """Eight layers (the units a freeze boundary may fall between)."""

    def conv(cin: int, cout: int, pool: bool = False) -> nn.Sequential:
        parts: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
        return nn.Sequential(*parts, nn.MaxPool2d(2)) if pool else nn.Sequential(*parts)

    return nn.Sequential(
        conv(1, 16),
        conv(16, 16),
        conv(16, 32, pool=True),
        conv(32, 32),
        conv(32, 32, pool=True),
        nn.Sequential(nn.Flatten(), nn.Linear(32 * 4, 64), nn.ReLU()),
        nn.Sequential(nn.Linear(64, 64), nn.ReLU()),
        nn.Linear(64, 10),
    )


@dataclass
class Run:
    """One trajectory: (iteration, validation accuracy) points and, after a freeze, psi."""

    curve: list[tuple[int, float]] = field(default_factory=list)
    psi: list[tuple[int, float]] = field(default_factory=list)  # (first iteration, psi)
    states: dict[int, dict[str, object]] = field(default_factory=dict)  # epoch -> state
    ended: tuple[int, int] | None = None  # (epochs, iteration) where the budget ended it

    def first_reach(self, target: float) -> int | None:
        return next((it for it, acc in self.curve if acc >= target), None)

    def acc_at(self, iteration: int) -> float:
        """Best validation accuracy seen up to ``iteration`` (what a job that stops there
        and keeps its best checkpoint would have)."""
        seen = [acc for it, acc in self.curve if it <= iteration]
        return max(seen) if seen else 0.0


@dataclass
class Trainer:
    """Plain SGD over the digits with an optional frozen prefix."""

    model: nn.Sequential
    optimizer: torch.optim.Optimizer
    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    batch: int
    eval_every: int
    stats: GradStatsCollector
    frozen: int = 0
    iteration: int = 0
    epoch: int = 0
    samples_done: int = 0  # counted as the Model Trainer counts them
    effective_done: float = 0.0  # each sample x psi of its epoch (spec section 4)

    def accuracy(self) -> float:
        self.model.eval()
        with torch.no_grad():
            x, y = self.val
            acc = (self.model(x).argmax(1) == y).float().mean().item()
        self.model.train()
        return acc

    def freeze(self, layers: int) -> None:
        """Freeze the first ``layers`` layers: no gradient, and backward stops at the
        boundary because nothing before it requires a gradient."""
        self.stats.freeze_changed(self.frozen, layers)
        self.frozen = layers
        for i, layer in enumerate(self.model):
            for p in layer.parameters():
                p.requires_grad_(i >= layers)

    def _trainable(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        index, params = [], []
        for i, layer in enumerate(self.model):
            if i >= self.frozen:
                for p in layer.parameters():
                    index.append(i)
                    params.append(p)
        return torch.tensor(index), params

    def run_epoch(self, run: Run, seed: int, budget: WorkBudget | None = None) -> None:
        """One epoch; with ``budget``, record in ``run.ended`` the epoch end at which the
        trainer's stop rule ends the job (psi of the epoch: eq 3 on the latest statistics,
        as the trainer sets it at each epoch end)."""
        psi = self.stats.penalty(self.frozen)
        x, y = self.train
        order = torch.randperm(
            len(y), generator=torch.Generator().manual_seed(seed * 1000 + self.epoch)
        )
        index, params = self._trainable()
        for start in range(0, len(y) - self.batch + 1, self.batch):
            pick = order[start : start + self.batch]
            self.optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(self.model(x[pick]), y[pick]).backward()
            if self.stats.measuring(self.iteration, 1):
                grads = [p.grad for p in params if p.grad is not None]
                self.stats.finish_step(
                    index, grads, step=self.iteration, local_batch=self.batch, world=1
                )
            self.optimizer.step()
            self.iteration += 1
            self.samples_done += self.batch
            self.effective_done += psi * self.batch
            if self.iteration % self.eval_every == 0:
                run.curve.append((self.iteration, self.accuracy()))
        self.stats.end_epoch(self.frozen)
        self.epoch += 1
        if budget is not None and run.ended is None:
            done = (self.epoch, self.samples_done, self.effective_done)
            if budget.ended_by(epochs=done[0], samples_done=done[1], effective_done=done[2]):
                run.ended = (self.epoch, self.iteration)


def baseline(args: argparse.Namespace, seed: int) -> tuple[Run, Trainer]:
    torch.manual_seed(seed)
    model = make_model()
    train, val = digits(seed)
    trainer = Trainer(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        train=train,
        val=val,
        batch=args.batch,
        eval_every=args.eval_every,
        stats=GradStatsCollector(len(model), every=args.stats_every),
    )
    run = Run()
    while trainer.epoch < args.max_epochs:
        run.states[trainer.epoch] = copy.deepcopy(
            {"model": model.state_dict(), "opt": trainer.optimizer.state_dict(),
             "stats": trainer.stats.state_dict(), "iteration": trainer.iteration,
             "samples": trainer.samples_done, "effective": trainer.effective_done,
             "acc": run.curve[-1][1] if run.curve else 0.0}
        )  # fmt: skip
        trainer.run_epoch(run, seed)
        if run.first_reach(args.target) is not None:
            break
    return run, trainer


def freeze_epoch(run: Run, args: argparse.Namespace) -> int | None:
    """``--freeze-epoch``, or the first epoch that starts with validation accuracy at least
    ``--freeze-at-acc`` (mid-training: the network has left its initial plateau)."""
    if args.freeze_epoch is not None:
        return args.freeze_epoch if args.freeze_epoch in run.states else None
    return next(
        (e for e, st in sorted(run.states.items()) if st["acc"] >= args.freeze_at_acc), None
    )  # type: ignore[operator]


def frozen_branch(
    args: argparse.Namespace,
    seed: int,
    state: dict[str, object],
    epoch: int,
    layers: int,
    budget: WorkBudget,
    stop: int,
) -> Run:
    """Continue from the freeze-epoch state with ``layers`` frozen until the budget has
    ended it and it has reached the target, or ``stop`` iterations."""
    model = make_model()
    model.load_state_dict(state["model"])  # type: ignore[arg-type]
    train, val = digits(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    optimizer.load_state_dict(state["opt"])  # type: ignore[arg-type]
    stats = GradStatsCollector(len(model), every=args.stats_every)
    stats.load_state_dict(state["stats"])  # type: ignore[arg-type]
    trainer = Trainer(model, optimizer, train, val, args.batch, args.eval_every, stats)
    trainer.iteration = int(state["iteration"])  # type: ignore[call-overload]
    trainer.samples_done = int(state["samples"])  # type: ignore[call-overload]
    trainer.effective_done = float(state["effective"])  # type: ignore[arg-type]
    trainer.epoch = epoch
    trainer.freeze(layers)
    run = Run()
    while trainer.iteration < stop and (run.ended is None or run.first_reach(args.target) is None):
        run.psi.append((trainer.iteration, stats.penalty(layers)))  # eq 3, latest statistics
        trainer.run_epoch(run, seed, budget)
    return run


@dataclass(frozen=True)
class Row:
    seed: int
    fraction: float
    layers: int
    n_full: int  # iterations of the unfrozen run to the target
    e_full: int  # its epochs: the declared --max-epochs
    per_epoch: int  # iterations an epoch
    n_freeze: int
    epoch: int  # the freeze epoch
    psi_mean: float
    ended: tuple[int, int] | None  # (epochs, iteration) where the trainer's rule ended it
    horizon: int  # iterations the branch ran at most
    acc_at_full: float
    acc_at_psi: float
    reached_at: int | None

    @property
    def full_at(self) -> int:
        """The unfrozen budget's last iteration: E_full epochs trained."""
        return self.e_full * self.per_epoch

    @property
    def reached_full(self) -> bool:
        return self.reached_at is not None and self.reached_at <= self.full_at

    @property
    def reached_psi(self) -> bool:
        end = self.horizon if self.ended is None else self.ended[1]
        return self.reached_at is not None and self.reached_at <= end


def experiment(
    args: argparse.Namespace,
) -> tuple[list[Row], dict[int, tuple[Run, dict[float, Run]]]]:
    rows: list[Row] = []
    curves: dict[int, tuple[Run, dict[float, Run]]] = {}
    for seed in args.seeds:
        base, trainer = baseline(args, seed)
        n_full = base.first_reach(args.target)
        epoch = freeze_epoch(base, args)
        if n_full is None or epoch is None:
            print(
                f"seed {seed}: the unfrozen run did not reach {args.target} "
                f"in {args.max_epochs} epochs"
            )
            continue
        state = base.states[epoch]
        n_freeze = int(state["iteration"])  # type: ignore[call-overload]
        per_epoch = len(trainer.train[1]) // args.batch
        e_full = trainer.epoch  # the epoch in which it reached the target, counted from 1
        budget = WorkBudget(max_epochs=e_full, samples_per_epoch=len(trainer.train[1]))
        branches: dict[float, Run] = {}
        for fraction in args.fractions:
            layers = round(fraction * len(trainer.model))
            stop = int(args.horizon * e_full * per_epoch)
            run = frozen_branch(args, seed, state, epoch, layers, budget, stop)
            at = stop if run.ended is None else run.ended[1]
            rows.append(
                Row(seed, fraction, layers, n_full, e_full, per_epoch, n_freeze, epoch,
                    statistics.fmean(p for _, p in run.psi), run.ended, stop,
                    run.acc_at(e_full * per_epoch), run.acc_at(at),
                    run.first_reach(args.target))
            )  # fmt: skip
            branches[fraction] = run
            print(_line(rows[-1]), flush=True)
        curves[seed] = (base, branches)
    return rows, curves


HEADER = (
    "| seed | frozen | N_full (E_full) | N_f (freeze epoch) | mean psi | unfrozen budget "
    "| acc there | psi-compensated budget | acc there | frozen run reaches target at |"
)


def _epochs_at(iteration: int, epochs: int) -> str:
    return f"{iteration} ({epochs} ep)"


def _line(r: Row) -> str:
    reach = "not within the run" if r.reached_at is None else str(r.reached_at)
    full = " ✓" if r.reached_full else " ✗"
    psi = " ✓" if r.reached_psi else " ✗"
    ended = f"> {r.horizon} (not ended)" if r.ended is None else _epochs_at(r.ended[1], r.ended[0])
    return (
        f"| {r.seed} | {r.fraction:.0%} ({r.layers} of 8) | {r.n_full} ({r.e_full} ep) "
        f"| {r.n_freeze} ({r.epoch}) | {r.psi_mean:.3f} | {_epochs_at(r.full_at, r.e_full)} "
        f"| {r.acc_at_full:.4f}{full} | {ended} | {r.acc_at_psi:.4f}{psi} | {reach} |"
    )


def plot(
    curves: dict[int, tuple[Run, dict[float, Run]]],
    rows: list[Row],
    args: argparse.Namespace,
    path: Path,
) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[dev]'): no plot")
        return False
    seed = args.seeds[0]
    if seed not in curves:
        return False
    base, branches = curves[seed]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(*zip(*base.curve, strict=True), label="all layers trained", color="black")
    colors = {0.25: "tab:blue", 0.5: "tab:red"}
    for fraction, run in branches.items():
        row = next(r for r in rows if r.seed == seed and r.fraction == fraction)
        color = colors.get(fraction, "tab:green")
        ax.plot(*zip(*run.curve, strict=True), label=f"{fraction:.0%} frozen", color=color)
        if row.ended is not None:
            label = f"psi-compensated budget ({fraction:.0%})"
            ax.axvline(row.ended[1], color=color, linestyle=":", label=label)
    row0 = next(r for r in rows if r.seed == seed)
    label = f"unfrozen budget ({row0.e_full} epochs)"
    ax.axvline(row0.full_at, color="black", linestyle="--", label=label)
    ax.axvline(row0.n_freeze, color="gray", linestyle="-.", label="freeze point")
    ax.axhline(args.target, color="gray", linewidth=0.8)
    ax.set_ylim(max(0.0, args.target - 0.15), 1.0)
    ax.set_xlim(left=0.8 * row0.n_freeze)
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation accuracy")
    ax.set_title(f"digits CNN, freeze at epoch {row0.epoch}, target {args.target} (seed {seed})")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def write_doc(rows: list[Row], args: argparse.Namespace, seconds: float, plotted: bool) -> None:
    when = (
        f"epoch {args.freeze_epoch}"
        if args.freeze_epoch is not None
        else f"the first epoch that starts at validation accuracy >= {args.freeze_at_acc}"
    )
    lines = [
        "# Frozen penalty check (spec section 5) at small scale",
        "",
        "Generated by `experiments/frozen_penalty/run.py` (method: its README). Command:",
        "",
        "```sh",
        f"PYTHONPATH=. python experiments/frozen_penalty/run.py {' '.join(args.argv)}".rstrip(),
        "```",
        "",
        f"An 8-layer CNN on scikit-learn's digits (1400 train / 397 validation images), SGD "
        f"lr {args.lr} momentum 0.9, batch {args.batch}, target validation accuracy "
        f"{args.target}; layers frozen from {when}. psi is eq 3 on the "
        f"per-layer gradient variance measured every {args.stats_every} iterations by the "
        f"trainer's estimator; accuracy is evaluated every {args.eval_every} iterations. "
        f"Run time {seconds:.0f} s on the 2-core development machine (shared).",
        "",
        "Budgets are where a job declared with `--max-epochs E_full` (the epochs the unfrozen "
        "run needed) stops, as iteration (epochs): the unfrozen budget counts epochs trained "
        "(`--max-physical-epochs E_full`, the old rule); the psi-compensated one is the Model "
        "Trainer's own stop rule (`icefrog_launcher.budget`, imported by the script): the "
        "first epoch end at which the samples, each counted psi times, make E_full "
        "full-model-equivalent epochs. A branch runs until both its budget has ended it and "
        f"it has reached the target, or {args.horizon:g} x E_full epochs.",
        "",
        "✓ / ✗: the frozen run had reached the target by that budget (best accuracy so far).",
        "",
        HEADER,
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_line(r) for r in rows),
        "",
    ]
    for fraction in args.fractions:
        sel = [r for r in rows if r.fraction == fraction]
        if sel:
            lines.append(
                f"- {fraction:.0%} frozen: reached the target within the unfrozen budget in "
                f"{sum(r.reached_full for r in sel)} of {len(sel)} seeds, within the "
                f"psi-compensated budget in {sum(r.reached_psi for r in sel)} of {len(sel)}."
            )
    if plotted:
        lines += ["", "![validation accuracy against iterations](frozen_penalty.png)", ""]
    findings = Path(__file__).with_name("findings.md")  # the reading of these numbers
    if findings.is_file():
        lines += ["", findings.read_text().rstrip()]
    out = REPO / "docs" / "frozen_penalty.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--freeze-epoch", type=int, default=None, help="fixed freeze epoch")
    parser.add_argument(
        "--freeze-at-acc",
        type=float,
        default=0.9,
        help="freeze at the first epoch at this accuracy",
    )
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5])
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--stats-every", type=int, default=4)
    parser.add_argument(
        "--horizon", type=float, default=2.0, help="longest branch, in multiples of E_full epochs"
    )
    parser.add_argument("--no-doc", action="store_true", help="print only")
    args = parser.parse_args()
    import sys

    args.argv = sys.argv[1:]
    torch.set_num_threads(1)
    started = time.monotonic()
    print(HEADER)
    rows, curves = experiment(args)
    seconds = time.monotonic() - started
    print(f"{seconds:.0f} s")
    if not args.no_doc:
        plotted = plot(curves, rows, args, REPO / "docs" / "frozen_penalty.png")
        write_doc(rows, args, seconds, plotted)


if __name__ == "__main__":
    main()
