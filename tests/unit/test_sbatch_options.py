"""sbatch's option syntax and ``#SBATCH`` header rules as ``icefrog submit`` and the
controller's resubmission read them (icefrog_slurm/slurm/sbatch_options.py), the options
refused and why, and the attacks on the header: a value with a line break, an option the
controller owns smuggled into the header, an ``#SBATCH`` line after the first command."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from icefrog_slurm.errors import InputError
from icefrog_slurm.slurm import sbatch_options as so


def _parse(*argv: str) -> tuple[list[tuple[str, str | None]], list[str]]:
    given, rest = so.parse(list(argv), so.SBATCH_TABLE, where="test")
    return [(g.spec.name, g.value) for g in given], rest


def test_option_forms_as_getopt_long() -> None:
    assert _parse("--time=10", "--time", "20", "-t30", "-t", "40", "t.sh") == (
        [("time", "10"), ("time", "20"), ("time", "30"), ("time", "40")],
        ["t.sh"],
    )
    assert _parse("--acco=a", "-Qv", "-Aphys", "x.sh", "-t", "5") == (
        [("account", "a"), ("quiet", None), ("verbose", None), ("account", "phys")],
        ["x.sh", "-t", "5"],  # options end at the script: the rest are its arguments
    )
    # an optional value is taken only with '=' (or attached to a short option)
    assert _parse("--propagate", "t.sh") == ([("propagate", None)], ["t.sh"])
    assert _parse("--propagate=STACK", "-k", "--", "-t") == (
        [("propagate", "STACK"), ("no-kill", None)],
        ["-t"],
    )
    assert _parse("--mail-type=", "-A", "", "t.sh") == (
        [("mail-type", ""), ("account", "")],
        ["t.sh"],
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--acc=x"], "ambiguous, could be --account, --acctg-freq"),
        (["--no-such=1"], "not an sbatch option"),
        (["-y"], "-y (test): not an sbatch option"),
        (["--time"], "--time (test): needs a value"),
        (["-t"], "-t (test): needs a value"),
        (["--hold=yes"], "--hold (test): takes no value"),
    ],
)
def test_bad_option_syntax(argv: list[str], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        so.parse(argv, so.SBATCH_TABLE, where="test")


def test_header_as_sbatch_reads_it() -> None:
    script = (
        "#!/bin/bash\n"
        "#SBATCH --time=10 -A 'my acct' # a comment --qos=ignored\n"
        "\n"
        "   # an indented comment does not end the header\n"
        '#SBATCH --error="/o/a b #c \\"q\\".err" --mail-type=NONE\n'
        "#SLURM --constraint=ib\n"
        "echo first command\n"
        "#SBATCH --gres=gpu:4\n"  # after the first command: not an option
    )
    got = [(g.spec.name, g.value, g.where) for g in so.read_header(script, "job.sh")]
    assert got == [
        ("time", "10", "job.sh line 2"),
        ("account", "my acct", "job.sh line 2"),
        ("error", '/o/a b #c "q".err', "job.sh line 5"),
        ("mail-type", "NONE", "job.sh line 5"),
        ("constraint", "ib", "job.sh line 6"),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#SBATCH --time=10 train.py", "'train.py' is not an option"),
        ("#SBATCH --account='open", "unmatched '"),
        ("#SBATCH :x", "unexpected ':'"),
        ("#SBATCH hetjob", "heterogeneous jobs"),
    ],
)
def test_bad_header_lines(line: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        so.read_header(f"#!/bin/bash\n{line}\n", "job.sh")


HOSTILE = [
    "a b\tc",
    "#not-a-comment",
    "quote \" and ' both",
    "back\\slash\\",
    '\\"',
    "--gres=gpu:4",
    "ü ñ 中文",
    "x" * so.MAX_VALUE,
]


@pytest.mark.parametrize("value", HOSTILE)
def test_written_header_reads_back_identically(value: str) -> None:
    given = so.Given(so.SBATCH_TABLE.long["mail-user"], value, "test")
    text = "#!/bin/bash\n" + so.header_lines([given]) + "true\n"
    (back,) = so.read_header(text, "job.sbatch")
    assert (back.spec.name, back.value) == ("mail-user", value)
    assert so.replay_refusal(text) is None


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="no sbatch")
def test_quoting_matches_the_real_sbatch(tmp_path: pytest.TempPathFactory) -> None:
    """sbatch --test-only reads the header we write: a value with a space, a '#' and
    quotes arrives whole (its error path shows it), else sbatch would reject the line."""
    value = "/tmp/a b #c \"q\" 'r'.err"
    given = so.Given(so.SBATCH_TABLE.long["job-name"], "n1", "t")
    text = "#!/bin/bash\n" + so.header_lines([given]) + f"#SBATCH {so.quote('-e' + value)}\ntrue\n"
    assert [a for _, args in so.header_arguments(text, "t") for a in args] == [
        "--job-name=n1",
        "-e" + value,
    ]
    done = subprocess.run(
        ["sbatch", "--test-only", "--gres=gpu:1", "-p", "gpu"],
        input=text, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert "Invalid directive" not in done.stderr and "Unmatched" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    "value", ["a\nb", "a\rb", "a\0b", "a\x1bb", "a\x7fb", "x" * (so.MAX_VALUE + 1), "HetJob"]
)
def test_a_value_that_could_break_the_header_is_refused(value: str) -> None:
    given = so.Given(so.SBATCH_TABLE.long["account"], value, "command line")
    with pytest.raises(InputError, match=r"--account \(command line\)"):
        so.header_lines([given])


OWNED = [
    "--gres=gpu:4", "-G2", "--gpus-per-node=2", "--gpus-per-task=1", "--nodes=2", "-N2",
    "--nodelist=node1", "-wnode1", "--exclude=node2", "--exclusive", "--ntasks=4", "-n4",
    "--ntasks-per-node=2", "--hold", "-H", "--begin=now+1hour", "--dependency=afterok:1",
    "--comment=x", "--no-requeue", "--open-mode=truncate", "--mem=8G", "--mem-per-cpu=1G",
    "-c4", "--array=1-3", "--wrap=hostname", "--wait", "--test-only", "--uid=0",
    "--get-user-env", "--clusters=c2", "--export-file=/x", "--constraint=ib", "-Cib",
    "--reservation=maint",
]  # fmt: skip


@pytest.mark.parametrize("option", OWNED)
def test_options_the_controller_owns_are_refused_with_the_reason(option: str) -> None:
    (given,), _ = so.parse([option], so.SBATCH_TABLE, where="command line")
    with pytest.raises(InputError) as exc:
        so.refuse(given)
    message = str(exc.value)
    assert message.startswith(f"--{given.spec.name} (command line): not accepted: ")
    assert len(message.split(": not accepted: ")[1]) > 10  # the reason


def test_passed_options_are_not_refused() -> None:
    argv = ["--time=10", "-A", "a", "-q", "normal", "--prefer=ib", "--mail-type=NONE",
            "--open-mode=append", "--signal=B:USR1@60", "--requeue", "--parsable"]  # fmt: skip
    given, _ = so.parse(argv, so.SBATCH_TABLE, where="t")
    for g in given:
        so.refuse(g)


@pytest.mark.parametrize(
    "value",
    ["B:USR1@300", "B:USR1", "b:usr1@60", "B:SIGUSR1@90", "B:10@90", "B:TERM@120", "B:SIGTERM",
     "B:15", "B:USR1@65535"],
)  # fmt: skip
def test_a_signal_the_batch_script_passes_on_is_accepted(value: str) -> None:
    so.refuse(so.Given(so.SBATCH_TABLE.long["signal"], value, "command line"))


@pytest.mark.parametrize(
    "value",
    ["B:USR2@300", "B:INT", "B:HUP@60", "B:2", "USR1@300", "TERM", "10@60", "R:USR1@60",
     "B:USR1@65536", "B:USR1@", "B:USR1@5m", "B:"],
)  # fmt: skip
def test_a_signal_that_would_kill_the_job_unwarned_is_refused(value: str) -> None:
    """The batch script traps USR1 and TERM alone (USR2, INT, HUP kill it with no
    checkpoint), and without ``B:`` Slurm signals the job's steps, which a one-node job
    does not have: the launcher is never warned."""
    given = so.Given(so.SBATCH_TABLE.long["signal"], value, "job.sh line 2")
    with pytest.raises(InputError, match=re.escape(f"--signal (job.sh line 2): {value!r}: give")):
        so.refuse(given)


def test_every_option_of_man_sbatch_is_classified() -> None:
    man = shutil.which("man")
    if man is None:
        pytest.skip("no man")
    text = subprocess.run(
        [man, "sbatch"], capture_output=True, text=True, timeout=60, check=False,
        env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin"},
    ).stdout  # fmt: skip
    if "--account" not in text:
        pytest.skip("sbatch's manual is not installed")
    names = set(re.findall(r"^\s{7}(?:-\w, )?--([a-z][a-z-]+)", text, re.MULTILINE))
    assert len(names) > 90
    assert names <= set(so.SBATCH_TABLE.long), names - set(so.SBATCH_TABLE.long)


def test_replay_accepts_what_icefrog_submit_writes() -> None:
    options, _ = so.parse(
        ["--time=1:00:00", "--account=phys", "--qos=normal", "--prefer=ib"],
        so.SBATCH_TABLE, where="t",
    )  # fmt: skip
    script = "#!/bin/bash\n#SBATCH --open-mode=append\n" + so.header_lines(options) + "true\n"
    assert so.replay_refusal(script) is None


@pytest.mark.parametrize(
    "smuggled",
    [
        "--gres=gpu:4",
        "--nodelist=node4",
        "-w node4",
        "--mem-per-gpu=9G",
        "-N 2",
        "--exclusive",
        "--dependency=afterany:1",
        "--job-name=x",
        "--hold",
    ],
)
def test_replay_refuses_a_header_that_smuggles_an_option(smuggled: str) -> None:
    """A job's stored script (which its owner could have written with plain sbatch and an
    icefrog comment) asking for something the controller decides is not resubmitted."""
    script = f"#!/bin/bash\n#SBATCH --open-mode=append\n#SBATCH --time=5 {smuggled}\ntrue\n"
    refusal = so.replay_refusal(script)
    assert refusal is not None and "batch script line 3" in refusal
    # past the first command it is not an option (sbatch ignores it): nothing to refuse
    assert so.replay_refusal(f"#!/bin/bash\ntrue\n#SBATCH {smuggled}\n") is None
