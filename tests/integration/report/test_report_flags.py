"""The Slurm habits of ``icefrog squeue``/``sacct``/``show job`` through the real CLI: the
flags sacct and squeue users type, the ``*_FORMAT`` and ``SLURM_TIME_FORMAT`` variables,
Slurm's ``--json`` envelope, and ``[reports] private`` (by a patched uid here; as a real
non-root user in tests/security/test_report_privacy.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from icefrog_slurm.commands import reportview
from icefrog_slurm.store.sql import SqlStore
from tests.integration.report.test_reports import run

ALICE, BOB = 1001, 1002


def ids(out: str) -> str:
    return ",".join(out.split())


# --- squeue ---------------------------------------------------------------------------


def test_squeue_me_name_partition(
    db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.getuid", lambda: ALICE)
    base = ["squeue", *db, "-h", "-t", "all", "-o", "JobID"]
    assert run(capsys, *base, "--me") == (0, "       1\n       3\n       5\n", "")
    assert ids(run(capsys, *base, "-n", "bert,ncf")[1]) == "2,3"
    assert ids(run(capsys, *base, "-p", "gpu")[1]) == "1,2,3,4,5"
    assert run(capsys, *base, "-p", "cpu,debug") == (0, "", "")  # icefrog runs in gpu only


def test_squeue_long_format_like_squeue_O(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "squeue", *db, "-j", "3", "-O", "JobID:5,User:.8,NodeList:10|")
    # -O: left-justified unless '.', the rest of an item printed after the value, no other
    # separator, titles in capitals: as squeue prints them
    assert (code, err) == (0, "")
    assert out == "JOBID    USERNODELIST  |\n3       alicen3        |\n"
    code, out, _ = run(capsys, "squeue", *db, "-h", "-t", "all", "-O", "JobID,Name")
    assert out.splitlines()[0] == "1" + " " * 19 + "cnn" + " " * 17  # 20 columns each


def test_squeue_sort(db: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["squeue", *db, "-h", "-t", "all", "-o", "JobID"]
    assert ids(run(capsys, *base, "--sort=-JobID")[1]) == "5,4,3,2,1"
    assert ids(run(capsys, *base, "-S", "User,-JobID")[1]) == "5,3,1,2,4"
    code, _, err = run(capsys, *base, "-S", "Bogus")
    assert code == 2 and "--sort: unknown field 'Bogus'" in err


def test_squeue_iterate_prints_again_until_interrupted(
    db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", sleep)
    code, out, _ = run(capsys, "squeue", *db, "-h", "-i", "5", "-o", "JobID")
    assert code == 130 and sleeps == [5, 5]
    assert out == "       2\n       3\n       5\n\n" * 2
    sleeps.clear()
    code, out, _ = run(capsys, "squeue", *db, "-i", "5", "-o", "JobID")
    # with the header, a time stamp above it, as squeue prints (now is fixed by conftest)
    assert out == "Fri Nov 20 11:20:00 2026\n   JOBID\n       2\n       3\n       5\n\n" * 2


def test_squeue_format_variables_and_the_flag_wins(
    db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["squeue", *db, "-j", "3"]
    monkeypatch.setenv("SQUEUE_FORMAT", "JobID%3,User")
    assert run(capsys, *base)[1] == "JOB      USER\n  3     alice\n"
    monkeypatch.setenv("SQUEUE_FORMAT2", "JobID:6,Name:5")
    assert run(capsys, *base)[1] == "JOBID NAME \n3     ncf  \n"  # the -O variable first
    assert run(capsys, *base, "-o", "Name")[1] == "      NAME\n       ncf\n"
    monkeypatch.setenv("SQUEUE_FORMAT2", "JobID,Bogus")
    code, out, err = run(capsys, *base)
    assert (code, out) == (2, "") and "SQUEUE_FORMAT2: unknown field 'Bogus'" in err


def test_squeue_json_envelope(db: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(run(capsys, "squeue", *db, "--json")[1])
    assert list(doc) == ["meta", "errors", "warnings", "jobs"]
    assert doc["meta"]["Slurm"] == {
        "version": {"major": 22, "micro": 0, "minor": 5},
        "release": "22.05",
    }
    for job in doc["jobs"]:
        assert all(not isinstance(v, float) for k, v in job.items() if k.endswith("_s"))


# --- sacct ----------------------------------------------------------------------------


def test_sacct_name_partition_allocations_delimiter(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["sacct", *db, "-S", "now-3days", "-n", "-P", "--format", "JobID"]
    assert ids(run(capsys, *base, "--name", "cnn,new")[1]) == "1,5"
    assert ids(run(capsys, *base, "-r", "gpu")[1]) == "1,2,3,4,5"
    assert run(capsys, *base, "--partition", "debug") == (0, "", "")
    assert ids(run(capsys, *base, "-X")[1]) == "1,2,3,4,5"  # one row a job: nothing to hide
    _, out, _ = run(
        capsys, "sacct", *db, "-j", "1", "-p", "--delimiter", ";;", "-o", "JobID,User,State"
    )
    assert out == "JobID;;User;;State;;\n1;;alice;;COMPLETED;;\n"
    _, out, _ = run(
        capsys, "sacct", *db, "-j", "1", "-P", "-n", "--delimiter", "\t", "-o", "JobID,User"
    )
    assert out == "1\talice\n"  # a tab, as in `--delimiter=$'\t'`


def test_sacct_accounts_is_refused(db: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "sacct", *db, "-A", "proj1")
    assert (code, out) == (2, "") and "icefrog records no Slurm account" in err


def test_sacct_format_variable_and_time_format(
    db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SACCT_FORMAT", "JobID,Start")
    assert run(capsys, "sacct", *db, "-j", "1", "-P")[1] == "JobID|Start\n1|2026-11-20T08:01:00\n"
    monkeypatch.setenv("SLURM_TIME_FORMAT", "%d.%m. %H:%M")
    assert run(capsys, "sacct", *db, "-j", "1", "-P", "-n")[1] == "1|20.11. 08:01\n"
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")  # now is 2026-11-20T11:20:00
    assert run(capsys, "sacct", *db, "-j", "1", "-P", "-n")[1] == "1|08:01:00\n"
    assert run(capsys, "sacct", *db, "-j", "1", "-P", "-n", "-o", "JobID")[1] == "1\n"
    monkeypatch.setenv("SLURM_TIME_FORMAT", "fancy")
    code, out, err = run(capsys, "sacct", *db, "-j", "1")
    assert (code, out) == (2, "") and "SLURM_TIME_FORMAT 'fancy'" in err


def test_sacct_json_envelope_whole_seconds(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(run(capsys, "sacct", *db, "-j", "1", "--json")[1])
    assert (doc["errors"], doc["warnings"]) == ([], [])
    [job] = doc["jobs"]
    for key in ("submit_time", "start_time", "end_time", "elapsed_s", "jct_s", "tta_s"):
        assert type(job[key]) is int, key
    assert (job["jct_s"], job["tta_s"]) == (3 * 3600, 9000)


@pytest.mark.parametrize("command", [["sacct"], ["squeue"], ["show", "job", "1"]])
def test_an_unknown_option_prints_the_subcommands_usage(
    db: list[str], capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        run(capsys, *command, *db, "--bogus")
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith(f"usage: icefrog {' '.join(command[:2])}") and "--bogus" in err


# --- privacy --------------------------------------------------------------------------


def _private(tmp_path: Path, group: str | None = None) -> list[str]:
    cfg = tmp_path / "icefrog.toml"
    extra = f'\noperator_group = "{group}"' if group else ""
    cfg.write_text(f"[reports]\nprivate = true{extra}\n")
    return ["--config", str(cfg)]


@pytest.fixture
def private_db(db: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(reportview, "SITE_FILES", ())
    cfg = _private(tmp_path)
    # --config and --db exclude each other: the settings file names the database too
    text = Path(cfg[1]).read_text()
    Path(cfg[1]).write_text(f'[store]\nurl = "{db[1]}"\n\n{text}')
    return cfg


def test_private_reports_show_a_user_only_his_jobs(
    private_db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.getuid", lambda: BOB)
    base = ["-S", "now-3days", "-n", "-P", "-o", "JobID"]
    assert ids(run(capsys, "sacct", *private_db, *base)[1]) == "2"
    assert ids(run(capsys, "sacct", *private_db, *base, "-u", "alice")[1]) == ""
    assert ids(run(capsys, "squeue", *private_db, "-h", "-t", "all", "-o", "JobID")[1]) == "2"
    code, out, err = run(capsys, "show", "job", "1", *private_db)
    assert (code, out) == (1, "") and "no icefrog job with" in err  # as if it did not exist
    assert run(capsys, "show", "job", "2", *private_db)[0] == 0


def test_private_reports_root_and_operators_see_all(
    private_db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["squeue", *private_db, "-h", "-t", "all", "-o", "JobID"]
    monkeypatch.setattr("os.getuid", lambda: 0)
    assert ids(run(capsys, *base)[1]) == "1,2,3,4,5"
    monkeypatch.setattr("os.getuid", lambda: BOB)
    monkeypatch.setattr(reportview, "_gid", lambda group: 4242 if group == "ops" else None)
    monkeypatch.setattr("os.getgroups", lambda: [4242])
    assert ids(run(capsys, *base)[1]) == "2"  # no operator_group set: only root sees all
    text = (
        Path(private_db[1])
        .read_text()
        .replace("private = true", 'private = true\noperator_group = "ops"')
    )
    Path(private_db[1]).write_text(text)
    assert ids(run(capsys, *base)[1]) == "1,2,3,4,5"


def test_public_by_default_like_slurm(
    db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reportview, "SITE_FILES", ())
    monkeypatch.setattr("os.getuid", lambda: BOB)
    assert ids(run(capsys, "squeue", *db, "-h", "-t", "all", "-o", "JobID")[1]) == "1,2,3,4,5"


def test_a_site_file_turns_privacy_on_whatever_the_user_gives(
    db: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    site = _private(tmp_path)[1]
    monkeypatch.setattr(reportview, "SITE_FILES", (site,))
    monkeypatch.setattr("os.getuid", lambda: ALICE)
    assert ids(run(capsys, "squeue", *db, "-h", "-t", "all", "-o", "JobID")[1]) == "1,3,5"


def test_squeue_o_takes_squeues_letters(
    db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(capsys, "squeue", *db, "-j", "3", "-o", "%.5i %.9P %8u %R")
    assert (code, err) == (0, "")
    assert out == "JOBID PARTITION USER     NODELIST(REASON)\n    3       gpu alice    n3\n"
    monkeypatch.setenv("SQUEUE_FORMAT", "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R")  # squeue's
    code, out, err = run(capsys, "squeue", *db, "-h", "-j", "3")
    assert (code, err) == (0, "") and out.split() == [
        "3",
        "gpu",
        "ncf",
        "alice",
        "R",
        "01:18:20",
        "1",
        "n3",
    ]
    code, out, err = run(capsys, "squeue", *db, "-o", "%i %Z")
    assert (code, out) == (2, "") and "--format: '%Z' is not a field here" in err


def test_private_show_job_never_names_anothers_job(
    private_db: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Icefrog job 3 (alice's) whose id is also a Slurm id of carol's job 4: alice gets her
    job, not a refusal that would tell her of carol's."""
    url = Path(private_db[1]).read_text().split('"')[1]
    store = SqlStore(url)
    try:
        with store.transaction() as tx:
            tx.link_slurm_job(job_id=4, slurm_job_id="3", reason="resubmitted", now=0.0)
    finally:
        store.close()
    monkeypatch.setattr("os.getuid", lambda: ALICE)
    code, out, err = run(capsys, "show", "job", "3", *private_db)
    assert (code, err) == (0, "") and out.startswith("JobId=3 JobName=ncf")
    code, out, err = run(capsys, "show", "job", "3", "--slurm", *private_db)
    assert (code, out) == (1, "") and "icefrog job 4" not in err
