"""The Model Trainer under real torchrun: 2 processes, gloo, CPU, the digits MLP.

What is checked: frozen parameters get no gradient, no backward work and no all-reduce,
and do not change; unfreezing continues from their kept Adam state; a run resized 2 -> 1
process (by a decision, and by a signal through ``icefrog launch``) resumes from its
checkpoint with the same progress and a comparable metric; statistics per layer; the
registered objects (LR scheduler, GradScaler, a user's counter) resume exactly on another
process count; a declared global batch makes the same optimizer steps on 1 and 2 processes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.controller.ports import FsJobFiles

pytest.importorskip("torch")

from icefrog_launcher.launch import REQUEUE_EXIT_CODE
from icefrog_slurm.core.parallelism import Kind, Parallelism
from icefrog_slurm.protocol import parse_envelope, parse_payload

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "integration" / "trainer_probe.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _env(workdir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICEFROG_", "SLURM_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        ICEFROG_WORKDIR=str(workdir),
        ICEFROG_INBOX=str(workdir / "inbox"),
        SLURM_JOB_ID="101",
        PROBE_OUT=str(workdir / "out.json"),
        **extra,
    )
    return env


def _torchrun(nproc: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [str(TORCHRUN), f"--nproc-per-node={nproc}", "--standalone", str(PROBE)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)


def _reports(workdir: Path, kind: str) -> list[Any]:
    folder = workdir / "inbox" / "101"
    out = []
    for path in sorted(folder.glob(f"*-{kind}.json")):
        envelope = parse_envelope(path.read_bytes())  # the controller's own validation
        out.append(parse_payload(kind, envelope.payload))
    return out


def test_freeze_then_unfreeze(tmp_path: Path) -> None:
    sdp = '{"kind": "sdp", "stages": 1, "unit": 1}'  # the declaration travels (not used here)
    env = _env(tmp_path, PROBE_MODE="freeze", ICEFROG_MAX_EPOCHS="3", ICEFROG_PARALLELISM=sdp)
    env["ICEFROG_MAX_PHYSICAL_EPOCHS"] = "3"  # else epoch 1 (psi < 1) adds a 4th
    env["ICEFROG_GLOBAL_BATCH"] = "64"  # declared: 2 x 32 a step, no accumulation, said once
    done = _torchrun(2, env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    e0, e1, e2 = out["epochs"]
    assert (e0["frozen"], e1["frozen"], e2["frozen"]) == (0, 3, 0)
    # epoch 1: the 4 parameters of layers 1-2 (two Linear) have no gradient, the rest do
    assert e1["grad_none"] == [True] * 4 + [False] * 4
    assert not any(e0["grad_none"]) and not any(e2["grad_none"])
    # real truncation: the frozen prefix's output records no autograd graph
    assert e1["boundary_requires_grad"] == [False] and e0["boundary_requires_grad"] == [True]
    # DDP all-reduces only the trainable parameters
    assert e1["synced_per_step"] == e1["trainable_numel"] < e0["synced_per_step"]
    # frozen parameters and their Adam state did not change during epoch 1
    assert e1["state"] == e0["state"]
    # unfreezing continues from the kept state: step + 1, exp_avg = b1 * old + (1 - b1) g
    first = e2["first_step"]
    assert first["after"]["step"] == [s + 1 for s in e0["state"]["step"]]
    old, grad, new = e0["state"]["exp_avg"][0], first["grad"][0], first["after"]["exp_avg"][0]
    expected = [0.9 * o + 0.1 * g for o, g in zip(old, grad, strict=True)]
    assert new == pytest.approx(expected, rel=1e-4, abs=1e-7)
    # per-layer statistics: 5 layers each epoch; frozen layers report their at-freeze values
    stats = _reports(tmp_path, "grad_stats")
    assert [s.frozen for s in stats] == [0, 3, 0] and all(len(s.grad_var) == 5 for s in stats)
    assert all(v > 0 for v in stats[0].grad_var[1:]) and stats[0].grad_var[0] == 0.0
    assert stats[1].grad_var[:3] == stats[0].grad_var[:3]
    assert stats[1].grad_var[3:] != stats[0].grad_var[3:]
    # effective progress: the frozen epoch counted psi < 1 per sample (spec section 4)
    assert out["samples_done"] == 4500 and out["effective"] < 4500
    profiles = [p[0] for p in _reports(tmp_path, "profile")]
    assert [p.frozen for p in profiles] == [0, 3, 0] and all(p.t_iter_s > 0 for p in profiles)
    finished = _reports(tmp_path, "finished")
    assert [f.reason for f in finished] == ["max_physical_epochs"]  # the cap, both ranks
    (spec,) = _reports(tmp_path, "register")
    assert spec.parallelism == Parallelism(Kind.SDP) and not spec.accepts_shared
    assert spec.global_batch == 64
    note = "--global-batch 64: a step covers 2 x 32 x 1 micro-steps = 64 samples"
    assert done.stderr.count(note) == 1


def test_resize_two_to_one_matches_uninterrupted(tmp_path: Path) -> None:
    """2 processes x batch 32 for 2 epochs, then (decision: 1 GPU, batch 64) 1 process.

    The global batch (64), the data order and the optimizer state are the same, so the
    gradients are mathematically those of the uninterrupted run; only the order of the
    floating-point reduction differs. Tolerance: 0.02 accuracy (6 of 297 validation
    images), which allows that rounding to grow over 4 epochs but catches a resume that
    restarts the model, the optimizer or the data position."""
    base, resized = tmp_path / "base", tmp_path / "resized"
    epochs = {"ICEFROG_MAX_EPOCHS": "4", "ICEFROG_BATCH": "32-64"}
    done = _torchrun(2, _env(base, PROBE_MODE="plain", **epochs))
    assert done.returncode == 0, done.stderr[-3000:]
    started = time.time()
    first = _torchrun(2, _env(resized, PROBE_MODE="resize", PROBE_RESIZE_AT="1", **epochs))
    assert first.returncode != 0 and "requeue requested" in first.stderr
    # the checkpoint marker, found where and as the controller looks for it
    marked = FsJobFiles().checkpoint_marked
    assert marked(run_dir=str(resized), since=started, owner_uid=os.getuid())
    second = _torchrun(1, _env(resized, PROBE_MODE="plain", **epochs))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from checkpoint" in second.stderr and "was 2" in second.stderr
    a = json.loads((base / "out.json").read_text())
    b = json.loads((resized / "out.json").read_text())
    assert a["samples_done"] == b["samples_done"] == 4 * 1500
    assert [e["epoch"] for e in b["epochs"]] == [2, 3]  # the resumed part only
    assert b["final_acc"] == pytest.approx(a["final_acc"], abs=0.02)
    progress = _reports(resized, "progress")
    assert [p.samples_done for p in progress] == [1500, 3000, 4500, 6000]
    profiles = [p[0] for p in _reports(resized, "profile")]
    assert [(p.gpus, p.batch) for p in profiles] == [(2, 32), (2, 32), (1, 64), (1, 64)]


def test_launch_signal_checkpoints_mid_epoch_and_resumes(tmp_path: Path) -> None:
    """``icefrog launch`` gets USR1 mid-training: exit 75 after a checkpoint taken at a
    step boundary inside the epoch; the relaunch on 1 process finishes the same epochs."""
    env = _env(tmp_path, PROBE_MODE="plain")
    launch = [sys.executable, "-m", "icefrog_slurm", "launch", "--workdir", str(tmp_path),
              "--inbox", str(tmp_path / "inbox"), "--max-epochs", "30", "--batch", "8",
              "--torchrun", str(TORCHRUN)]  # fmt: skip
    proc = subprocess.Popen(
        [*launch, "--procs-per-node", "2", "--", str(PROBE)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    inbox = tmp_path / "inbox" / "101"
    deadline = time.monotonic() + 120
    while not list(inbox.glob("*-progress.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.3)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT_CODE, err[-3000:]
    assert "requeue requested (signal 15)" in err
    from icefrog_launcher import checkpoint

    found = checkpoint.load_latest(tmp_path / "checkpoints")
    assert found is not None
    state = found[1]
    assert state["samples_done"] == state["epoch"] * 1500 + state["position"]
    # resume on one process and stop after the next epoch: progress continues from there
    env["ICEFROG_MAX_EPOCHS"] = str(state["epoch"] + 1)
    done = subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", "launch", "--workdir", str(tmp_path),
         "--inbox", str(tmp_path / "inbox"), "--max-epochs", str(state["epoch"] + 1),
         "--batch", "8", "--torchrun", str(TORCHRUN), "--", str(PROBE)],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["samples_done"] == (state["epoch"] + 1) * 1500
    assert out["epochs"][0]["steps"] == -(-(1500 - state["position"]) // 8)


def test_registered_objects_resume_exactly_on_another_process_count(tmp_path: Path) -> None:
    """A per-epoch CosineAnnealingLR (``scheduler=``), a GradScaler (``scaler=``) and a
    user's step counter (``register_state``): 2 processes for 6 epochs, or 2 epochs on 2
    then (decision: 1 GPU, the same global batch) 4 on 1 process. Every epoch's learning
    rate, scaler state and count are those of the uninterrupted run, to the last digit.
    Before, the schedule restarted at the resume (measured: LR 0.4665/0.3750 at epochs 4-5
    instead of 0.25/0.067 of lr 1), the scaler and the counter from their fresh states.
    After the loop the 2 processes all-reduce (the group outlives the loop), and rank 0
    works 2 s longer while rank 1 goes to its exit: the run still ends with 0."""
    base, resized = tmp_path / "base", tmp_path / "resized"
    epochs = {"ICEFROG_MAX_EPOCHS": "6", "ICEFROG_BATCH": "32-64"}
    done = _torchrun(2, _env(base, PROBE_MODE="objects", **epochs))
    assert done.returncode == 0, done.stderr[-3000:]
    first = _torchrun(2, _env(resized, PROBE_MODE="objects", PROBE_RESIZE_AT="1", **epochs))
    assert first.returncode != 0 and "requeue requested" in first.stderr
    second = _torchrun(1, _env(resized, PROBE_MODE="objects", **epochs))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from checkpoint" in second.stderr and "was 2" in second.stderr
    assert "warning" not in second.stderr
    a = json.loads((base / "out.json").read_text())
    b = json.loads((resized / "out.json").read_text())
    keys = ("epoch", "lr", "scaler", "counter")
    whole = [{k: e[k] for k in keys} for e in a["epochs"]]
    assert [{k: e[k] for k in keys} for e in b["epochs"]] == whole[2:]
    cosine = [0.025 * (1 + math.cos(math.pi * e / 6)) for e in range(6)]  # lr 0.05, T_max 6
    assert [e["lr"] for e in whole] == pytest.approx(cosine, rel=1e-12)
    assert [e["counter"] for e in whole] == [24 * (e + 1) for e in range(6)]  # 1500 / 64
    scales = [e["scaler"]["scale"] for e in whole]
    assert scales == sorted(scales) and scales[-1] > scales[0]  # it grew: a state to keep
    # after the loop the process group still works; rank 1 reached its exit while rank 0
    # worked on, waited there for it, and both ended cleanly (exit 0 above)
    assert a["after_loop_sum"] == 3.0
    assert "exit barrier" not in done.stderr


def test_global_batch_same_steps_on_one_and_two_processes(tmp_path: Path) -> None:
    """--global-batch 64 with per-GPU batches of 8-16: 1 process accumulates 4 micro-steps
    of 16, 2 processes 2 of 16 each. The optimizer steps cover the same samples (one global
    order), so after 2 epochs (48 steps, SGD with momentum, no dropout) the parameters are
    the same within float rounding; 2 processes all-reduce once an optimizer step. Before,
    both trained at 8 a GPU without accumulating: steps of 8 and of 16 samples."""
    env = {"ICEFROG_MAX_EPOCHS": "2", "ICEFROG_BATCH": "8-16", "ICEFROG_GLOBAL_BATCH": "64"}
    runs = {}
    for procs in (1, 2):
        done = _torchrun(procs, _env(tmp_path / str(procs), PROBE_MODE="global", **env))
        assert done.returncode == 0, done.stderr[-3000:]
        k = 4 // procs
        assert f"a step covers {procs} x 16 x {k} micro-steps = 64 samples" in done.stderr
        runs[procs] = json.loads((tmp_path / str(procs) / "out.json").read_text())
        profiles = [p[0] for p in _reports(tmp_path / str(procs), "profile")]
        assert [(p.gpus, p.batch) for p in profiles] == [(procs, 16)] * 2
        progress = _reports(tmp_path / str(procs), "progress")
        assert [p.samples_done for p in progress] == [1500, 3000]
    one, two = runs[1], runs[2]
    assert one["optimizer_steps"] == two["optimizer_steps"] == 2 * 24  # ceil(1500 / 64)
    assert [e["steps"] for e in one["epochs"]] == [94, 94]  # micro-steps: ceil(1500 / 16)
    assert [e["steps"] for e in two["epochs"]] == [47, 47]  # ceil(1500 / 32)
    assert two["synced_numel"] == two["trainable_numel"] * two["optimizer_steps"]
    assert one["synced_numel"] == 0
    for p1, p2 in zip(one["params"], two["params"], strict=True):
        assert p1 == pytest.approx(p2, abs=2e-5)
