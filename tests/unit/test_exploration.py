"""Exploration (AdaptDL's rule): ICEFROG offers a job at most twice the largest GPU count it
has measured, so a count its model mispredicts is reached in steps, measured and corrected."""

from __future__ import annotations

from dataclasses import replace

from icefrog_slurm.core.parallelism import Kind, Parallelism
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot
from icefrog_slurm.policies.estimate import Estimator, exploration_cap
from icefrog_slurm.protocol import JobSpec
from icefrog_slurm.settings import settings_from_mapping

L = 4
SETTINGS = settings_from_mapping({})


def _spec() -> JobSpec:
    return JobSpec(1, 16, 32, 64, 0.9, "acc", ">=", 0.9, 10, 10000, (1e9,) * L, (1e7,) * L)


def _sample(gpus: int, shared: bool = False) -> ProfileSample:
    return ProfileSample(gpus, 64, 0, shared, 0.0, 0.0, 0.0, 0.1, gpus * 640.0, 20e9, 0.4)


def _job(spec: JobSpec, samples: tuple[ProfileSample, ...] = ()) -> JobSnapshot:
    rec = JobRecord(1, "j", 0, "root", "pending", 0.0, None, None, spec, ("7",), Progress())
    return JobSnapshot(JobView(rec, samples, None), None, Current())


def _exclusive(est: Estimator, job: JobSnapshot) -> set[int]:
    got = est.candidates(job, now=100.0, gpus_per_node=4, capacity=16, settings=SETTINGS)
    return {c.gpus for c in got if not c.shared}


def test_exploration_offers_at_most_twice_the_largest_measured_count() -> None:
    spec = _spec()
    assert exploration_cap(_job(spec)) == 1  # never measured: its smallest legal count
    assert exploration_cap(_job(spec, (_sample(1), _sample(2)))) == 4
    assert exploration_cap(_job(spec, (_sample(1), _sample(8, shared=True)))) == 2
    unit4 = replace(spec, min_gpus=4, parallelism=Parallelism(Kind.SDP, unit=4))
    assert exploration_cap(_job(unit4)) == 4
    measured = _job(spec, (_sample(1), _sample(2)))
    assert _exclusive(Estimator(explore=True), measured) == {1, 2, 3, 4}
    assert max(_exclusive(Estimator(), measured)) == 16  # the baselines: every legal count


def test_the_exploration_setting_caps_icefrog_only_and_is_off_by_default() -> None:
    measured = _job(_spec(), (_sample(1), _sample(2)))
    on = settings_from_mapping({"policy": {"exploration": True}})
    off = settings_from_mapping({"policy": {"exploration": False}})
    icefrog = Estimator(explore=None)  # what the icefrog policy builds: the setting decides
    assert max(_exclusive(icefrog, measured)) == 16  # the default: every legal count
    got = icefrog.candidates(measured, now=100.0, gpus_per_node=4, capacity=16, settings=on)
    assert max(c.gpus for c in got if not c.shared) == 4
    baseline = Estimator(explore=True)  # a rule fixed by its policy ignores the setting
    got = baseline.candidates(measured, now=100.0, gpus_per_node=4, capacity=16, settings=off)
    assert max(c.gpus for c in got if not c.shared) == 4
