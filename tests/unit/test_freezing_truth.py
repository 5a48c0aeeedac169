"""benchmarks/freezing_truth.py: its schedules freeze what they say, and a TTA does not
depend on the step it is integrated with."""

from __future__ import annotations

import pytest

import benchmarks.freezing_truth as ft
from benchmarks.freeze_diagnosis import _truth


def test_ramp_freezes_one_layer_more_each_share_of_the_interval() -> None:
    r = ft.ramp(4, 0.2, 0.6)  # layers frozen from 0.2, 0.3, 0.4 and 0.5
    assert [r(p) for p in (0.0, 0.19, 0.2, 0.29, 0.3, 0.45, 0.5, 0.6, 1.0)] == [
        0, 0, 1, 1, 2, 3, 4, 4, 4,
    ]  # fmt: skip
    assert [ft.once(3, 0.5)(p) for p in (0.49, 0.5, 0.9)] == [0, 3, 3]


def test_thawed_unfreezes_the_first_step_of_every_tenth_only() -> None:
    t = ft.thawed(ft.once(5, 0.0))
    assert [t(p) for p in (0.0, 0.005, 0.01, 0.3, 0.305, 0.31, 0.99)] == [0, 0, 5, 0, 0, 5, 5]


def test_schedules_stay_within_the_cap_and_end_frozen() -> None:
    named = ft.schedules(10)
    assert {k for _, k, _ in named} == set(range(1, 10))  # cap: 90 % of 10
    assert all(s(1.0) == k for _, k, s in named)


def test_unfrozen_tta_does_not_depend_on_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    t = _truth("resnet18-cifar10", 1)
    m = t.task.default_batch

    def never(_p: float) -> int:
        return 0

    fine = ft.tta(t, never, gpus=1, batch=m, run_seed=3)
    monkeypatch.setattr(ft, "STEPS", 7)
    coarse = ft.tta(t, never, gpus=1, batch=m, run_seed=3)
    assert coarse == pytest.approx(fine, rel=1e-9)
    assert ft.tta(t, never, gpus=1, batch=m, run_seed=4) != pytest.approx(fine, rel=1e-6)
