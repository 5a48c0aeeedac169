"""The learning-rate rule for a global batch the controller changes (batch elasticity).

A job that declares no fixed global batch trains at the global batch of the decision,
B = a x m (GPUs x per-GPU batch), which the controller may change between epochs. The
user's learning rate is for the job's base batch B0 = the smallest declared GPU count x
the smallest declared per-GPU batch (the base the controller's statistical efficiency is
measured against, ``icefrog_slurm.core.goodput``). Around every optimizer step the trainer
multiplies each param group's ``lr`` by the rule's factor for S = B / B0 and puts the
user's value back after the step, as ``adaptdl.torch``'s scaling rules do: the optimizer's
``state_dict`` (and so the checkpoint) and the user's LR scheduler only ever see the
user's own learning rate.

Rules (``RULES``):

- ``none``: factor 1 (the learning rate of B0 at any B);
- ``linear``: S (Goyal et al. 2017), ``sqrt``: sqrt(S) (Krizhevsky 2014); each reached by a
  linear warm-up over ``warmup_steps`` optimizer steps from the factor used before the
  change, so a jump of the batch is not a jump of the step size;
- ``adascale``: AdaScale's gain (Johnson et al. 2020, as adaptdl.torch computes it):
  r = (var + sqr) / (var / S + sqr), with var the variance of a B0-sample gradient and
  sqr the squared norm of the true gradient. The trainer's statistics
  (icefrog_launcher.stats) give per-sample tr(Sigma) and |G|^2 per layer: var = tr(Sigma)
  / B0 summed over the layers that train. 1 <= r <= S: S where the gradient is all noise
  (the linear rule), 1 where it is all signal (a bigger batch buys nothing).

``auto`` (the default) picks by the optimizer: ``linear`` for the Adam family, ``sqrt`` for
every other (the rules that kept convergence with each in experiments/batch_change;
docs/trainer.md).

Everything here is pure: the trainer holds the state (``Scaling``) and applies it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from icefrog_slurm.errors import InputError

Rule = Literal["none", "linear", "sqrt", "adascale"]
RULES: tuple[Rule, ...] = get_args(Rule)
AUTO = "auto"
DEFAULT_RULE = AUTO
"""What a Trainer applies unless told otherwise: the rule that kept convergence with a
learning rate tuned for the base batch in experiments/batch_change, for the optimizer at
hand (``parse_rule``)."""
DEFAULT_WARMUP_STEPS = 20
SMOOTHING = 0.5
"""Weight of the past in the epoch-to-epoch average of the statistics (``Scaling.observe``)."""


def parse_rule(value: str, *, adam: bool = False) -> Rule:
    """A rule's name, or InputError naming the choices. ``auto``: ``linear`` when the
    optimizer is of the Adam family (``adam``), else ``sqrt``."""
    if value == AUTO:
        return "linear" if adam else "sqrt"
    for rule in RULES:
        if value == rule:
            return rule
    raise InputError(f"lr rule {value!r}: one of {', '.join((AUTO, *RULES))}")


def adascale_gain(*, scale: float, var: float, sqr: float) -> float:
    """AdaScale's gain r = (var + sqr) / (var / scale + sqr) (module docstring); ``var`` the
    variance of a base-batch gradient, ``sqr`` the true gradient's squared norm. Negative
    estimates count as 0; with no statistics at all (both 0) or a scale <= 1, 1."""
    var, sqr = max(var, 0.0), max(sqr, 0.0)
    if not (math.isfinite(var) and math.isfinite(sqr) and math.isfinite(scale)):
        return 1.0
    if scale <= 1.0 or var + sqr <= 0.0:
        return 1.0
    return (var + sqr) / (var / scale + sqr)


def training_sums(
    grad_var: Sequence[float], grad_sqr: Sequence[float], frozen: int
) -> tuple[float, float]:
    """(tr(Sigma), |G|^2) of the layers that train (from ``frozen`` on), from the trainer's
    per-layer statistics; negative estimates count as 0."""
    var = math.fsum(max(v, 0.0) for v in grad_var[frozen:])
    sqr = math.fsum(max(g, 0.0) for g in grad_sqr[frozen:])
    return var, sqr


def target_factor(
    rule: Rule, *, batch: float, base_batch: float, var: float = 0.0, sqr: float = 0.0
) -> float:
    """The factor ``rule`` gives global batch ``batch`` against ``base_batch``. ``var``,
    ``sqr``: per-sample tr(Sigma) and |G|^2 of the layers that train (``adascale`` only;
    ``training_sums``)."""
    if batch <= 0 or base_batch <= 0:
        return 1.0
    scale = batch / base_batch
    if rule == "none":
        return 1.0
    if rule == "linear":
        return scale
    if rule == "sqrt":
        return math.sqrt(scale)
    var = var / base_batch  # the variance of a B0-sample gradient
    if scale < 1.0:  # a batch below the base: AdaScale's gain is defined for S >= 1;
        # its inverse keeps the rule symmetric (r(S) = 1 / r(1 / S))
        return 1.0 / adascale_gain(scale=1.0 / scale, var=var, sqr=sqr)
    return adascale_gain(scale=scale, var=var, sqr=sqr)


def ramp(start: float, end: float, *, step: int, warmup_steps: int) -> float:
    """The factor ``step`` optimizer steps after a change from ``start`` to ``end``: linear
    over ``warmup_steps`` steps (``end`` from step ``warmup_steps`` on, at once with 0)."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return end
    return start + (end - start) * max(step, 0) / warmup_steps


@dataclass
class Scaling:
    """The trainer's LR-rule state: the factor before the last change, the factor the rule
    gives now, and the optimizer steps taken since the change (the warm-up's clock)."""

    rule: Rule
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    start: float = 1.0
    target: float = 1.0
    since: int = 0
    var: float = 0.0  # the statistics smoothed over epochs (adascale; 0: none yet)
    sqr: float = 0.0

    def observe(self, var: float, sqr: float) -> tuple[float, float]:
        """Smooth an epoch's (tr(Sigma), |G|^2) into the running values, which it returns:
        an exponential average with weight SMOOTHING on the past (a handful of measured
        steps an epoch makes one epoch's estimate noisy; adaptdl.torch averages over steps
        in the same way). Values that are not finite are ignored."""
        if not (math.isfinite(var) and math.isfinite(sqr)) or var + sqr <= 0.0:
            return self.var, self.sqr
        if self.var + self.sqr <= 0.0:
            self.var, self.sqr = var, sqr
        else:
            self.var = SMOOTHING * self.var + (1 - SMOOTHING) * var
            self.sqr = SMOOTHING * self.sqr + (1 - SMOOTHING) * sqr
        return self.var, self.sqr

    def retarget(self, factor: float) -> None:
        """The rule's factor has changed (a new batch, new statistics): warm up to it from
        the factor in use now (``adascale`` follows its gain at once, as AdaScale does)."""
        if factor == self.target:
            return
        self.start, self.target, self.since = self.factor(), factor, 0

    def factor(self) -> float:
        """The factor of the next optimizer step."""
        if self.rule == "adascale":
            return self.target
        return ramp(self.start, self.target, step=self.since, warmup_steps=self.warmup_steps)

    def stepped(self) -> None:
        self.since += 1

    def state_dict(self) -> dict[str, float | int | str]:
        return {
            "rule": self.rule,
            "start": self.start,
            "target": self.target,
            "since": self.since,
            "var": self.var,
            "sqr": self.sqr,
        }

    def load_state_dict(self, state: dict[str, float | int | str]) -> None:
        """Resume the warm-up of the same rule; a checkpoint of another rule (the script
        changed it) starts the new rule fresh."""
        if state.get("rule") != self.rule:
            return
        self.start, self.target = float(state["start"]), float(state["target"])
        self.since = int(state["since"])
        self.var, self.sqr = float(state.get("var", 0.0)), float(state.get("sqr", 0.0))
