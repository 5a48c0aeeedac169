"""Early estimates: the throughput prior from the declared tables and the GPU model, a new
job's first fit, and gradient statistics within an epoch."""

from __future__ import annotations

import pytest

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallelism import DDP, Kind, Parallelism
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.throughput import (
    GPU_MODELS,
    PRIOR_STEP_OVERHEAD_S,
    prior_iteration_time,
)
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot
from icefrog_slurm.policies.estimate import Estimator
from icefrog_slurm.protocol import GRAD_REPORTS_PER_EPOCH, JobSpec
from icefrog_slurm.settings import GpuModelName, settings_from_mapping
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.jobs import Config, SimJob
from icefrog_slurm.sim.truth import TaskTruth
from icefrog_slurm.sim.workload import TraceJob

L = 4
SETTINGS = settings_from_mapping({})
A800 = GPU_MODELS["a800"]


def _spec(flops: float = 1e9, param_bytes: float = 1e7, gpus: tuple[int, int] = (1, 16)) -> JobSpec:
    return JobSpec(gpus[0], gpus[1], 32, 64, 0.9, "acc", ">=", 0.9, 10, 10000,
                   (flops,) * L, (param_bytes,) * L)  # fmt: skip


def _sample(gpus: int, shared: bool = False) -> ProfileSample:
    return ProfileSample(gpus, 64, 0, shared, 0.0, 0.0, 0.0, 0.1, gpus * 640.0, 20e9, 0.4)


def _job(spec: JobSpec, samples: tuple[ProfileSample, ...] = ()) -> JobSnapshot:
    rec = JobRecord(1, "j", 0, "root", "pending", 0.0, None, None, spec, ("7",), Progress())
    return JobSnapshot(JobView(rec, samples, None), None, Current())


def _exclusive(est: Estimator, job: JobSnapshot, model: GpuModelName = "a800") -> dict[int, float]:
    settings = settings_from_mapping({"slurm": {"gpu_model": model}})
    got = est.candidates(job, now=100.0, gpus_per_node=4, capacity=16, settings=settings)
    return {c.gpus: c.tta_s for c in got if not c.shared}


def test_the_prior_time_follows_the_declared_flops_bytes_and_gpu_model() -> None:
    small = LayerTable((1e9,) * L, (1e6,) * L)
    big = LayerTable((1e10,) * L, (1e6,) * L)
    one = {"gpus": 1, "batch": 64, "nodes": 1}
    t_small = prior_iteration_time(small, A800, DDP, **one)
    t_big = prior_iteration_time(big, A800, DDP, **one)
    assert t_big - PRIOR_STEP_OVERHEAD_S == pytest.approx(10 * (t_small - PRIOR_STEP_OVERHEAD_S))
    h100 = prior_iteration_time(big, GPU_MODELS["h100"], DDP, **one)
    assert h100 < t_big  # a faster GPU model
    # parameter bytes cost communication only with several GPUs, more across nodes
    heavy = LayerTable((1e9,) * L, (1e9,) * L)
    assert prior_iteration_time(heavy, A800, DDP, **one) == t_small
    intra = prior_iteration_time(heavy, A800, DDP, gpus=4, batch=64, nodes=1)
    inter = prior_iteration_time(heavy, A800, DDP, gpus=8, batch=64, nodes=2)
    assert t_small < intra < inter
    # a pipeline spreads a replica's compute over its stages
    hp = Parallelism(Kind.HP, stages=4, unit=4)
    assert prior_iteration_time(big, A800, hp, gpus=4, batch=64, nodes=1) < t_big


def test_a_job_that_never_ran_is_estimated_from_its_tables() -> None:
    """Before its first profile a job's predicted TTA follows its declared FLOPs and the GPU
    model (one prior for every task before): ten times the FLOPs, much slower."""
    light = _exclusive(Estimator(), _job(_spec(flops=1e9)))
    heavy = _exclusive(Estimator(), _job(_spec(flops=1e10)))
    assert set(light) == set(heavy) and 1 in light
    assert heavy[1] - 100.0 > 5 * (light[1] - 100.0)
    v100 = _exclusive(Estimator(), _job(_spec(flops=1e10)), "v100")
    h100 = _exclusive(Estimator(), _job(_spec(flops=1e10)), "h100")
    assert h100[1] < heavy[1] < v100[1]


def test_gradient_statistics_arrive_within_an_epoch() -> None:
    """A job reports its statistics at every eighth of an epoch, labelled with the epoch in
    progress, then at the epoch's end; psi is judged from each."""
    catalog = shipped_catalog()
    name = "resnet50-imagenet"  # 1.28M samples an epoch: one epoch is many steps
    truth = TaskTruth(catalog.get(name), catalog.layers(name), shipped_calibration()[name], seed=1)
    spec = catalog.get(name).job_spec(catalog.layers(name))
    job = SimJob(TraceJob("j", 0.0, name, 1, 128), truth, spec, seed=1, overhead_s=0.0)
    job.set_config(Config(1, 1, 128, 0, False, (("n0", 0),)), 0.0)
    rate = truth.throughput(gpus=1, batch=128, frozen=0, nodes=1)
    step = spec.samples_per_epoch / rate / 40  # 40 steps an epoch
    labels = []
    t = 0.0
    for _ in range(41):
        reports, _ = job.step(t, t + step, 1.0)
        t += step
        if reports.grad_stats is not None:
            labels.append((reports.grad_stats.epoch, reports.metric is not None))
    mid = [(1, False)] * (GRAD_REPORTS_PER_EPOCH - 1)
    assert labels == [*mid, (1, True)]  # seven within the epoch, then its end with the metric
    assert job.grad_sums is not None
