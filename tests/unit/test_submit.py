"""``icefrog submit``: the batch script passes signals on and keeps the launcher's status;
bad input is refused with exit 2 before anything is submitted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from icefrog_slurm import declaration
from icefrog_slurm.cli import main
from icefrog_slurm.commands.jobscript import batch_script

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
        ([], "give the script to submit"),
        (["--wrap=python train.py"], "--wrap (command line): not accepted: icefrog submit"),
        (["--gpus", "4-2", "--", "t.py"], "--gpus"),
        (["--target", "acc>0.9", "--", "t.py"], "--target"),
        (["--job-name", "a b", "--", "t.py"], "--job-name"),
        (["--job-name", "abc\n", "--", "t.py"], "--job-name"),  # (a regex "$" matches before it)
        (["--inbox", "/nonexistent/inbox", "--", "t.py"], "no such folder"),
        (["-J", "het", "-t", "10", ":", "-t", "5", "t.py"], "':' (command line): separates"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", *argv]) == 2
    assert message in capsys.readouterr().err


# ---- sbatch compatibility: what is written, what is refused (no Slurm: a recording backend)


class _Recorder:
    requests: ClassVar[list[object]] = []

    def submit_held(self, *, request: object) -> str:
        self.requests.append(request)
        return "4242"

    def cancel(self, *, job_id: str) -> None:
        raise AssertionError("nothing to cancel")


@pytest.fixture
def submit_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, list[object]]]:
    """``icefrog submit`` up to the sbatch call: the script is written, the request kept."""
    from icefrog_slurm.commands import downnotice
    from icefrog_slurm.commands import submit as submit_module

    recorded: list[object] = []
    recorder = type("R", (_Recorder,), {"requests": recorded})
    monkeypatch.setattr(submit_module, "SlurmCliBackend", recorder)
    monkeypatch.setattr(submit_module, "register", lambda **kw: None)
    monkeypatch.setattr(downnotice, "warn_for_submit", lambda **kw: None)
    monkeypatch.setattr(submit_module, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setattr(submit_module, "REPORTS_CONFIG", str(tmp_path / "absent-too.toml"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inbox").mkdir()
    yield tmp_path, recorded


def _submit(tmp_path: Path, *argv: str) -> int:
    return main(["submit", "--inbox", str(tmp_path / "inbox"), "--workdir", "wd", *argv])


BATCH = """#!/bin/bash
#SBATCH --account=physics --time=01:00:00
#SBATCH -q normal --mail-type=NONE
#SBATCH -J from-header --mem-per-gpu=900M
echo "data in $DATA_DIR"
icefrog launch -- train.py --lr 0.1
#SBATCH --gres=gpu:4
"""


def test_batch_script_options_written_as_sbatch_lines(
    submit_here: tuple[Path, list[object]],
) -> None:
    tmp_path, requests = submit_here
    (tmp_path / "job.sh").write_text(BATCH)
    assert _submit(tmp_path, "--time=2:00:00", "-A", "chem", "job.sh", "one", "two") == 0
    (request,) = requests
    assert request.name == "from-header"  # type: ignore[attr-defined]
    assert request.mem_per_gpu_mb == 900  # type: ignore[attr-defined]
    text = (tmp_path / "wd" / "job.sbatch").read_text()
    assert (tmp_path / "wd" / "job.sbatch").stat().st_mode & 0o777 == 0o600
    from icefrog_slurm.slurm import sbatch_options as so

    header = {g.spec.name: g.value for g in so.read_header(text, "job.sbatch")}
    assert header == {  # the command line wins over the script's header
        "open-mode": "append", "account": "chem", "time": "2:00:00", "qos": "normal",
        "mail-type": "NONE",
    }  # fmt: skip
    assert so.replay_refusal(text) is None
    assert f"cd {tmp_path} || exit 1\nset -- one two\n" in text
    assert text.endswith(BATCH.split("\n", 1)[1])  # the body, as given


@pytest.mark.parametrize(
    ("argv", "header", "message"),
    [
        (["--gres=gpu:4"], "", "--gres (command line): not accepted"),
        (["-N", "2"], "", "--nodes (command line): not accepted"),
        (["--array=1-4"], "", "job arrays are not supported"),
        (["-C", "ib"], "", "--constraint (command line): not accepted: the icefrog controller"),
        ([], "#SBATCH --reservation=maint\n", "--reservation (job.sh line 2): not accepted"),
        (["--signal=B:USR2@300"], "", "--signal (command line): 'B:USR2@300': give B:USR1"),
        ([], "#SBATCH --signal=USR1@300\n", "--signal (job.sh line 2): 'USR1@300': give"),
        (["--wrap=hostname"], "", "give a script"),
        (["--account=a\nb"], "", "line break"),
        ([], "#SBATCH --nodelist=node4\n", "--nodelist (job.sh line 2): not accepted"),
        ([], "#SBATCH --gres=gpu:4\n", "--gres (job.sh line 2): not accepted"),
        ([], "#SBATCH --mem=8G\n", "--mem-per-gpu"),
        ([], "#SBATCH --mem-per-gpu=lots\n", "--mem-per-gpu (job.sh line 2)"),
        ([], "#SBATCH -J 'a b'\n", "--job-name"),
        (["--export=NONE,X=1"], "", "NONE takes no variables"),
        (["--export=A-B=1"], "", "not a variable name"),
    ],
)
def test_refused_before_anything_is_written(
    submit_here: tuple[Path, list[object]], argv: list[str], header: str, message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    tmp_path, requests = submit_here
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\n{header}icefrog launch -- t.py\n")
    assert _submit(tmp_path, *argv, "job.sh") == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not requests and not (tmp_path / "wd").exists()


@pytest.mark.parametrize(
    ("argv", "header", "environ", "message"),
    [
        (["-p", "long"], "", {}, "--partition (command line): 'long'"),
        ([], "#SBATCH -p long\n", {}, "--partition (job.sh line 2): 'long'"),
        ([], "", {"SBATCH_PARTITION": "debug"}, "--partition (SBATCH_PARTITION): 'debug'"),
        (["--partition=gpu,long"], "", {}, "--partition (command line): 'gpu,long'"),
    ],
)
def test_another_partition_than_the_controllers_is_refused(
    submit_here: tuple[Path, list[object]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], argv: list[str], header: str,
    environ: dict[str, str], message: str,
) -> None:  # fmt: skip
    """The controller plans the GPUs of its own partition (settings ``[slurm] partition``,
    here the default ``gpu``) and never looks at a job in another one."""
    tmp_path, requests = submit_here
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\n{header}icefrog launch -- t.py\n")
    assert _submit(tmp_path, *argv, "job.sh") == 2
    err = capsys.readouterr().err
    assert message in err and "plans the GPUs of partition 'gpu' alone" in err, err
    assert not requests


def test_the_controllers_own_partition_may_be_named(
    submit_here: tuple[Path, list[object]], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path, requests = submit_here
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH -p long\nicefrog launch -- t.py\n")
    assert _submit(tmp_path, "-p", "gpu", "job.sh") == 0  # the command line wins, as in sbatch
    config = tmp_path / "site.toml"
    config.write_text('[slurm]\npartition = "a800"\n')
    (tmp_path / "job.sh").write_text("#!/bin/bash\nicefrog launch -- t.py\n")
    assert _submit(tmp_path, "--config", str(config), "job.sh") == 0
    assert _submit(tmp_path, "--config", str(config), "-p", "a800", "job.sh") == 0
    assert [r.partition for r in requests] == ["gpu", "a800", "a800"]  # type: ignore[attr-defined]
    assert _submit(tmp_path, "--config", str(config), "-p", "gpu", "job.sh") == 2
    assert "plans the GPUs of partition 'a800' alone" in capsys.readouterr().err


def test_parsable_prints_the_job_id_alone(
    submit_here: tuple[Path, list[object]], capsys: pytest.CaptureFixture[str]
) -> None:
    """As sbatch --parsable, for scripts: ``jid=$(icefrog submit --parsable ...)``."""
    tmp_path, _ = submit_here
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --parsable\nicefrog launch -- t.py\n")
    capsys.readouterr()
    assert _submit(tmp_path, "--parsable", "train.py") == 0
    assert capsys.readouterr().out == "4242\n"
    assert _submit(tmp_path, "job.sh") == 0
    assert capsys.readouterr().out == "4242\n"
    assert _submit(tmp_path, "train.py") == 0
    assert capsys.readouterr().out == "Submitted batch job 4242\n"


def test_a_script_that_is_not_there_is_refused(
    submit_here: tuple[Path, list[object]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo (``trian.py``) or a folder: refused as sbatch refuses it, nothing submitted."""
    tmp_path, requests = submit_here
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert _submit(tmp_path, "--gpus", "1-2", "trian.py") == 2
    assert "trian.py: no such file: give the script to submit" in capsys.readouterr().err
    assert _submit(tmp_path, "--gpus", "1-2", str(tmp_path)) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert not requests and not (tmp_path / "wd").exists()


def test_a_script_that_is_neither_python_nor_bash_is_refused(
    submit_here: tuple[Path, list[object]], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path, _ = submit_here
    (tmp_path / "job.csh").write_text("#!/bin/csh\necho hi\n")
    (tmp_path / "dos.sh").write_text("#!/bin/bash\r\necho hi\r\n")
    assert _submit(tmp_path, "job.csh") == 2
    assert "neither a Python script" in capsys.readouterr().err
    assert _submit(tmp_path, "dos.sh") == 2
    assert "DOS line breaks" in capsys.readouterr().err


def test_python_script_keeps_todays_form(submit_here: tuple[Path, list[object]]) -> None:
    tmp_path, requests = submit_here
    (tmp_path / "train.py").write_text("#SBATCH --time=5\nprint('hi')\n")
    argv = ["--gpus", "1-2", "--qos=normal", "-e", "err-%j.log", "train.py", "--lr", "1"]
    assert _submit(tmp_path, *argv) == 0
    text = (tmp_path / "wd" / "job.sbatch").read_text()
    assert '#SBATCH "--time=5"\n#SBATCH "--qos=normal"\n' in text
    assert f'#SBATCH "--error={tmp_path}/err-%j.log"\n' in text  # where you are, as -o
    assert f"--seed=0 -- {tmp_path}/train.py --lr 1 &\n" in text
    assert requests[0].name == "train"  # type: ignore[attr-defined]
    assert _submit(tmp_path, "-D", "/tmp", "train.py") == 2  # no body to run there


def test_job_environment_follows_sbatch_export() -> None:
    from icefrog_slurm.commands.jobscript import job_environment

    here = {"A": "1", "B": "two words", "SLURM_JOB_ID": "9", "PWD": "/x", "BASH_FUNC_f%%": "()"}
    assert job_environment(None, here) == {"A": "1", "B": "two words"}
    assert job_environment("ALL", here) == job_environment(None, here)
    assert job_environment("NONE", here) == {}
    assert job_environment("A,C=3,D", here) == {"A": "1", "C": "3"}
    assert job_environment("ALL,A=0,C=3", here) == {"A": "1", "B": "two words", "C": "3"}


@pytest.mark.parametrize("visible", ["", "0", "GPU-1a2b"])
def test_the_submitting_shells_gpus_are_not_the_jobs(
    submit_here: tuple[Path, list[object]], monkeypatch: pytest.MonkeyPatch, visible: str
) -> None:
    """Submitted from a login node whose shell has CUDA_VISIBLE_DEVICES (empty: every start
    fails; "0": a 4-GPU run starts one process) or a shard's or MPS share's variables: the
    job gets those Slurm sets for each run, not an export line of them, also when named."""
    tmp_path, _ = submit_here
    per_run = {
        "CUDA_VISIBLE_DEVICES": visible, "ROCR_VISIBLE_DEVICES": visible,
        "GPU_DEVICE_ORDINAL": "0", "ZE_AFFINITY_MASK": "0",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps",
        "CUDA_MPS_LOG_DIRECTORY": "/tmp/mps-log",
    }  # fmt: skip
    for name, value in per_run.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "train.py").write_text("print('hi')\n")
    for export in ("ALL", "ALL,CUDA_VISIBLE_DEVICES=1", "PATH,GPU_DEVICE_ORDINAL"):
        assert _submit(tmp_path, f"--export={export}", "train.py") == 0
        text = (tmp_path / "wd" / "job.sbatch").read_text()
        assert not [name for name in per_run if name in text], export


BODY = """echo "body starts with $1"
icefrog launch -- "$@"
"""


def _body_job(
    tmp_path: Path, body: str, seconds: float = 60, shell: str = "", until: Path | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """The script ``icefrog submit`` writes for a batch script ``body``, run by bash, whose
    ``icefrog launch -- "$@"`` starts the stand-in launcher (its arguments: where it writes
    the signal it got, how long it runs); returned once the stand-in runs, or with
    ``until`` once the body made that file."""
    fake = tmp_path / "fake_launch.py"
    fake.write_text(FAKE_LAUNCH)
    got = tmp_path / "got.txt"
    text = batch_script(
        launch=[sys.executable, str(fake)], env={"FOO": "a b"}, body=body,
        rundir=str(tmp_path), args=[str(got), str(seconds)], shell=shell,
    )  # fmt: skip
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    proc = subprocess.Popen(
        ["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if until is None:
        _appears(got.with_suffix(".ready"), proc, "the launcher did not start")
    else:
        _appears(until, proc, f"the body did not make {until.name}")
    return proc, got


def _appears(path: Path, proc: subprocess.Popen[str], what: str) -> None:
    """Wait until the running job makes ``path``; fail with ``what`` after 20 s or when the
    job ended first."""
    deadline = time.monotonic() + 20
    while not path.exists():
        assert proc.poll() is None, f"the job ended first: {what}"
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_batch_scripts_launch_line_gets_the_signal(tmp_path: Path) -> None:
    """The body's ``icefrog launch -- ARGS`` runs the declared launcher (here the stand-in)
    in the background: USR1 to the batch shell reaches it and its 75 is the job's."""
    proc, got = _body_job(tmp_path, BODY)
    os.kill(proc.pid, signal.SIGUSR1)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 75
    assert got.read_text() == "SIGUSR1"
    assert f"body starts with {got}" in out


@pytest.mark.parametrize(
    "body",
    [
        'icefrog launch -- "$@"\necho "after the launch"\n',
        'icefrog launch -- "$@" || echo "after the launch: it failed"\n',
        'if icefrog launch -- "$@"; then :; fi\necho "after the launch"\nexit 0\n',
    ],
)
def test_a_checkpointed_launch_ends_the_job_with_75_at_once(tmp_path: Path, body: str) -> None:
    """A time limit's or the controller's USR1 makes the launcher checkpoint and exit 75:
    the job ends with 75 there (requeue me), though the script goes on after its launch
    line and would exit 0 (Slurm: COMPLETED, recorded finished: training over for good)."""
    proc, got = _body_job(tmp_path, body)
    os.kill(proc.pid, signal.SIGUSR1)
    out, _ = proc.communicate(timeout=20)
    assert (proc.returncode, got.read_text()) == (75, "SIGUSR1")
    assert "after the launch" not in out


@pytest.mark.parametrize(
    ("sig", "code", "says"),
    [(signal.SIGUSR1, 75, "asked to checkpoint before the launch"),
     (signal.SIGTERM, 143, "terminated before the launch")],
)  # fmt: skip
def test_a_signal_before_the_launch_line_ends_the_job_at_once(
    tmp_path: Path, sig: signal.Signals, code: int, says: str
) -> None:
    """The controller's USR1, or Slurm's TERM (a cancel, a time limit), comes while the body
    still stages its data, before its launch line: the job ends at once, with 75 (requeue
    it: nothing trained since the last checkpoint) or 143, and never starts the launcher.
    The signals were lost: after a USR1 the training ran until the controller's checkpoint
    timeout requeued it anyway, after a TERM the launcher started only to be killed."""
    staging = tmp_path / "staging"
    body = f'touch {staging}\nsleep 1\nicefrog launch -- "$@"\n'
    proc, got = _body_job(tmp_path, body, seconds=3, until=staging)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == code
    assert not got.with_suffix(".ready").exists()  # the launcher never ran
    assert says in err


@pytest.mark.parametrize(
    ("sig", "code", "says"),
    [(signal.SIGUSR1, 0, "asked to checkpoint after the launch ended: nothing to checkpoint"),
     (signal.SIGTERM, 143, "terminated after the launch: exit 143")],
)  # fmt: skip
def test_a_signal_after_the_launch_ended_is_not_sent_to_its_old_pid(
    tmp_path: Path, sig: signal.Signals, code: int, says: str
) -> None:
    """The launcher has ended and the body goes on (its evaluation, a copy of results): a
    TERM (a cancel, the time limit) ends the job with 143 at once, as bash would; a USR1
    (the controller's, sent before it read the job's ``finished`` report) has nothing to
    checkpoint, and the body goes on to its end. Both were sent to the launcher's old pid,
    which by then may be another process of the user's, and the TERM was swallowed."""
    post, done = tmp_path / "post", tmp_path / "done"
    body = f'icefrog launch -- "$@"\ntouch {post}\nsleep 1\ntouch {done}\n'
    proc, _ = _body_job(tmp_path, body, seconds=0.2, until=post)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == code
    assert says in err
    assert done.exists() == (code == 0)


def test_a_launch_that_finished_goes_on_with_the_script(tmp_path: Path) -> None:
    proc, got = _body_job(tmp_path, 'icefrog launch -- "$@"\necho "after the launch"\n', 0.2)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and not got.exists()
    assert "after the launch" in out


PROFILE = 'module() { echo "module says: $*"; }\n'
"""A login shell's ~/.bash_profile defining ``module``, as a site's Lmod does."""


def _run_submitted(
    tmp_path: Path, first_line: str, body: str, export: str = "NONE"
) -> subprocess.CompletedProcess[str]:
    """``icefrog submit`` of a batch script, then its job.sbatch run as slurmd runs it (an
    executable, its ``#!`` line applies) in a home whose login profile defines ``module``."""
    (tmp_path / "job.sh").write_text(f"{first_line}\n{body}")
    assert _submit(tmp_path, f"--export={export}", "job.sh") == 0
    job = tmp_path / "wd" / "job.sbatch"
    job.chmod(0o700)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / ".bash_profile").write_text(PROFILE)
    return subprocess.run(
        [str(job)], capture_output=True, text=True, timeout=60,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.parametrize("first_line", ["#!/bin/bash -l", "#!/bin/bash --login"])
def test_a_login_shell_script_stays_one(
    submit_here: tuple[Path, list[object]], first_line: str
) -> None:
    """``#!/bin/bash -l``, how HPC users get ``module``: the job's shell is a login one."""
    tmp_path, _ = submit_here
    done = _run_submitted(tmp_path, first_line, "module load cuda\n")
    assert done.returncode == 0, done.stderr
    assert "module says: load cuda\n" in done.stdout


def test_the_submitting_shells_exported_functions_are_the_jobs(
    submit_here: tuple[Path, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lmod exports ``module`` (``export -f``) and sbatch's --export=ALL gives it to the
    job: recorded so that bash defines and exports it again, in the batch script and in
    the programs it starts."""
    tmp_path, _ = submit_here
    define = 'module() { echo "module says: $*"; }; export -f module; printenv "BASH_FUNC_module%%"'
    value = subprocess.run(["bash", "-c", define], capture_output=True, text=True).stdout
    assert value.startswith("() {")
    monkeypatch.setenv("BASH_FUNC_module%%", value)
    monkeypatch.setenv("BASH_FUNC_not-a-word%%", value)  # bash's names go beyond a shell word
    monkeypatch.setenv("BASH_FUNC_icefrog%%", value)  # the wrapper's own would be exported
    body = "module load cuda\nbash -c 'module load nccl'\n"
    done = _run_submitted(tmp_path, "#!/bin/bash", body, export="ALL")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "module says: load cuda\nmodule says: load nccl\n"
    text = (tmp_path / "wd" / "job.sbatch").read_text()
    assert "not-a-word" not in text and "export -f icefrog" not in text
    # only --export=ALL gives the functions
    done = _run_submitted(tmp_path, "#!/bin/bash", body, export="NONE")
    assert "module: command not found" in done.stderr


def test_a_scripts_e_u_x_options_apply_to_its_body(
    submit_here: tuple[Path, list[object]],
) -> None:
    tmp_path, _ = submit_here
    done = _run_submitted(tmp_path, "#!/bin/bash -lx -eu", 'echo "in body"\nfalse\necho after\n')
    assert done.returncode == 1, done.stderr
    assert done.stdout == "in body\n"
    assert "+ echo 'in body'\n+ false\n" in done.stderr
    assert "export" not in done.stderr  # the recorded environment is not traced
    done = _run_submitted(tmp_path, "#!/bin/bash -u", 'echo "$NOT_SET"\necho after\n')
    assert done.returncode == 1 and "NOT_SET: unbound variable" in done.stderr


@pytest.mark.parametrize(
    ("first_line", "refused"),
    [("#!/bin/bash -r", "'-r'"), ("#!/bin/bash -li", "'-li'"), ("#!/bin/sh --posix", "'--posix'"),
     ("#!/bin/bash -o pipefail", "'-o'")],
)  # fmt: skip
def test_other_shell_options_are_refused(
    submit_here: tuple[Path, list[object]], first_line: str, refused: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    tmp_path, requests = submit_here
    (tmp_path / "job.sh").write_text(f"{first_line}\nicefrog launch -- t.py\n")
    assert _submit(tmp_path, "job.sh") == 2
    err = capsys.readouterr().err
    assert f"job.sh line 1: the shell option {refused} is not kept" in err
    assert not requests


def test_the_wrapper_works_under_e_u_x(tmp_path: Path) -> None:
    """The wrapper's own lines under the body's ``-eux``: USR1 reaches the launcher (75),
    and a USR1 that comes after the launcher ended does not fail the job (a trap's kill
    of a process gone fails, and ``-e`` would end the job with it)."""
    proc, got = _body_job(tmp_path, BODY, shell="eux")
    os.kill(proc.pid, signal.SIGUSR1)
    proc.communicate(timeout=20)
    assert proc.returncode == 75 and got.read_text() == "SIGUSR1"
    ended = tmp_path / "ended"
    body = f'icefrog launch -- "$@"\ntouch {ended}\nsleep 2\necho "job done"\n'
    proc, got = _body_job(tmp_path, body, seconds=0.2, shell="eux")
    deadline = time.monotonic() + 20
    while not ended.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGUSR1)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "job done" in out


def _icefrog_on_path(tmp_path: Path) -> dict[str, str]:
    """The recorded environment of a job that finds the real ``icefrog`` on its PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "icefrog").write_text(f'#!/bin/sh\nexec {sys.executable} -m icefrog_slurm "$@"\n')
    (bin_dir / "icefrog").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


LAUNCH_DRY = [sys.executable, "-m", "icefrog_slurm", "launch", "--dry-run", "--gpus=1-4"]


@pytest.mark.parametrize(
    "line",
    ["exec icefrog launch -- train.py", "timeout 60 icefrog launch -- train.py",
     "env icefrog launch -- train.py"],
)  # fmt: skip
def test_a_launcher_not_started_by_the_launch_line_refuses(tmp_path: Path, line: str) -> None:
    """``exec icefrog launch`` (as a plain sbatch script does), ``srun``, ``timeout``...
    bypass the script's launch line and would run the launcher with its defaults (one GPU,
    no inbox, checkpoints in the current folder): it refuses and says what to write."""
    text = batch_script(
        launch=[*LAUNCH_DRY, f"--workdir={tmp_path}", "--"], env=_icefrog_on_path(tmp_path),
        body=f"{line}\n", rundir=str(tmp_path),
    )  # fmt: skip
    done = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "not by its launch line: write 'icefrog launch -- SCRIPT ARGS'" in done.stderr


@pytest.mark.parametrize("body", [None, "icefrog launch -- train.py --lr 1\n"])
def test_the_scripts_own_launch_line_runs_the_launcher(tmp_path: Path, body: str | None) -> None:
    """The real launcher (a dry run) started by the script's own line, for a Python script
    and for a batch script's body, runs with the declaration."""
    launch = [*LAUNCH_DRY, f"--workdir={tmp_path}", "--"]
    text = batch_script(
        launch=launch if body else [*launch, "train.py", "--lr", "1"],
        env=_icefrog_on_path(tmp_path), body=body, rundir=str(tmp_path),
    )  # fmt: skip
    done = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ICEFROG_GPUS=1-4\n" in done.stdout
    assert "--standalone --nnodes=1 train.py --lr 1\n" in done.stdout


@pytest.mark.parametrize(
    "body",
    [
        'icefrog launch -- "$@" 2>&1 | tee train.log\necho "after the launch"\n',
        'out=$(icefrog launch -- "$@")\necho "after the launch"\n',
        '( icefrog launch -- "$@" )\necho "after the launch"\n',
        'icefrog launch -- "$@" &\nwait\necho "after the launch"\n',
    ],
)
def test_a_launch_line_in_a_subshell_ends_the_job(tmp_path: Path, body: str) -> None:
    """``icefrog launch -- train.py | tee train.log``: the launch runs in a subshell while
    the batch shell waits in the foreground, so the controller's and the time limit's
    signals never reach it. Refused: the job ends with 2 and why, the launcher unstarted."""
    fake = tmp_path / "fake_launch.py"
    fake.write_text(FAKE_LAUNCH)
    got = tmp_path / "got.txt"
    text = batch_script(
        launch=[sys.executable, str(fake)], env={}, body=body, rundir=str(tmp_path),
        args=[str(got), "1"],
    )  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", text], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert "not in a pipeline, $(...), ( ) or with &" in done.stdout
    assert "after the launch" not in done.stdout
    assert not got.with_suffix(".ready").exists()


def test_a_launch_line_logged_through_a_process_substitution_gets_the_signal(
    tmp_path: Path,
) -> None:
    """What the refusal above proposes for a log: ``> >(tee train.log)``."""
    proc, got = _body_job(tmp_path, 'icefrog launch -- "$@" > >(tee train.log) 2>&1\n')
    os.kill(proc.pid, signal.SIGUSR1)
    proc.communicate(timeout=20)
    assert (proc.returncode, got.read_text()) == (75, "SIGUSR1")
    assert (tmp_path / "train.log").exists()


def test_launch_line_with_options_is_refused(tmp_path: Path) -> None:
    """Refused, and the job ends there (a body going on to exit 0 would be finished)."""
    text = batch_script(
        launch=["false"], env={}, body="icefrog launch --gpus 2 -- t.py\necho after\n",
        rundir="/",
    )  # fmt: skip
    done = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=20)
    assert done.returncode == 2 and "after" not in done.stdout
    assert "give its options to icefrog submit" in done.stderr


def test_sbatch_input_variables_between_header_and_command_line(
    submit_here: tuple[Path, list[object]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As in sbatch: SBATCH_TIMELIMIT beats the header's --time, the command line beats
    SBATCH_ACCOUNT; one the controller owns is refused naming the variable."""
    from icefrog_slurm.slurm import sbatch_options as so

    tmp_path, _ = submit_here
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH -t 5 -A hdr -q hq\ntrue\n")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "7")
    monkeypatch.setenv("SBATCH_ACCOUNT", "env")
    monkeypatch.setenv("SBATCH_SIGNAL", "B:USR1@30")
    assert _submit(tmp_path, "--account=cli", "job.sh") == 0
    text = (tmp_path / "wd" / "job.sbatch").read_text()
    header = {g.spec.name: g.value for g in so.read_header(text, "job.sbatch")}
    assert header == {
        "open-mode": "append", "time": "7", "account": "cli", "qos": "hq",
        "signal": "B:USR1@30",
    }  # fmt: skip
    capsys.readouterr()
    monkeypatch.setenv("SBATCH_GRES", "gpu:8")
    assert _submit(tmp_path, "job.sh") == 2
    assert "--gres (SBATCH_GRES): not accepted" in capsys.readouterr().err


def test_a_file_name_or_variable_cannot_add_sbatch_lines(
    submit_here: tuple[Path, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script path and an environment value with a line break and an ``#SBATCH`` line in
    them end up as text sbatch never reads as options (a repr in a comment; quoted values
    after the first command)."""
    from icefrog_slurm.slurm import sbatch_options as so

    tmp_path, _ = submit_here
    evil = "x\n#SBATCH --nodelist=node4\n"
    (tmp_path / f"a{evil}.sh").write_text("#!/bin/bash\ntrue\n")
    monkeypatch.setenv("EVIL", evil)
    assert _submit(tmp_path, "-J", "evil", f"a{evil}.sh") == 0
    text = (tmp_path / "wd" / "job.sbatch").read_text()
    assert "\n#SBATCH --nodelist=node4\n" in text  # inside the quoted export: not an option
    assert [g.spec.name for g in so.read_header(text, "job.sbatch")] == ["open-mode"]
    assert so.replay_refusal(text) is None
