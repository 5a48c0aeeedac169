"""``icefrog sacct`` against real ``sacct`` (Slurm 22.05 with slurmdbd, conftest.py) for the
same jobs, flag by flag where icefrog's flag has a Slurm twin.

Equal: the header names and their order, the delimiters of ``-P``, ``-p`` and
``--delimiter``, ``-n``, ``-X``, the rows ``--name``, ``-r``, ``-u``, ``-a``, ``-s``, ``-j``
and root's default (every user's jobs) select, the fields both have (``JobName``, ``User``, ``UID``,
``Submit``, ``Start``, ``End``, ``Elapsed``, ``Partition``, ``State``, ``NodeList``: a
2-node job's folded) with and without widths (``%N``, ``%-N``: justification, how a long
value is cut or not, the dash line),
``SACCT_FORMAT``, the three ``SLURM_TIME_FORMAT`` kinds, and ``--json``'s ``meta.Slurm``
version keys, ``errors``, the types of ``name``, ``user``, ``partition``, ``job_id`` and
``nodes``, and the values of the fields both have.

Different on purpose: ``JobID`` is the icefrog job's id (``SlurmJobID`` is Slurm's, compared
with sacct's ``JobID``), in 8 columns, not 12; a cancelled job's State is ``CANCELLED``
(sacct: ``CANCELLED by UID``); icefrog has no ``ExitCode`` or ``Account`` field (it
records neither) and refuses ``-A`` (exit 2); a table drops the trailing
space sacct keeps; ``--json`` has icefrog's own job fields (``state`` a string, times as
plain numbers), ``meta.plugin.type`` ``icefrog``, an ``icefrog`` version in ``meta`` and a
``warnings`` list (sacct 22.05 has none), and ``meta.Slurm.version.micro`` 0; with ``-s``
and no ``-E`` sacct's window ends where it starts (it prints nothing), icefrog's ends now.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.report import timefmt
from tests.integration.accounting.conftest import AcctJobs, slurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SHARED = "JobName,User,UID,State,Submit,Start,End,Elapsed,Partition,NodeList"


def icefrog(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    jobs: AcctJobs,
    *argv: str,
    **env: str,
) -> tuple[int, str, str]:
    with monkeypatch.context() as m:
        for name in ("SACCT_FORMAT", "SLURM_TIME_FORMAT"):
            m.delenv(name, raising=False)
        for name, value in env.items():
            m.setenv(name, value)
        try:
            code = main(["sacct", *jobs.db, *argv])
        finally:
            timefmt.use_time_style(timefmt.STANDARD)
    out, err = capsys.readouterr()
    return code, out, err


def sacct(*argv: str, **env: str) -> str:
    return slurm("sacct", *argv, **env)


def state_word(line: str, sep: str = "|") -> str:
    """sacct's ``CANCELLED by 0`` is icefrog's ``CANCELLED``."""
    return sep.join(v.split(" by ")[0] for v in line.split(sep))


def test_parsable2_header_and_shared_fields(
    acct_jobs: AcctJobs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = ",".join(acct_jobs.ids)
    real = sacct("-X", "-P", "-j", ids, "-o", SHARED).splitlines()
    code, out, err = icefrog(capsys, monkeypatch, acct_jobs, "-P", "-j", ids, "-o", SHARED)
    assert (code, err) == (0, "")
    mine = out.splitlines()
    assert mine[0] == real[0]
    assert len(mine) == len(acct_jobs.ids) + 1
    assert mine[1:] == [state_word(line) for line in real[1:]]


def test_slurm_job_id_is_sacct_job_id(
    acct_jobs: AcctJobs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = ",".join(acct_jobs.ids)
    real = sacct("-X", "-P", "-n", "-j", ids, "-o", "JobID,JobName").splitlines()
    code, out, _ = icefrog(
        capsys, monkeypatch, acct_jobs, "-P", "-n", "-j", ids, "-o", "SlurmJobID,JobName"
    )
    assert code == 0
    assert out.splitlines() == real
    # in a table: left-justified in 12 columns, as sacct's JobID
    real = sacct("-X", "-n", "-j", ids, "-o", "JobID,JobName").splitlines()
    code, out, _ = icefrog(
        capsys, monkeypatch, acct_jobs, "-n", "-j", ids, "-o", "SlurmJobID,JobName"
    )
    assert out.splitlines() == [line.rstrip() for line in real]


@pytest.mark.parametrize(
    "flags",
    [("-p",), ("-P",), ("-P", "--delimiter", ";"), ("-p", "--delimiter", "::"), ("-p", "-n")],
)
def test_delimiters_and_noheader(
    acct_jobs: AcctJobs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flags: tuple[str, ...],
) -> None:
    ids = ",".join(acct_jobs.ids)
    fields = "JobName,User,State,Elapsed"
    sep = flags[flags.index("--delimiter") + 1] if "--delimiter" in flags else "|"
    real = sacct("-X", *flags, "-j", ids, "-o", fields)
    code, out, _ = icefrog(capsys, monkeypatch, acct_jobs, *flags, "-j", ids, "-o", fields)
    assert code == 0
    assert out.splitlines() == [state_word(line, sep) for line in real.splitlines()]


def test_allocations_flag(
    acct_jobs: AcctJobs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # sacct without -X adds the batch step rows (JobName "batch"); with -X one row a job,
    # which is what icefrog prints either way
    ids = ",".join(acct_jobs.ids)
    steps = sacct("-P", "-n", "-j", ids, "-o", "JobName").splitlines()
    assert "batch" in steps
    real = sacct("-X", "-P", "-n", "-j", ids, "-o", "JobName").splitlines()
    for flags in (("-X",), ()):
        code, out, _ = icefrog(
            capsys, monkeypatch, acct_jobs, *flags, "-P", "-n", "-j", ids, "-o", "JobName"
        )
        assert code == 0
        assert out.splitlines() == real


@pytest.mark.parametrize(
    "select",
    [
        ("--name", "ok,wide"),
        ("--name", "nosuch"),
        ("-r", "gpu"),
        ("-r", "nosuch"),
        ("-u", "icefrog-alice"),
        ("-u", "root"),
        ("-a",),
    ],
)
def test_selection(
    acct_jobs: AcctJobs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    select: tuple[str, ...],
) -> None:
    # -S: sacct's window, as icefrog's, starts at 00:00 today unless -j is given; from the
    # first job's submission both hold exactly these jobs
    start = ["-S", sacct_time(acct_jobs)]
    real = sacct("-X", "-P", "-n", *start, *select, "-o", "JobName,User")
    real_mine = [line for line in real.splitlines() if line.split("|")[0] in names(acct_jobs)]
    code, out, _ = icefrog(
        capsys, monkeypatch, acct_jobs, "-P", "-n", *start, *select, "-o", "JobName,User"
    )
    assert code == 0
    assert out.splitlines() == real_mine


def names(jobs: AcctJobs) -> set[str]:
    return {r["JobName"] for r in jobs.records.values()}


def sacct_time(jobs: AcctJobs) -> str:
    """The first job's submission as sacct and icefrog both read ``-S``."""
    first = min(int(r["Submit"]) for r in jobs.records.values())
    return time_text(first)


def time_text(epoch: int) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


@pytest.mark.parametrize("states", ["CA,F", "CD", "cancelled", "F,CD,CA"])
def test_states(
    acct_jobs: AcctJobs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    states: str,
) -> None:
    # -E given: sacct with -s and no -E ends the window where it starts (prints nothing);
    # icefrog's window ends now
    window = ["-S", sacct_time(acct_jobs), "-E", "now"]
    real = [
        line
        for line in sacct("-X", "-P", "-n", *window, "-s", states, "-o", "JobName").splitlines()
        if line in names(acct_jobs)
    ]
    assert real
    code, out, _ = icefrog(
        capsys, monkeypatch, acct_jobs, "-P", "-n", *window, "-s", states, "-o", "JobName"
    )
    assert code == 0
    assert out.splitlines() == real
    ids = ",".join(acct_jobs.ids)
    real = sacct("-X", "-P", "-n", "-j", ids, "-s", states, "-o", "JobName").splitlines()
    code, out, _ = icefrog(
        capsys, monkeypatch, acct_jobs, "-P", "-n", "-j", ids, "-s", states, "-o", "JobName"
    )
    assert out.splitlines() == real


def test_root_default_is_every_user(
    acct_jobs: AcctJobs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    start = ["-S", sacct_time(acct_jobs)]
    real = [
        line
        for line in sacct("-X", "-P", "-n", *start, "-o", "JobName,User").splitlines()
        if line.split("|")[0] in names(acct_jobs)
    ]
    assert "alice|icefrog-alice" in real  # root's sacct lists another user's job
    code, out, _ = icefrog(capsys, monkeypatch, acct_jobs, "-P", "-n", *start, "-o", "JobName,User")
    assert code == 0
    assert out.splitlines() == real


def test_accounts_refused_where_sacct_selects(
    acct_jobs: AcctJobs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = ",".join(acct_jobs.ids)
    real = sacct("-X", "-P", "-n", "-j", ids, "-A", "vision", "-o", "JobName,Account")
    assert real.splitlines() == ["acct|vision"]
    code, out, err = icefrog(capsys, monkeypatch, acct_jobs, "-j", ids, "-A", "vision")
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and "--accounts" in err


@pytest.mark.parametrize(
    "fields",
    [
        "JobName%20,State,Elapsed%-12,NodeList",
        "NodeList%-6,JobName%8",
        # text cut with a "+", a number and a duration printed whole, a time cut plainly
        "User%-5,JobName,UID%3,Elapsed%-3",
        "JobName%-30,Partition%4,Start%7,End%-5",
    ],
)
def test_table_widths(
    acct_jobs: AcctJobs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fields: str,
) -> None:
    # not the cancelled job: its State cut to 10 columns reads CANCELLED+ in sacct
    ids = ",".join(i for i in acct_jobs.ids if i != acct_jobs.id_of("gone"))
    real = sacct("-X", "-j", ids, "-o", fields)
    code, out, _ = icefrog(capsys, monkeypatch, acct_jobs, "-j", ids, "-o", fields)
    assert code == 0
    assert out.splitlines() == [line.rstrip() for line in real.splitlines()]


def test_sacct_format_variable(
    acct_jobs: AcctJobs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = ",".join(acct_jobs.ids)
    fmt = "JobName%25,User,Elapsed"
    real = sacct("-X", "-j", ids, SACCT_FORMAT=fmt)
    code, out, _ = icefrog(capsys, monkeypatch, acct_jobs, "-j", ids, SACCT_FORMAT=fmt)
    assert code == 0
    assert out.splitlines() == [line.rstrip() for line in real.splitlines()]
    # -o wins over the variable in both
    real = sacct("-X", "-P", "-j", ids, "-o", "User", SACCT_FORMAT=fmt)
    code, out, _ = icefrog(
        capsys, monkeypatch, acct_jobs, "-P", "-j", ids, "-o", "User", SACCT_FORMAT=fmt
    )
    assert out == real


@pytest.mark.parametrize("style", ["standard", "relative", "%d/%m/%Y %Hh%M:%S", "%s"])
def test_slurm_time_format(
    acct_jobs: AcctJobs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    style: str,
) -> None:
    ids = ",".join(acct_jobs.ids)
    fields = "Submit,Start,End"
    real = sacct("-X", "-P", "-j", ids, "-o", fields, SLURM_TIME_FORMAT=style)
    code, out, err = icefrog(
        capsys, monkeypatch, acct_jobs, "-P", "-j", ids, "-o", fields, SLURM_TIME_FORMAT=style
    )
    assert (code, err) == (0, "")
    assert out == real


def test_json_envelope(
    acct_jobs: AcctJobs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = ",".join(acct_jobs.ids)
    real = json.loads(sacct("-X", "--json", "-j", ids))
    code, out, _ = icefrog(capsys, monkeypatch, acct_jobs, "--json", "-j", ids)
    assert code == 0
    mine = json.loads(out)
    assert set(real) <= set(mine)
    assert set(real["meta"]) <= set(mine["meta"])
    assert set(mine["meta"]["plugin"]) == set(real["meta"]["plugin"])
    slurm_meta, my_meta = real["meta"]["Slurm"], mine["meta"]["Slurm"]
    assert set(my_meta) == set(slurm_meta)
    assert set(my_meta["version"]) == set(slurm_meta["version"])
    assert all(isinstance(v, int) for v in my_meta["version"].values())
    assert (my_meta["version"]["major"], my_meta["version"]["minor"]) == (
        slurm_meta["version"]["major"],
        slurm_meta["version"]["minor"],
    )
    assert real["errors"] == mine["errors"] == []
    assert [j["name"] for j in mine["jobs"]] == [j["name"] for j in real["jobs"]]
    for theirs, ours in zip(real["jobs"], mine["jobs"], strict=True):
        for key in ("job_id", "name", "user", "partition", "nodes"):
            assert type(ours[key]) is type(theirs[key]), key
        assert (ours["user"], ours["partition"]) == (theirs["user"], theirs["partition"])
        assert ours["slurm_job_ids"][-1] == str(theirs["job_id"])
        assert ours["state"] == theirs["state"]["current"]
        assert ours["start_time"] == theirs["time"]["start"]
        assert ours["end_time"] == theirs["time"]["end"]
        assert ours["elapsed_s"] == theirs["time"]["elapsed"]
        assert ours["nodes"] == theirs["nodes"]
