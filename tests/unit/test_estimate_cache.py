"""The estimator's per-job caches: new gradient statistics re-tune a job's options from its
cached throughput grids; new samples predict them again; the answers equal a fresh
estimator's (a refit's, from the last fit, to the solver's tolerance)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot
from icefrog_slurm.policies import estimate
from icefrog_slurm.policies.estimate import Candidate, Estimator
from icefrog_slurm.protocol import GradStats, JobSpec
from icefrog_slurm.settings import settings_from_mapping

SETTINGS = settings_from_mapping({})
L = 4
SPEC = JobSpec(1, 8, 32, 64, 0.9, "acc", ">=", 0.9, 10, 10000, (1.0,) * L, (1.0,) * L)
LOW = GradStats(epoch=3, frozen=0, grad_var=(0.01, 0.01, 5.0, 5.0), grad_sqr=(1.0,) * L)
HIGH = GradStats(epoch=4, frozen=0, grad_var=(5.0, 5.0, 1.0, 1.0), grad_sqr=(1.0,) * L)


def _sample(gpus: int, frozen: int, rate: float) -> ProfileSample:
    return ProfileSample(gpus, 64, frozen, False, 0.0, 0.0, 0.0, gpus * 64 / rate, rate, 20e9, 0.4)


def _job(samples: tuple[ProfileSample, ...], grad: GradStats) -> JobSnapshot:
    rec = JobRecord(1, "j", 0, "root", "running", 0.0, None, None, SPEC, ("7",), Progress())
    return JobSnapshot(JobView(rec, samples, grad), None, Current())


def _options(est: Estimator, job: JobSnapshot) -> dict[tuple[int, bool], Candidate]:
    got = est.candidates(job, now=100.0, gpus_per_node=4, capacity=16, settings=SETTINGS)
    return {(c.gpus, c.shared): c for c in got}


def test_new_statistics_retune_from_the_cached_grids(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = estimate.measured_or_predicted_grids  # type: ignore[attr-defined]

    def counted(**kwargs: Any) -> Any:
        calls.extend(g for g, _ in kwargs["configs"])
        return real(**kwargs)

    monkeypatch.setattr(estimate, "measured_or_predicted_grids", counted)
    samples = (_sample(1, 0, 400.0), _sample(1, 2, 700.0), _sample(2, 0, 750.0))
    est = Estimator()
    low = _options(est, _job(samples, LOW))
    assert low[(1, False)].choice.frozen == 2
    predicted = len(calls)
    assert predicted == len({g for g, _ in low})  # one grid a GPU count, shared included
    high = _options(est, _job(samples, HIGH))
    assert len(calls) == predicted  # re-tuned, not re-predicted
    assert high[(1, False)].choice.frozen == 0  # ... and the new penalty decides
    assert high == _options(Estimator(), _job(samples, HIGH))
    more = (*samples, _sample(4, 0, 1300.0))
    after = _options(est, _job(more, HIGH))
    assert len(calls) > 2 * predicted  # a new sample: refitted and predicted again
    # The refit starts from the last fit (a fresh estimator's from its defaults): the same
    # minimum of the same objective, up to the solver's tolerance.
    fresh = _options(Estimator(), _job(more, HIGH))
    assert after.keys() == fresh.keys()
    for key, got in after.items():
        want = fresh[key]
        assert (got.choice.batch, got.choice.frozen) == (want.choice.batch, want.choice.frozen)
        assert got.tta_s == pytest.approx(want.tta_s, rel=1e-6)


def test_sharing_regressions_are_fitted_for_shared_options_once_a_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that cannot share never has its sharing regressions fitted; one that can has
    them fitted once for each change of its samples, not once a round."""
    fitted: list[int] = []
    real = estimate.fit_sharing  # type: ignore[attr-defined]

    def counted(samples: Any, layers: Any) -> Any:
        fitted.append(len(samples))
        return real(samples, layers)

    monkeypatch.setattr(estimate, "fit_sharing", counted)
    samples = (_sample(1, 0, 400.0), _sample(2, 0, 750.0))
    est = Estimator()
    record = replace(_job(samples, LOW).job, spec=replace(SPEC, accepts_shared=False))
    alone = JobSnapshot(JobView(record, samples, LOW), None, Current())
    assert (1, True) not in _options(est, alone)
    assert (1, True) not in _options(est, alone)
    assert fitted == []
    est = Estimator()
    assert (1, True) in _options(est, _job(samples, LOW))
    assert (1, True) in _options(est, _job(samples, HIGH))  # new statistics, same samples
    assert fitted == [2]
    more = (*samples, _sample(1, 2, 700.0))
    assert (1, True) in _options(est, _job(more, HIGH))
    assert fitted == [2, 3]
