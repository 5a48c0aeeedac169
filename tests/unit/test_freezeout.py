"""FreezeOut's schedule (core/freezeout.py) and the baselines' use of it (spec section 12)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icefrog_slurm.core.freezeout import FreezeOut, tune_freezeout
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot
from icefrog_slurm.errors import InputError
from icefrog_slurm.policies.estimate import Estimator
from icefrog_slurm.policies.icefrog import IcefrogPolicy
from icefrog_slurm.policies.lucid_plus import LucidPlusPolicy
from icefrog_slurm.policies.optimus_plus import OptimusPlusPolicy
from icefrog_slurm.policies.pollux_plus import PolluxPlusPolicy
from icefrog_slurm.protocol import GradStats, JobSpec
from icefrog_slurm.settings import settings_from_mapping

ALL = tuple(range(10))  # every frozen count 0..9 of a 10-layer job, 9 = its 90 % cap

schedules = st.builds(
    FreezeOut,
    t0=st.floats(0.05, 1.0),
    scaling=st.sampled_from(["linear", "cubic"]),
    cap=st.none() | st.integers(0, 9),
)


@given(schedules, st.lists(st.floats(0.0, 1.0), min_size=2, max_size=20))
def test_the_frozen_count_only_grows_with_progress_and_respects_both_caps(
    sched: FreezeOut, progress: list[float]
) -> None:
    depths = [sched.frozen(p, ALL, 10) for p in sorted(progress)]
    assert depths == sorted(depths)
    assert all(d <= 9 and (sched.cap is None or d <= sched.cap) for d in depths)


def test_freeze_points_rise_from_t0_to_one_and_cubic_freezes_earlier() -> None:
    linear = FreezeOut(0.5, "linear").freeze_points(10)
    cubic = FreezeOut(0.5, "cubic").freeze_points(10)
    assert linear[0] == pytest.approx(0.5) and linear[-1] == pytest.approx(1.0)
    assert list(linear) == sorted(linear)
    assert cubic[0] == pytest.approx(0.125) and all(
        c <= lin for c, lin in zip(cubic, linear, strict=True)
    )


def test_a_smaller_t0_freezes_no_fewer_layers_at_any_progress() -> None:
    early, late = FreezeOut(0.2, "linear"), FreezeOut(0.8, "linear")
    for i in range(101):
        assert early.frozen(i / 100, ALL, 10) >= late.frozen(i / 100, ALL, 10)
    assert early.frozen(0.5, ALL, 10) > 0 == late.frozen(0.5, ALL, 10)


def test_only_legal_boundaries_are_used() -> None:
    sched = FreezeOut(0.1, "linear")
    assert {sched.frozen(i / 50, (0, 4, 8), 10) for i in range(51)} <= {0, 4, 8}
    assert sched.frozen(1.0, (0, 4, 8), 10) == 8


def test_bad_hyperparameters_are_refused() -> None:
    for kwargs in ({"t0": 0.0}, {"t0": 1.5}, {"t0": 0.5, "cap": -1}):
        with pytest.raises(InputError):
            FreezeOut(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        FreezeOut(0.5, "quadratic")  # type: ignore[arg-type]


def test_tuning_freezes_early_and_deep_when_freezing_pays_and_never_when_it_costs() -> None:
    pays = tune_freezeout(candidates=ALL, num_layers=10, effective_progress=lambda k: 1.0 + k)
    assert pays is not None and pays.cap == 9 and pays.frozen(0.5, ALL, 10) >= 5
    costs = tune_freezeout(candidates=ALL, num_layers=10, effective_progress=lambda k: 1.0 - k / 20)
    assert costs is not None and all(costs.frozen(i / 10, ALL, 10) == 0 for i in range(11))
    # a middle depth is best: the tuned cap stops the schedule there
    mid = tune_freezeout(
        candidates=ALL, num_layers=10, effective_progress=lambda k: 1.0 + k if k <= 4 else 0.5
    )
    assert mid is not None and max(mid.frozen(i / 10, ALL, 10) for i in range(11)) == 4
    assert tune_freezeout(candidates=ALL, num_layers=10, effective_progress=lambda k: 0.0) is None


# --- the estimator and the policies ------------------------------------------------------

L = 4
SPEC = JobSpec(1, 8, 32, 64, 0.9, "acc", ">=", 0.9, 10, 10000, (1.0,) * L, (1.0,) * L)
SAMPLES = tuple(
    ProfileSample(g, 64, k, False, 0.0, 0.0, 0.0, g * 64 / r, r, 20e9, 0.4)
    for g, k, r in ((1, 0, 400.0), (1, 2, 700.0), (2, 0, 750.0))
)


def _job(samples_done: int, grad_var: tuple[float, ...], frozen: int = 0) -> JobSnapshot:
    grad = GradStats(epoch=3, frozen=frozen, grad_var=grad_var, grad_sqr=(1.0,) * L)
    rec = JobRecord(
        1, "j", 0, "root", "running", 0.0, None, None, SPEC, ("7",), Progress(3, samples_done)
    )
    return JobSnapshot(JobView(rec, SAMPLES, grad), None, Current())


def _depths(est: Estimator, job: JobSnapshot, settings: object = None) -> set[int]:
    got = est.candidates(
        job, now=100.0, gpus_per_node=4, capacity=16, settings=settings or SETTINGS
    )  # type: ignore[arg-type]
    return {c.choice.frozen for c in got}


SETTINGS = settings_from_mapping({})


def test_freezeout_offers_the_schedules_depth_and_never_thaws() -> None:
    cheap = (0.01, 0.01, 5.0, 5.0)  # freezing two layers costs almost nothing: it pays
    est = Estimator(freezing="freezeout")
    assert _depths(est, _job(0, cheap)) == {0}  # nothing has passed its freeze point yet
    sched = est.schedule(1)
    assert sched is not None and sched.frozen(1.0, (0, 1, 2, 3), L) >= 2
    seen = []
    for done in range(0, 100_001, 10_000):
        # the statistics turn against freezing (eq 3 would thaw), FreezeOut does not
        costly = (5.0, 5.0, 0.01, 0.01) if done > 50_000 else cheap
        depths = _depths(est, _job(done, costly, frozen=seen[-1] if seen else 0))
        assert depths == {sched.frozen(done / 100_000, (0, 1, 2, 3), L)}
        seen.append(depths.pop())
    assert seen == sorted(seen) and seen[-1] >= 2
    assert est.schedule(1) is sched  # tuned once per job


def test_the_penalty_tuner_does_thaw_on_the_same_inputs() -> None:
    est = Estimator(freezing="penalty")
    assert _depths(est, _job(0, (0.01, 0.01, 5.0, 5.0))) == {2}
    assert _depths(est, _job(60_000, (5.0, 5.0, 0.01, 0.01), frozen=2)) == {0}


def test_the_baselines_follow_freezeout_and_icefrog_the_setting() -> None:
    for policy in (LucidPlusPolicy(), OptimusPlusPolicy(), PolluxPlusPolicy()):
        assert _depths(policy.estimator, _job(0, (0.01, 0.01, 5.0, 5.0))) == {0}
    icefrog = IcefrogPolicy()
    assert _depths(icefrog.estimator, _job(0, (0.01, 0.01, 5.0, 5.0))) == {2}
    ablation = replace(SETTINGS, policy=replace(SETTINGS.policy, freezing="freezeout"))
    assert _depths(IcefrogPolicy().estimator, _job(0, (0.01, 0.01, 5.0, 5.0)), ablation) == {0}
