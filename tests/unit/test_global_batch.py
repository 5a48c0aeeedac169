"""A job's fixed global batch (JobSpec.global_batch): its validation, its declaration, the
one per-GPU batch rule, and the estimator, the simulator and the trainer following it."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

import pytest

from icefrog_launcher.config import JobConfig
from icefrog_slurm import declaration
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot, Snapshot
from icefrog_slurm.errors import InputError
from icefrog_slurm.policies.estimate import Candidate, Estimator
from icefrog_slurm.policies.icefrog import IcefrogPolicy
from icefrog_slurm.protocol import (
    MAX_GLOBAL_BATCH,
    JobSpec,
    accumulation_steps,
    fixed_per_gpu_batch,
    parse_payload,
)
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import TraceJob

SETTINGS = settings_from_mapping({})
L = 4
FREE = JobSpec(1, 8, 8, 128, 0.9, "acc", ">=", 0.9, 10, 10000, (1.0,) * L, (1.0,) * L)
FIXED = replace(FREE, global_batch=384)
TASK = "resnet18-cifar10"


def _register(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "min_gpus": 1, "max_gpus": 8, "min_batch": 8, "max_batch": 128,
        "max_frozen_fraction": 0.9, "target_metric": "acc", "target_op": ">=",
        "target_value": 0.9, "max_epochs": 10, "samples_per_epoch": 10000,
        "layer_flops": [1.0] * L, "layer_param_bytes": [1.0] * L,
    }  # fmt: skip
    return doc | changes


def test_the_per_gpu_rule_splits_clips_and_accumulates() -> None:
    expected = {1: 128, 2: 128, 3: 128, 4: 96, 5: 77, 8: 48, 64: 8}  # ceil(384/a) in [8, 128]
    assert {a: fixed_per_gpu_batch(384, a, 8, 128) for a in expected} == expected
    assert FIXED.batch_candidates(5) == (77,)
    assert accumulation_steps(384, 1, 128) == 3 and accumulation_steps(384, 4, 96) == 1
    assert FREE.batch_candidates(5) == (8, 16, 32, 64, 128)
    with pytest.raises(InputError, match="global batch 0 on 2 GPUs"):
        fixed_per_gpu_batch(0, 2, 8, 128)


def test_the_register_report_carries_and_validates_the_global_batch() -> None:
    assert parse_payload("register", _register()).global_batch == 0  # older jobs: free
    assert parse_payload("register", _register(global_batch=384)) == FIXED
    bad_values = ((-1, "must be >= 0"), (1.5, "must be an integer"),
                  (True, "must be an integer"), (MAX_GLOBAL_BATCH + 1, "must be <="))  # fmt: skip
    for bad, why in bad_values:
        with pytest.raises(InputError, match=rf"global_batch: {why}"):
            parse_payload("register", _register(global_batch=bad))


def _declared(*argv: str) -> declaration.Declaration:
    parser = argparse.ArgumentParser()
    declaration.add_arguments(parser)
    return declaration.from_args(parser.parse_args(list(argv)))


def test_global_batch_is_declared_launched_and_handed_to_the_trainer() -> None:
    declared = _declared("--gpus", "1-8", "--batch", "8-128", "--global-batch", "384")
    assert declared.job_spec(samples_per_epoch=10).global_batch == 384
    assert _declared(*declared.launch_options()) == declared  # icefrog submit -> launch
    assert "--global-batch=384" in declared.launch_options()
    assert not any("global" in o for o in _declared().launch_options())
    config = JobConfig(global_batch=384)
    assert JobConfig.from_env(config.to_env()).declaration.global_batch == 384
    with pytest.raises(InputError, match="--global-batch: must be within"):
        _declared("--global-batch", "-2")


def _snapshot(spec: JobSpec, samples: tuple[ProfileSample, ...] = ()) -> JobSnapshot:
    rec = JobRecord(1, "j", 0, "root", "pending", 0.0, None, None, spec, ("7",), Progress())
    return JobSnapshot(JobView(rec, samples, None), None, Current())


def _cands(job: JobSnapshot) -> dict[int, Candidate]:
    got = Estimator().candidates(job, now=100.0, gpus_per_node=8, capacity=16, settings=SETTINGS)
    return {c.gpus: c for c in got if not c.shared}


def test_the_estimator_offers_exactly_the_batch_a_fixed_batch_job_will_use() -> None:
    fixed = _cands(_snapshot(FIXED))
    assert set(fixed) == {1, 2, 3, 4, 5, 6, 7, 8}
    for a, cand in fixed.items():
        assert cand.choice.batch == min(max(math.ceil(384 / a), 8), 128)
    free = _cands(_snapshot(FREE))
    assert {c.choice.batch for c in free.values()} <= {8, 16, 32, 64, 128}


def test_a_fixed_batch_job_is_planned_at_the_samples_per_s_of_its_real_batch() -> None:
    """Measured at (4 GPUs, 96 a GPU): T at 4 is those samples/s, not a bigger batch's."""
    rate = 900.0
    sample = ProfileSample(4, 96, 0, False, 0.0, 0.0, 0.0, 4 * 96 / rate, rate)
    fixed = _cands(_snapshot(FIXED, (sample,)))[4].choice
    assert (fixed.batch, fixed.throughput) == (96, pytest.approx(rate))
    free = _cands(_snapshot(FREE, (sample,)))[4].choice
    assert free.batch == 128 and free.throughput > rate  # the free job would pick a bigger m


class _Recording(IcefrogPolicy):
    """ICEFROG, noting for each decided unshared allocation the estimator's candidate."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int, int, float, bool]] = []  # a, m, l, T, measured

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> Any:
        result = super().decide(snapshot, settings=settings)
        for job in snapshot.jobs:
            alloc = result.allocations.get(job.id)
            if alloc is None or alloc.gpus == 0 or alloc.shared:
                continue
            cands = self.estimator.candidates(
                job, now=snapshot.time, gpus_per_node=4, capacity=4, settings=settings
            )
            cand = next(c for c in cands if (c.gpus, c.shared) == (alloc.gpus, False))
            measured = any(  # the job measured this configuration before the round
                (s.gpus, s.batch, s.frozen) == (alloc.gpus, alloc.batch, alloc.frozen)
                for s in job.view.samples
            )
            self.seen.append(
                (alloc.gpus, alloc.batch, alloc.frozen, cand.choice.throughput, measured)
            )
        return result


def test_a_fixed_batch_job_s_predicted_throughput_is_what_it_really_trains_at() -> None:
    """One ResNet18 job keeping its global batch 128 on 4 GPUs (``--batch paper``): every
    decided configuration's per-GPU batch is the one the job really trains with, and once
    the job has measured that configuration its predicted T is the truth's T there within
    the fit's (noise's) error. Freezing is off: its model's error is another subject."""
    policy = _Recording()
    opts = SimOptions(gpus=4, gpus_per_node=4, seed=1, fixed_batch=True, freeze=False)
    engine = Engine([TraceJob("r18", 0.0, TASK, 1, 128)], policy, settings=Settings(), options=opts)
    result = engine.run()
    truth = engine.truths[engine.catalog.resolve(TASK)]
    spec = engine.jobs[0].spec
    assert spec.global_batch == 128 and result.jobs[0].reached_target
    assert policy.seen and any(measured for *_, measured in policy.seen)
    for gpus, batch, frozen, predicted, measured in policy.seen:
        assert batch == fixed_per_gpu_batch(128, gpus, spec.min_batch, spec.max_batch)
        real = truth.throughput(gpus=gpus, batch=batch, frozen=frozen, nodes=1)
        if measured:
            assert predicted == pytest.approx(real, rel=0.1)


@pytest.mark.torch
def test_the_trainer_accumulates_by_the_same_rule(tmp_path: Any) -> None:
    """The trainer's m and k are the protocol's, and an optimizer step takes k loader
    batches: for B = 40 on one process with batches of 8-16, 3 micro-steps of 16 (48
    samples, the nearest above 40); B = 8: one of 8; B = 100: 7 of 16."""
    import signal

    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset

    from icefrog_launcher.trainer import Trainer

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        for wanted, m, k in ((40, 16, 3), (8, 8, 1), (100, 16, 7)):
            assert fixed_per_gpu_batch(wanted, 1, 8, 16) == m
            assert accumulation_steps(wanted, 1, m) == k
            model = torch.nn.Sequential(torch.nn.Linear(4, 2))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            workdir = str(tmp_path / str(wanted))
            config = JobConfig(batch=(8, 16), global_batch=wanted, workdir=workdir)
            data = TensorDataset(torch.randn(400, 4), torch.randint(0, 2, (400,)))
            trainer = Trainer(model, optimizer, data, config=config, env={})
            next(trainer.epochs())
            sizes = []
            for x, y in trainer.loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(trainer.model(x), y).backward()
                optimizer.step()
                sizes.append(len(x))
                if trainer.step == 2:
                    break
            assert (trainer.batch, trainer.accumulation.steps) == (m, k)
            assert sizes == [m] * 2 * k  # two optimizer steps of k micro-batches
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
