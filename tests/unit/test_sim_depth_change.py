"""A change of the frozen depth alone costs no restart (spec section 9 step 6: the trainer
applies a new (m, l) at an epoch boundary; only a change of GPUs checkpoints and restarts)."""

from __future__ import annotations

from icefrog_slurm.controller.tick import target_of
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.jobs import Config, SimJob
from icefrog_slurm.sim.truth import TaskTruth
from icefrog_slurm.sim.workload import TraceJob

TASK = "resnet18-cifar10"


def test_the_controller_plans_no_action_for_a_depth_only_change() -> None:
    before = Allocation(job_id=1, gpus=2, batch=64, frozen=0, nodes=("n0",))
    after = Allocation(job_id=1, gpus=2, batch=128, frozen=6, nodes=("n0",))
    assert target_of(before, Settings()) == target_of(after, Settings())


def test_a_simulated_job_refreezes_without_the_reallocation_overhead() -> None:
    catalog = shipped_catalog()
    truth = TaskTruth(catalog.get(TASK), catalog.layers(TASK), shipped_calibration()[TASK], seed=1)
    spec = catalog.get(TASK).job_spec(catalog.layers(TASK))
    job = SimJob(TraceJob("j", 0.0, TASK, 1, 128), truth, spec, seed=1, overhead_s=60.0)
    gpus = (("n0", 0),)
    job.set_config(Config(1, 1, 128, 0, False, gpus), 0.0)
    assert job.busy_until == 60.0
    job.step(0.0, 600.0, 1.0)
    job.set_config(Config(1, 1, 128, 6, False, gpus), 600.0)  # same GPU, 6 layers frozen
    assert job.busy_until == 60.0 and job.outcome.reallocations == 0 and job.run.frozen == 6
    job.set_config(Config(1, 1, 128, 6, False, (("n1", 0),)), 900.0)  # another GPU: restart
    assert job.busy_until == 960.0 and job.outcome.reallocations == 1


def test_a_simulated_job_counts_its_time_on_a_shared_gpu() -> None:
    """summary.json's shared hours: the running time on a GPU it shared, at half a GPU's
    GPU-hours, and none of its time on a GPU of its own."""
    catalog = shipped_catalog()
    truth = TaskTruth(catalog.get(TASK), catalog.layers(TASK), shipped_calibration()[TASK], seed=1)
    spec = catalog.get(TASK).job_spec(catalog.layers(TASK))
    job = SimJob(TraceJob("j", 0.0, TASK, 1, 128), truth, spec, seed=1, overhead_s=0.0)
    job.set_config(Config(1, 1, 128, 0, False, (("n0", 0),)), 0.0)
    job.step(0.0, 300.0, 1.0)
    assert job.outcome.shared_seconds == 0.0 and job.outcome.gpu_seconds == 300.0
    job.set_config(Config(1, 1, 128, 0, True, (("n0", 1),)), 300.0)
    job.step(300.0, 900.0, 0.5)
    assert job.outcome.shared_seconds == 600.0 and job.outcome.gpu_seconds == 600.0
