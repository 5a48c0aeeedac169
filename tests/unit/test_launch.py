"""The launcher's pure parts: target and range parsing, the node layout read from Slurm's
variables (plain dicts: this is logic, not a Slurm mock) and the torchrun command."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from icefrog_launcher.config import JobConfig, Target, parse_range, parse_target
from icefrog_launcher.launch import (
    REQUEUE_EXIT_CODE,
    SHUTDOWN_TIMEOUT_ENV,
    SHUTDOWN_TIMEOUT_S,
    build_command,
    child_env,
    first_host,
    layout_from_env,
    rendezvous_host,
    run_training,
    shutdown_env,
    stop_signal,
)
from icefrog_launcher.relay import main as relay_main
from icefrog_slurm.cli import main
from icefrog_slurm.errors import InputError
from icefrog_slurm.runfiles import CHECKPOINT_MARKER


def test_parse_target() -> None:
    assert parse_target("val_acc>=0.94") == Target("val_acc", ">=", 0.94)
    assert parse_target(" val_loss <= 1e-2 ") == Target("val_loss", "<=", 0.01)
    assert parse_target("val_acc>=0.94").reached(0.95)
    assert not parse_target("val_loss<=0.1").reached(0.2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("val_acc>0.9", "operator must be >= or <="),
        ("val_acc==0.9", "operator must be >= or <="),
        ("val_acc>=high", "'high' is not a number"),
        ("val_acc>=inf", "must be finite"),
        ("0.94", "expected NAME>=NUMBER"),
        ("", "expected NAME>=NUMBER"),
    ],
)
def test_parse_target_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_target(text)


def test_parse_range() -> None:
    assert parse_range("1-8", "gpus") == (1, 8)
    assert parse_range("4", "gpus") == (4, 4)
    for bad, message in [
        ("8-1", "smaller than"),
        ("0-2", ">= 1"),
        ("a-b", "LO-HI"),
        ("1-2-3", "LO-HI"),
    ]:
        with pytest.raises(InputError, match=message):
            parse_range(bad, "gpus")


def test_config_env_round_trip() -> None:
    config = JobConfig(
        gpus=(1, 8),
        batch=(32, 256),
        max_frozen=0.5,
        target=parse_target("val_acc>=0.9"),
        max_epochs=7,
        workdir="/shared/w",
        inbox="/shared/inbox",
        job_name="resnet",
        slurm_job_id="12",
    )
    env = {**config.to_env(), "SLURM_JOB_ID": "12"}
    assert JobConfig.from_env(env) == config
    assert config.decision_path == "/shared/w/decision.json"
    with pytest.raises(InputError, match="--max-frozen"):
        JobConfig.from_env({"ICEFROG_MAX_FROZEN": "1.5"})


def test_first_host() -> None:
    assert first_host("node[03-05,9],gpu1") == "node03"
    assert first_host("gpu1,gpu2") == "gpu1"
    assert first_host("node[1-4]") == "node1"
    assert first_host("n[001-002]x") == "n001x"  # the suffix after the range is kept
    assert first_host("rack[1-2]-node[01-02],x") == "rack1-node01"
    assert first_host("n[1-999999999999]") == "n1"  # only the first item, never expanded whole
    for bad in ("@group", "n[1-2", "n[a-b]", "a b", "n[]"):
        with pytest.raises(InputError, match="SLURM_NODELIST"):
            first_host(bad)
    with pytest.raises(InputError):
        first_host("")


def test_layout_gpu_job_single_node() -> None:
    env = {"SLURM_JOB_NUM_NODES": "1", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "7"}
    layout = layout_from_env(env)
    assert (layout.nnodes, layout.nproc_per_node, layout.cuda_visible_devices) == (1, 2, None)
    cmd = build_command(layout, ["train.py", "--lr", "0.1"])
    assert cmd == [
        "torchrun",
        "--nproc-per-node=2",
        "--standalone",
        "--nnodes=1",
        "train.py",
        "--lr",
        "0.1",
    ]


def test_layout_shard_job_maps_ordinals_to_cuda_visible_devices() -> None:
    env = {"SLURM_JOB_NUM_NODES": "1", "GPU_DEVICE_ORDINAL": "2,2", "SLURM_SHARDS_ON_NODE": "2"}
    layout = layout_from_env(env)
    assert layout.nproc_per_node == 1
    assert layout.cuda_visible_devices == "2"
    assert child_env(env, layout, {"ICEFROG_X": "1"})["CUDA_VISIBLE_DEVICES"] == "2"


def test_layout_multi_node_uses_srun_and_c10d_on_first_node() -> None:
    env = {
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_JOB_NODELIST": "node[3-4]",
        "SLURM_JOB_ID": "99",
    }
    layout = layout_from_env(env)
    assert (layout.nnodes, layout.nproc_per_node, layout.first_node) == (2, 4, "node3")
    cmd = build_command(layout, ["train.py"], port=29600, relay=["py", "-m", "relay"])
    assert cmd[:4] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert cmd[4:8] == ["py", "-m", "relay", "torchrun"]  # srun runs the relay per node
    assert stop_signal(layout) == signal.SIGUSR1  # srun passes USR1 on; TERM kills the step
    assert "--rdzv-endpoint=node3:29600" in cmd and "--rdzv-id=99" in cmd
    assert "--nproc-per-node=4" in cmd and cmd[-1] == "train.py"
    assert "--rdzv-endpoint=node3:29599" in build_command(layout, ["train.py"])  # 29500 + 99
    # a node name that does not resolve: the batch host (the launcher's own) instead
    assert rendezvous_host(layout, lambda h: True, "batchhost").first_node == "node3"
    assert rendezvous_host(layout, lambda h: False, "batchhost").first_node == "batchhost"


def test_layout_without_gpus_and_override() -> None:
    assert layout_from_env({}).nproc_per_node == 1
    assert stop_signal(layout_from_env({})) == signal.SIGTERM  # torchrun on one node
    relay = build_command(layout_from_env({}), ["t.py"], relay=["py", "-m", "relay"])
    assert relay[0] == "torchrun"  # one node: no srun, no relay
    assert layout_from_env({"SLURM_GPUS_ON_NODE": "0"}, procs_override=3).nproc_per_node == 3
    with pytest.raises(InputError, match="SLURM_JOB_NUM_NODES"):
        layout_from_env({"SLURM_JOB_NUM_NODES": "x"})
    with pytest.raises(InputError, match="script"):
        build_command(layout_from_env({}), [])


def test_cli_dry_run(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    code = main(
        ["launch", "--gpus", "1-2", "--target", "val_acc>=0.9", "--procs-per-node", "2",
         "--workdir", str(tmp_path), "--dry-run", "--", "train.py", "--epochs", "3"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "ICEFROG_TARGET=val_acc>=0.9" in out.replace("'", "")
    assert out.strip().endswith(
        "torchrun --nproc-per-node=2 --standalone --nnodes=1 train.py --epochs 3"
    )


def test_torchrun_gives_the_trainers_the_checkpoint_time(
    capsys: pytest.CaptureFixture[str], tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun kills the trainers this long after passing a stop on (its own default is
    30 s): the controller's default wait for the checkpoint; a job's own value wins."""
    assert SHUTDOWN_TIMEOUT_S == 120
    monkeypatch.delenv(SHUTDOWN_TIMEOUT_ENV, raising=False)
    main(["launch", "--workdir", str(tmp_path), "--dry-run", "--", "train.py"])
    assert f"{SHUTDOWN_TIMEOUT_ENV}=120\n" in capsys.readouterr().out
    assert shutdown_env({SHUTDOWN_TIMEOUT_ENV: "600"}) == {SHUTDOWN_TIMEOUT_ENV: "600"}


def test_cli_bad_target_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--target", "acc>0.9", "--dry-run", "--", "t.py"]) == 2
    assert "operator must be >= or <=" in capsys.readouterr().err


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_run_training_maps_outcomes(tmp_path: Path) -> None:
    env = dict(os.environ)
    assert run_training(_child("raise SystemExit(0)"), env, str(tmp_path)) == 0
    assert run_training(_child("raise SystemExit(5)"), env, str(tmp_path)) == 5
    marker = f"open({str(tmp_path / CHECKPOINT_MARKER)!r}, 'w').write('x'); raise SystemExit(1)"
    assert run_training(_child(marker), env, str(tmp_path)) == REQUEUE_EXIT_CODE
    # a stale marker from an earlier run does not count
    assert run_training(_child("raise SystemExit(0)"), env, str(tmp_path)) == 0


def _usr1_when_child_ready(tmp_path: Path) -> tuple[list[str], Path]:
    """A child that records the first of TERM/USR1 it gets in ``got`` and exits 3, and a
    thread that sends this process USR1 once the child is ready."""
    got, ready = tmp_path / "got", tmp_path / "ready"
    code = (
        "import signal, sys, time\n"
        f"def on(n, f): open({str(got)!r}, 'w').write(signal.Signals(n).name); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, on); signal.signal(signal.SIGUSR1, on)\n"
        f"open({str(ready)!r}, 'w').write('1'); time.sleep(60)\n"
    )

    def signal_when_ready() -> None:
        for _ in range(600):
            if ready.exists():
                os.kill(os.getpid(), signal.SIGUSR1)
                return
            time.sleep(0.05)

    threading.Thread(target=signal_when_ready, daemon=True).start()
    return _child(code), got


def test_run_training_usr1_terminates_child_and_asks_requeue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """USR1 to the launcher: the child (standing in for torchrun) gets TERM; exit 75. The
    child exits without the checkpoint marker (a trainer killed before it checkpointed):
    the launcher does not claim a checkpoint."""
    before = signal.getsignal(signal.SIGUSR1)  # a Trainer of an earlier test may have left its
    child, got = _usr1_when_child_ready(tmp_path)
    assert run_training(child, dict(os.environ), str(tmp_path)) == REQUEUE_EXIT_CODE
    assert got.read_text() == "SIGTERM"
    assert signal.getsignal(signal.SIGUSR1) is before  # handlers restored
    err = capsys.readouterr().err
    assert "checkpointed" not in err
    assert "without a checkpoint since: it resumes from its last checkpoint" in err


def test_run_training_says_checkpointed_after_the_trainers_marker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A child that writes the marker on TERM (as rank 0 does after its checkpoint)."""
    marker = tmp_path / CHECKPOINT_MARKER
    child, _ = _usr1_when_child_ready(tmp_path)
    child[-1] = child[-1].replace("sys.exit(3)", f"open({str(marker)!r}, 'w'); sys.exit(1)")
    assert run_training(child, dict(os.environ), str(tmp_path)) == REQUEUE_EXIT_CODE
    assert "icefrog launch: checkpointed; exiting 75" in capsys.readouterr().err


def test_run_training_across_nodes_passes_usr1_to_srun(tmp_path: Path) -> None:
    """Across nodes the child is srun: it gets USR1 (which srun forwards), not TERM."""
    child, got = _usr1_when_child_ready(tmp_path)
    code = run_training(child, dict(os.environ), str(tmp_path), signal.SIGUSR1)
    assert code == REQUEUE_EXIT_CODE and got.read_text() == "SIGUSR1"


def test_relay_turns_usr1_into_term_for_torchrun(tmp_path: Path) -> None:
    """The relay (srun's task on each node) passes USR1 on to torchrun as TERM and exits
    with torchrun's status."""
    child, got = _usr1_when_child_ready(tmp_path)
    assert relay_main(child) == 3
    assert got.read_text() == "SIGTERM"
    assert relay_main([]) == 2


def test_relay_starts_torchrun_with_usr1_ignored(tmp_path: Path) -> None:
    """slurmstepd sends USR1 to every process of the step: torchrun (a child without a
    handler of its own) must not die of it."""
    code = (
        "import os, signal\n"
        "assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "raise SystemExit(4)\n"
    )
    assert relay_main(_child(code)) == 4


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["launch", "--help"])
    assert exited.value.code == 0
    assert f"{REQUEUE_EXIT_CODE} checkpointed" in capsys.readouterr().out


def _catches_usr1(pid: int) -> bool:
    """Whether process ``pid`` has a handler for USR1 (/proc's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(x for x in status.splitlines() if x.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signal.SIGUSR1 - 1) & 1)


def test_a_stop_signal_before_the_training_started_asks_requeue_and_runs_nothing(
    tmp_path: Path,
) -> None:
    """A launcher Slurm started with an MPS share waits for its decision; USR1 then (Slurm's
    time-limit signal, the controller's checkpoint request) ends it with 75 and the
    checkpoint marker (nothing ran since the last checkpoint), not killed by the signal and
    not recorded a failure, and the training never starts."""
    import subprocess

    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').write('1')\n")
    env = {
        **os.environ,
        "ICEFROG_MANAGED": "1",
        "SLURM_JOB_ID": "41",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_GPUS_ON_NODE": "1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",  # an MPS share: it waits for the decision
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "icefrog_slurm", "launch", "--workdir", str(tmp_path),
         "--torchrun", sys.executable, "--", str(script)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not _catches_usr1(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == REQUEUE_EXIT_CODE, err
    assert time.monotonic() - started < 5  # it stopped waiting for the decision (30 s)
    assert "stopped before the training started" in err
    assert (tmp_path / CHECKPOINT_MARKER).exists() and not ran.exists()
