"""The job side of sharing a GPU through CUDA MPS: the decision's predicted footprint
(protocol.SharedLoad) and the MPS limits the launcher gives every training process
(launch.mps_env, child_env, mps_load, and ``icefrog launch --dry-run``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icefrog_launcher.launch import (
    MPS_MEMORY,
    MPS_THREADS,
    child_env,
    layout_from_env,
    mps_env,
    mps_load,
)
from icefrog_slurm.cli import main
from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import Decision, SharedLoad, parse_decision

GIB = 2**30
MPS = SharedLoad(kind="mps", util=0.423, peak_mem_bytes=10 * GIB)
SLURM_MPS = {"CUDA_VISIBLE_DEVICES": "0", MPS_THREADS: "50", "SLURM_JOB_ID": "7"}


def test_the_decisions_load_round_trips_and_an_exclusive_decision_has_none() -> None:
    shared = Decision(round=3, gpus=1, batch=32, frozen=2, shared=True, load=MPS)
    assert parse_decision(shared.to_json()) == shared
    alone = Decision(round=3, gpus=2, batch=32, frozen=0)
    assert "load" not in json.loads(alone.to_json())
    assert parse_decision(alone.to_json()).load is None


@pytest.mark.parametrize(
    ("load", "message"),
    [
        ({"kind": "mig", "util": 0.5, "peak_mem_bytes": 1}, "decision.load.kind: must be one of"),
        ({"kind": "mps", "util": 1.5, "peak_mem_bytes": 1}, "decision.load.util: must be <= 1"),
        ({"kind": "mps", "util": 0.5, "peak_mem_bytes": -1}, "peak_mem_bytes: must be >= 0"),
        ({"kind": "mps", "util": 0.5, "peak_mem_bytes": 1, "x": 1}, "decision.load.x: unknown"),
        ({"kind": "mps", "util": 0.5, "peak_mem_bytes": 1, "memory_safety": 0.5}, "safety"),
        ([0.5], "decision.load: must be an object"),
    ],
)
def test_a_bad_load_is_refused_naming_the_field(load: object, message: str) -> None:
    doc = {"round": 1, "gpus": 1, "batch": 8, "frozen": 0, "shared": True, "load": load}
    with pytest.raises(InputError, match=message):
        parse_decision(json.dumps(doc))


def test_mps_limits_are_the_prediction_and_the_lower_percentage_wins() -> None:
    # 42.3 % rounds up to 43, below Slurm's 50: the prediction's; 1.1 x 10 GiB in MiB
    assert mps_env(SLURM_MPS, MPS) == {MPS_THREADS: "43", MPS_MEMORY: "0=11264M"}
    # Slurm allotted less than predicted: the job never gets more than its mps:N
    assert mps_env({**SLURM_MPS, MPS_THREADS: "30"}, MPS)[MPS_THREADS] == "30"
    # a job whose predicted utilisation is ~0 still gets a usable share
    tiny = SharedLoad(kind="mps", util=0.0, peak_mem_bytes=1.0, memory_safety=1.0)
    assert mps_env(SLURM_MPS, tiny) == {MPS_THREADS: "1", MPS_MEMORY: "0=1M"}


def test_no_mps_limits_without_an_mps_share_and_an_mps_load() -> None:
    assert mps_env(SLURM_MPS, None) == {}
    assert mps_env(SLURM_MPS, SharedLoad("shard", 0.4, GIB)) == {}
    # a stale decision saying MPS for a job Slurm started on a whole GPU sets nothing
    assert mps_env({"CUDA_VISIBLE_DEVICES": "0,1"}, MPS) == {}


@pytest.mark.parametrize("bad", ["0", "101", "abc", "50.5", ""])
def test_a_bad_slurm_percentage_is_refused(bad: str) -> None:
    with pytest.raises(InputError, match=MPS_THREADS):
        mps_env({**SLURM_MPS, MPS_THREADS: bad}, MPS)


def test_every_training_process_inherits_the_limits_through_torchruns_environment() -> None:
    layout = layout_from_env(SLURM_MPS)
    env = child_env(SLURM_MPS, layout, {"ICEFROG_X": "1"}, MPS)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"  # Slurm's device, as torch then sees it: cuda:0
    assert (env[MPS_THREADS], env[MPS_MEMORY], env["ICEFROG_X"]) == ("43", "0=11264M", "1")
    assert child_env(SLURM_MPS, layout, {}) == SLURM_MPS  # no load: Slurm's as they are


def test_mps_load_waits_for_the_decision_only_in_an_mps_job() -> None:
    shared = Decision(round=2, gpus=1, batch=8, frozen=0, shared=True, load=MPS)
    answers: list[Decision | None] = [None, Decision(1, 1, 8, 0), shared]
    slept: list[float] = []

    def read() -> Decision | None:
        return answers.pop(0) if answers else shared

    assert mps_load(SLURM_MPS, read, sleep=slept.append) == MPS
    assert slept == [1.0, 1.0]  # no decision, then an exclusive one: read again
    slept.clear()
    assert mps_load({"CUDA_VISIBLE_DEVICES": "0"}, lambda: None, sleep=slept.append) is None
    assert slept == []  # not an MPS job: nothing to wait for
    assert mps_load(SLURM_MPS, lambda: None, wait_s=3, sleep=slept.append) is None
    assert slept == [1.0, 1.0, 1.0]  # none came: the job runs under Slurm's share alone


def test_launch_dry_run_shows_the_mps_limits_from_the_decision(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {**SLURM_MPS, "ICEFROG_MANAGED": "1"}.items():
        monkeypatch.setenv(key, value)
    shared = Decision(round=4, gpus=1, batch=8, frozen=0, shared=True, load=MPS)
    (tmp_path / "decision.json").write_text(shared.to_json())
    code = main(["launch", "--workdir", str(tmp_path), "--dry-run", "--", "train.py"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"{MPS_THREADS}=43" in out and f"{MPS_MEMORY}=0=11264M" in out


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_the_environment_real_slurm_gives_an_mps_job(version: str) -> None:
    """Slurm's own variables in an ``mps:30`` job (captured from the dev cluster in MPS mode:
    tests/golden/slurm-*-mps/job-env-a.txt): one process on the GPU torch sees as cuda:0,
    the thread percentage the lower of Slurm's 30 and the prediction."""
    golden = Path(__file__).resolve().parents[1] / "golden" / f"slurm-{version}-mps"
    lines = (golden / "job-env-a.txt").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert env[MPS_THREADS] == "30"
    layout = layout_from_env(env)
    assert (layout.nproc_per_node, layout.cuda_visible_devices) == (1, None)  # Slurm's "0"
    child = child_env(env, layout, {}, MPS)
    assert (child["CUDA_VISIBLE_DEVICES"], child[MPS_THREADS]) == ("0", "30")
    assert child[MPS_MEMORY] == "0=11264M"
    small = SharedLoad(kind="mps", util=0.2, peak_mem_bytes=GIB)
    assert child_env(env, layout, {}, small)[MPS_THREADS] == "20"
