"""``icefrog submit``: the batch script passes signals on and keeps the launcher's status;
bad input is refused with exit 2 before anything is submitted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from icefrog_slurm import declaration
from icefrog_slurm.cli import main
from icefrog_slurm.commands.submit import batch_script

# A stand-in launcher: on USR1 or TERM it writes which signal came and exits 75, as the real
# one does after the trainers checkpointed; otherwise it exits 0 after a while.
FAKE_LAUNCH = """
import signal, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    out.write_text(signal.Signals(signum).name)
    sys.exit(75)
signal.signal(signal.SIGUSR1, stop)
signal.signal(signal.SIGTERM, stop)
out.with_suffix(".ready").write_text("1")
time.sleep(float(sys.argv[2]))
"""


def _start(tmp_path: Path, seconds: float) -> tuple[subprocess.Popen[bytes], Path]:
    fake = tmp_path / "fake_launch.py"
    fake.write_text(FAKE_LAUNCH)
    got = tmp_path / "got.txt"
    text = batch_script(
        launch=[sys.executable, str(fake), str(got), str(seconds)], env={"FOO": "a b"}
    )
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    proc = subprocess.Popen(["bash", str(script)])
    deadline = time.monotonic() + 20
    while not got.with_suffix(".ready").exists():
        assert time.monotonic() < deadline, "the launcher did not start"
        time.sleep(0.05)
    return proc, got


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_script_passes_signals_to_the_launcher(tmp_path: Path, sig: signal.Signals) -> None:
    proc, got = _start(tmp_path, 60)
    os.kill(proc.pid, sig)  # what `scancel --batch --signal=USR1` does to the batch shell
    assert proc.wait(timeout=20) == 75
    assert got.read_text() == sig.name


def test_script_exits_with_the_launchers_status(tmp_path: Path) -> None:
    proc, got = _start(tmp_path, 0.2)
    assert proc.wait(timeout=20) == 0
    assert not got.exists()


def test_script_text() -> None:
    text = batch_script(launch=["icefrog", "launch", "--", "t.py", "a b"], env={"PATH": "/x"})
    assert text.startswith("#!/bin/bash\n#SBATCH --open-mode=append\n")
    assert "export PATH=/x\n" in text
    assert "icefrog launch -- t.py 'a b' &\n" in text


def test_declaration_round_trips_through_launch_options() -> None:
    import argparse

    decl = declaration.Declaration(
        gpus=(1, 4), batch=(16, 64), max_frozen=0.5,
        target=declaration.parse_target("val_acc>=0.9"), max_epochs=7,
    )  # fmt: skip
    parser = argparse.ArgumentParser()
    declaration.add_arguments(parser)
    assert declaration.from_args(parser.parse_args(decl.launch_options())) == decl
    spec = decl.job_spec(samples_per_epoch=10)
    assert (spec.min_gpus, spec.max_gpus, spec.target_value, spec.accepts_shared) == (
        1, 4, 0.9, True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give the training script"),
        (["--gpus", "4-2", "--", "t.py"], "--gpus"),
        (["--target", "acc>0.9", "--", "t.py"], "--target"),
        (["--job-name", "a b", "--", "t.py"], "--job-name"),
        (["--inbox", "/nonexistent/inbox", "--", "t.py"], "no such folder"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", *argv]) == 2
    assert message in capsys.readouterr().err
