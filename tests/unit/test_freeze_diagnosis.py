"""benchmarks/freeze_diagnosis.py myopic: its never-freeze baseline never freezes."""

from __future__ import annotations

import math

from benchmarks.freeze_diagnosis import _truth, myopic_run, retune_due


def test_never_is_never_due_however_long_since() -> None:
    for since in (0.0, 1e12, math.inf):
        assert not retune_due(since, None)
    assert retune_due(100.0, 100.0) and not retune_due(99.0, 100.0)
    assert not retune_due(1e300, math.inf)  # an infinite interval is never reached either


def test_the_never_freeze_baseline_runs_unfrozen_and_the_rule_does_freeze() -> None:
    t = _truth("resnet18-cifar10", 1)
    base, moves = myopic_run(t, None)
    assert moves == []
    epoch = float(t.task.samples_per_epoch)
    spent, tuned = myopic_run(t, epoch)
    assert tuned and all(k > 0 for _, k in tuned[:1])  # the rule itself freezes
    assert spent != base
