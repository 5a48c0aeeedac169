"""The controller's side of a shared job's decision: the predicted footprint the admission
rule used (eq 8) goes into decision.json (controller.decisions), written by the real
FsJobFiles into a real folder and read back as the launcher reads it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from icefrog_launcher.decision import read_decision
from icefrog_launcher.launch import MPS_MEMORY, MPS_THREADS, mps_env
from icefrog_slurm.controller.decisions import DecisionWriter, shared_load
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.domain.plan import JobPlan, Plan, SlurmRequest
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.settings import SharingSettings

MPS = SharingSettings(gres="mps", memory_safety=1.2)
PAIRED = Allocation(
    job_id=1, gpus=1, batch=32, frozen=2, shared=True, nodes=("n1",),
    predicted_util=0.37, predicted_mem_bytes=6e9,
)  # fmt: skip


def test_a_shared_allocation_carries_its_prediction_and_the_sharing_kind() -> None:
    load = shared_load(PAIRED, MPS)
    assert load is not None
    assert (load.kind, load.util, load.peak_mem_bytes) == ("mps", 0.37, 6e9)
    assert load.mem_limit_bytes == pytest.approx(1.2 * 6e9)
    assert shared_load(PAIRED, SharingSettings()).kind == "shard"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "allocation",
    [
        Allocation(job_id=1, gpus=2, batch=32, frozen=0, predicted_util=0.4),
        Allocation(job_id=1, gpus=1, batch=32, frozen=0, shared=True),  # no prediction
        Allocation(1, 1, 32, 0, shared=True, predicted_util=1.7, predicted_mem_bytes=1.0),
        Allocation(1, 1, 32, 0, shared=True, predicted_util=math.nan, predicted_mem_bytes=1.0),
    ],
)
def test_no_load_for_an_exclusive_or_unpredicted_job(allocation: Allocation) -> None:
    assert shared_load(allocation, MPS) is None


class _NoStore:
    def transaction(self) -> None:  # only a refused folder would be logged
        raise AssertionError("nothing is refused here")


def test_the_written_decision_gives_the_launcher_the_limits(tmp_path: Path) -> None:
    run_dir = tmp_path / "job"
    run_dir.mkdir(mode=0o700)
    writer = DecisionWriter(
        files=FsJobFiles(), store=_NoStore(), clock=lambda: 0.0,  # type: ignore[arg-type]
        job_dir=lambda sid, reported: str(run_dir), sharing=MPS,
    )  # fmt: skip
    job = JobPlan(1, "17", 0, PAIRED, SlurmRequest(gres=None), "none", run_dir=str(run_dir))
    writer.write(Plan(time=0.0, round_no=5, policy="icefrog", capacity_gpus=4, jobs=(job,),
                      decided_round=5))  # fmt: skip
    decision = read_decision(run_dir / "decision.json")
    assert decision is not None and decision.round == 5 and decision.shared
    slurm = {MPS_THREADS: "40", "CUDA_VISIBLE_DEVICES": "0"}  # Slurm's mps share: 40 %
    limits = mps_env(slurm, decision.load)
    assert limits[MPS_THREADS] == "37"  # the 37 % predicted, below Slurm's 40
    assert limits[MPS_MEMORY] == f"0={math.ceil(1.2 * 6e9 / 2**20)}M"
