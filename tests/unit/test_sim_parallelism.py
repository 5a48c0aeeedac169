"""Simulated LLaMA jobs declare their parallelism (catalog -> JobSpec -> store -> policy), so
they are only ever given legal GPU counts: multiples of their allocation unit of 4."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.commands import simulate
from icefrog_slurm.core.parallelism import Kind, Parallelism
from icefrog_slurm.policies.icefrog import IcefrogPolicy
from icefrog_slurm.policies.optimus_plus import OptimusPlusPolicy
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.sim import jobs as sim_jobs
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import TraceJob

LLAMA = {
    "llama-3b-squad2": Parallelism(Kind.SDP, unit=4),
    "llama-7b-sst2": Parallelism(Kind.HP, stages=4, unit=4),
}


def test_catalog_declares_the_llama_parallelism_and_the_job_spec_carries_it() -> None:
    catalog = shipped_catalog()
    for name, declared in LLAMA.items():
        task = catalog.get(name)
        assert task.parallelism == declared
        spec = task.job_spec(catalog.layers(name))
        assert spec.parallelism == declared and not spec.accepts_shared
        assert all(a % 4 == 0 for a in task.gpu_counts())
    assert (
        catalog.get("resnet18-cifar10")
        .job_spec(catalog.layers("resnet18-cifar10"))
        .parallelism.kind
        is Kind.DDP
    )


@pytest.mark.parametrize(
    ("policy", "large"), [(IcefrogPolicy, True), (IcefrogPolicy, False), (OptimusPlusPolicy, True)]
)
def test_simulated_llama_jobs_only_get_multiples_of_four_gpus(
    policy: type, large: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On nodes of 8 GPUs (so 5-7 GPUs fit one node) beside one-GPU jobs that leave odd
    capacity free, every configuration a LLaMA job trains with (with or without the
    large-model models) has a multiple of 4 GPUs. Without the declared parallelism the
    jobs were DDP in units of 1 and got 6 or 7 GPUs here."""
    seen: dict[str, list[int]] = defaultdict(list)
    original = sim_jobs.SimJob.set_config

    def record(self: sim_jobs.SimJob, config: sim_jobs.Config | None, now: float) -> None:
        if config is not None:
            seen[self.job.task].append(config.gpus)
        original(self, config, now)

    monkeypatch.setattr(sim_jobs.SimJob, "set_config", record)
    workload = [
        TraceJob("r0", 0.0, "resnet18-cifar10", 1, 128),
        TraceJob("l3", 0.0, "llama-3b-squad2", 4, 16),
        TraceJob("r1", 10.0, "mobilenetv2-cifar10", 1, 64),
        TraceJob("l7", 20.0, "llama-7b-sst2", 4, 32),
    ]
    settings = settings_from_mapping({"policy": {"large_model_models": large}})
    opts = SimOptions(gpus=16, gpus_per_node=8, seed=3, max_sim_s=4 * 3600.0)
    Engine(workload, policy(), settings=settings, options=opts).run()
    for name in LLAMA:
        assert seen[name], f"{name} never ran"
        assert all(g % 4 == 0 for g in seen[name]), (name, sorted(set(seen[name])))
    small = seen["resnet18-cifar10"] + seen["mobilenetv2-cifar10"]
    assert small  # the one-GPU jobs ran beside them


def test_default_settings_use_the_large_model_models() -> None:
    assert Settings().policy.large_model_models


@pytest.mark.parametrize(("flag", "large"), [((), True), (("--no-large-models",), False)])
def test_simulate_no_large_models_reaches_the_engine_settings(
    flag: tuple[str, ...], large: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``icefrog simulate --no-large-models``: the engine (and so the controller and the
    policy) runs with ``policy.large_model_models = false``; without it, true."""
    given: list[Settings] = []

    class Recording(Engine):
        def __init__(self, *args: Any, settings: Settings, **kw: Any) -> None:
            given.append(settings)
            super().__init__(*args, settings=settings, **kw)

    monkeypatch.setattr(simulate, "Engine", Recording)
    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\n")
    argv = ["simulate", "--workload", str(wl), "--gpus", "4", "--policy", "icefrog",
            "--out", str(tmp_path / "o"), "--quiet", *flag]  # fmt: skip
    assert main(argv) == 0
    assert [s.policy.large_model_models for s in given] == [large]
