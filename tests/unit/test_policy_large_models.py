"""The icefrog policy's estimates of large-model jobs: the declared parallelism picks the
throughput model and the legal GPU counts; ``policy.large_model_models`` switches the
models off (the paper's ablation, spec section 7)."""

from __future__ import annotations

import pytest

from icefrog_slurm.core.parallel import Kind, Parallelism, SdpModel
from icefrog_slurm.core.parallel_fit import synthetic_samples
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.throughput import DdpThroughputModel
from icefrog_slurm.core.transformer_tables import load_shipped_table
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot
from icefrog_slurm.policies.estimate import Candidate, Estimator
from icefrog_slurm.protocol import JobSpec
from icefrog_slurm.settings import Settings, settings_from_mapping
from tests.support.parallel_examples import scenarios

ON = settings_from_mapping({})
OFF = settings_from_mapping({"policy": {"large_model_models": False}})
TABLE = load_shipped_table("llama-3b")
SDP = scenarios("llama-3b")[0]  # an SDP job in units of 4 GPUs, with its true model


def _job(parallelism: Parallelism, samples: tuple[ProfileSample, ...] = ()) -> JobSnapshot:
    spec = JobSpec(
        1, 16, 1, 8, 0.9, "acc", ">=", 0.9, 2, 100_000, TABLE.flops, TABLE.param_bytes,
        parallelism=parallelism,
    )  # fmt: skip
    rec = JobRecord(1, "llama", 0, "root", "pending", 0.0, None, None, spec, ("7",), Progress())
    return JobSnapshot(JobView(rec, samples, None), None, Current())


def _cands(
    job: JobSnapshot, settings: Settings = ON, est: Estimator | None = None
) -> dict[tuple[int, bool], Candidate]:
    est = est or Estimator()
    got = est.candidates(job, now=100.0, gpus_per_node=4, capacity=16, settings=settings)
    return {(c.gpus, c.shared): c for c in got}


def _measured_sdp() -> tuple[ProfileSample, ...]:
    """The SDP job's profile at 4 and 8 GPUs (16 GPUs never measured), 5 % noise."""
    configs = [c for c in SDP.configs if c[0] in (4, 8)]
    return tuple(synthetic_samples(SDP.model, configs, noise=0.05, seed=3))


def test_sdp_job_in_units_of_4_gets_only_multiples_of_4_and_no_shared_gpu() -> None:
    parallelism = SDP.model.parallelism
    assert parallelism == Parallelism(Kind.SDP, unit=4)
    for settings in (ON, OFF):
        cands = _cands(_job(parallelism, _measured_sdp()), settings)
        assert set(cands) == {(4, False), (8, False), (12, False), (16, False)}


def test_the_switch_picks_the_model_and_changes_the_predicted_tta() -> None:
    job = _job(SDP.model.parallelism, _measured_sdp())
    est_on, est_off = Estimator(), Estimator()
    on, off = _cands(job, ON, est_on), _cands(job, OFF, est_off)
    assert isinstance(est_on._cache[1].model, SdpModel)
    assert isinstance(est_off._cache[1].model, DdpThroughputModel)
    # 16 GPUs were never measured: the two models predict them differently
    assert on[(16, False)].tta_s != pytest.approx(off[(16, False)].tta_s, rel=0.01)
    # the SDP model, fitted to its own kind of profile, is the closer to the truth there
    truth = max(
        SDP.model.throughput(gpus=16, batch=m, frozen=0, layers=TABLE) for m in (1, 2, 4, 8)
    )
    remaining = 2 * 100_000
    true_tta = 100.0 + remaining / truth
    err_on = abs(on[(16, False)].tta_s - true_tta)
    err_off = abs(off[(16, False)].tta_s - true_tta)
    assert err_on < err_off


@pytest.mark.parametrize(
    ("parallelism", "counts"),
    [
        (Parallelism(Kind.PP, stages=4, unit=4), {4}),
        (Parallelism(Kind.HP, stages=8, unit=4), {8, 16}),
        (Parallelism(Kind.DDP, unit=2), {2, 4, 8, 12, 16}),
    ],
)
def test_unmeasured_large_jobs_get_a_prior_on_their_legal_counts_only(
    parallelism: Parallelism, counts: set[int]
) -> None:
    cands = _cands(_job(parallelism))
    assert {g for g, _ in cands} == counts
    assert not any(shared for _, shared in cands)
    assert all(c.tta_s > 100.0 for c in cands.values())


def test_a_plain_ddp_job_keeps_its_shared_option_and_every_count() -> None:
    rate = 50.0
    samples = tuple(
        ProfileSample(1, m, 0, False, 0.0, 0.0, 0.0, m / rate, rate, 10e9, 0.4) for m in (1, 8)
    )
    cands = _cands(_job(Parallelism(Kind.DDP), samples))
    assert {g for g, s in cands if not s} == {1, 2, 3, 4, 8, 12, 16}
    assert (1, True) in cands
    job = _job(Parallelism(Kind.SDP), samples)  # SDP in units of 1: may not share
    assert (1, True) not in _cands(job)
