"""Where the reports read, how they open the store, and the controller-down notice.

- ``storeargs.report_source``: ``--db`` > ``--config`` > ``ICEFROG_DB`` > the reports file
  (``ICEFROG_REPORTS_CONFIG`` or /etc/icefrog/reports.toml) > the controller's file > the
  default; the site paths are pointed at test files.
- ``store/readonly.py``: a report's SQLite store is opened without creating or changing a
  file (no ``-wal``/``-shm``, mtime kept); a report's Postgres session refuses writes even
  for a role that may write.
- ``commands/downnotice.py``: ``icefrog squeue`` and ``icefrog submit`` print one line on
  stderr when the latest round is older than 3 round periods, and still succeed.
(As a real unprivileged user: tests/security/test_reports_as_user.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from icefrog_slurm.cli import main
from icefrog_slurm.commands import downnotice, storeargs, submit
from icefrog_slurm.errors import InputError
from icefrog_slurm.store.sql import SqlStore
from tests.integration.report.populate import NOW, T0, populate

NOTICE = (
    "icefrog: the icefrog controller has not run since 2026-11-20T10:00:00: "
    "new jobs stay held until it returns; ask your administrator\n"
)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The site's settings files live in ``tmp_path`` (absent until a test writes them)."""
    monkeypatch.setattr(storeargs, "REPORTS_CONFIG", str(tmp_path / "reports.toml"))
    monkeypatch.setattr(storeargs, "CONTROLLER_CONFIG", str(tmp_path / "icefrog.toml"))
    return tmp_path


def _url(site: Path, **env: str) -> tuple[str, str]:
    source = storeargs.report_source(db=None, config=None, environ=env)
    return source.url, source.origin


def test_the_url_comes_from_the_first_place_that_names_it(site: Path) -> None:
    controller, reports = site / "icefrog.toml", site / "reports.toml"
    assert _url(site) == ("sqlite:////var/lib/icefrog/icefrog.db", "default")
    controller.write_text('[state]\ndir = "/srv/ice"\n')
    assert _url(site) == ("sqlite:////srv/ice/icefrog.db", str(controller))
    controller.write_text('[store]\nurl = "sqlite:////a.db"\n[reports]\nurl = "sqlite:////r.db"\n')
    assert _url(site)[0] == "sqlite:////r.db"  # the controller file's [reports] url first
    reports.write_text("[reports]\nprivate = true\n")  # no url: on to the controller's file
    assert _url(site)[0] == "sqlite:////r.db"
    reports.write_text('[reports]\nurl = "sqlite:////site.db"\n')
    assert _url(site) == ("sqlite:////site.db", str(reports))
    mine = site / "mine.toml"
    mine.write_text('[reports]\nurl = "sqlite:////mine.db"\n')
    assert _url(site, ICEFROG_REPORTS_CONFIG=str(mine))[0] == "sqlite:////mine.db"
    assert _url(site, ICEFROG_DB="sqlite:////env.db", ICEFROG_REPORTS_CONFIG=str(mine)) == (
        "sqlite:////env.db",
        "ICEFROG_DB",
    )
    given = storeargs.report_source(db=None, config=str(mine), environ={"ICEFROG_DB": "x"})
    assert given.url == "sqlite:////mine.db"  # the command line before the environment
    assert storeargs.report_source(db="sqlite:////d.db", config=None, environ={}).url == (
        "sqlite:////d.db"
    )


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"ICEFROG_DB": " "}, "ICEFROG_DB is set but empty"),
        ({"ICEFROG_REPORTS_CONFIG": ""}, "ICEFROG_REPORTS_CONFIG is set but empty"),
        ({"ICEFROG_REPORTS_CONFIG": "/nonexistent/r.toml"}, "/nonexistent/r.toml: no such file"),
    ],
)
def test_a_bad_environment_is_one_clear_error(
    site: Path, env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(InputError, match=fragment):
        storeargs.report_source(db=None, config=None, environ=env)


def test_a_fifo_for_a_settings_file_is_refused_without_waiting(site: Path) -> None:
    fifo = site / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"fifo\.toml \(ICEFROG_REPORTS_CONFIG\): not a plain"):
        storeargs.report_source(db=None, config=None, environ={"ICEFROG_REPORTS_CONFIG": str(fifo)})
    with pytest.raises(InputError, match="not a plain file"):
        storeargs.report_source(db=None, config=str(fifo), environ={})


def test_a_bad_reports_file_names_the_key(site: Path) -> None:
    (site / "reports.toml").write_text('[reports]\nurl = 5\nnope = "x"\n')
    with pytest.raises(InputError, match=r"reports\.toml: .*nope"):
        storeargs.report_source(db=None, config=None, environ={})


@pytest.fixture
def populated(tmp_path: Path, sqlite_template: Path) -> Path:
    """A populated SQLite store, closed (no -wal or -shm left)."""
    path = tmp_path / "db" / "icefrog.db"
    path.parent.mkdir()
    path.write_bytes(sqlite_template.read_bytes())
    store = SqlStore(f"sqlite:///{path}")
    try:
        populate(store)
    finally:
        store.close()
    return path


def _state(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_reports_create_and_change_no_file(
    populated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _state(populated.parent)
    assert before.keys() == {"icefrog.db"}
    db = ["--db", f"sqlite:///{populated}"]
    for argv in (["squeue", *db], ["sacct", *db], ["show", "job", "1", *db]):
        code, out, err = run(capsys, *argv)
        assert code == 0 and out, err
    assert _state(populated.parent) == before


def test_a_report_store_refuses_to_write(populated: Path) -> None:
    store = SqlStore(f"sqlite:///{populated}", readonly=True)
    try:
        with pytest.raises(DBAPIError, match="readonly"), store.reading() as session:
            session.execute(text("UPDATE jobs SET name = 'x'"))
    finally:
        store.close()


def test_a_long_lived_report_store_sees_commits_made_after_the_controller_started(
    populated: Path,
) -> None:
    """Opened while no controller had the database (no -wal: read immutable), a report
    store (squeue -i keeps one) still sees what a controller commits later in WAL mode:
    the read-only/immutable choice is made per transaction, not once per engine."""
    reader = SqlStore(f"sqlite:///{populated}", readonly=True)
    writer = None
    try:
        assert not Path(f"{populated}-wal").exists()
        with reader.reading() as session:
            before = session.execute(text("SELECT count(*) FROM jobs")).scalar_one()
        writer = SqlStore(f"sqlite:///{populated}")  # WAL mode, kept open like a daemon
        with writer.reading() as session:
            session.execute(text("UPDATE jobs SET name = 'renamed' WHERE id = 1"))
            session.commit()
        assert Path(f"{populated}-wal").exists()
        with reader.reading() as session:
            name = session.execute(text("SELECT name FROM jobs WHERE id = 1")).scalar_one()
            after = session.execute(text("SELECT count(*) FROM jobs")).scalar_one()
        assert (name, after) == ("renamed", before)
    finally:
        reader.close()
        if writer is not None:
            writer.close()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_report_session_on_postgres_is_read_only(db_url: str) -> None:
    store = SqlStore(db_url, readonly=True)  # the superuser: it could write
    try:
        with pytest.raises(DBAPIError, match="read-only transaction"), store.reading() as s:
            s.execute(text("UPDATE jobs SET name = 'x'"))
    finally:
        store.close()


def test_down_notice_reads_the_period_from_the_rounds() -> None:
    times = [1000.0, 700.0, 400.0, 100.0]  # a round every 300 s
    assert downnotice.down_notice(times, now=1000.0 + 900) is None
    late = downnotice.down_notice(times, now=1000.0 + 901)
    assert late is not None and "has not run since" in late
    assert downnotice.down_notice([5000.0, 1400.0], now=5000.0 + 3 * 3600) is None  # hourly
    assert downnotice.down_notice([1000.0], now=1000.0 + 3 * 300 + 1) is not None  # default
    never = downnotice.down_notice([], now=0.0)
    assert never is not None and "has not run yet" in never


def test_squeue_says_when_the_controller_is_down_and_still_succeeds(
    populated: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = ["--db", f"sqlite:///{populated}"]
    code, out, err = run(capsys, "squeue", *db)  # NOW: the last round (r5) 4800 s ago
    assert (code, err) == (0, "") and "cnn" not in out and "bert" in out
    monkeypatch.setattr(storeargs, "now", lambda: T0 + 7200 + 3 * 1800 + 1)  # 3 periods
    code, later, err = run(capsys, "squeue", *db)
    assert (code, err) == (0, NOTICE)
    assert [line.split()[:4] for line in later.splitlines()] == [
        line.split()[:4] for line in out.splitlines()
    ]


def test_squeue_on_a_store_where_no_round_ran_says_so(
    tmp_path: Path, sqlite_template: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fresh.db"
    path.write_bytes(sqlite_template.read_bytes())
    code, out, err = run(capsys, "squeue", "--db", f"sqlite:///{path}")
    assert code == 0 and "JOBID" in out, err
    assert err == f"{downnotice.down_notice([], now=0.0)}\n"
    assert "has not run yet" in err


class _Backend:
    """Slurm stand-in for ``icefrog submit``: the held job gets id 4242."""

    def submit_held(self, *, request: object) -> str:
        return "4242"

    def cancel(self, *, job_id: str) -> None:
        raise AssertionError("nothing to cancel")


def test_submit_says_when_the_controller_is_down_and_still_succeeds(
    populated: Path,
    tmp_path: Path,
    site: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(submit, "SlurmCliBackend", _Backend)
    monkeypatch.setattr(submit, "register", lambda **_kw: tmp_path / "registered")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    argv = ["submit", "--inbox", str(inbox), "--workdir", str(tmp_path / "job"), "--", str(script)]
    monkeypatch.setenv("ICEFROG_DB", f"sqlite:///{populated}")
    code, out, err = run(capsys, *argv)  # the real clock: the rounds are from 2026-11-20
    assert (code, out, err) == (0, "Submitted batch job 4242\n", NOTICE)
    monkeypatch.setattr(downnotice.time, "time", lambda: NOW)  # a round 4800 s ago: running
    assert run(capsys, *argv) == (0, "Submitted batch job 4242\n", "")
    monkeypatch.setenv("ICEFROG_DB", f"sqlite:///{tmp_path / 'absent.db'}")  # no store
    assert run(capsys, *argv) == (0, "Submitted batch job 4242\n", "")
    assert os.listdir(tmp_path).count("absent.db") == 0


@pytest.mark.slurm
def test_submit_on_the_real_cluster_says_the_controller_is_down(
    populated: Path,
    job_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real ``sbatch --hold`` and a real signed ``register`` into an inbox; the store's
    last round is from 2026-11-20: the job is submitted held, and the notice says why it
    will stay so."""
    from icefrog_slurm.slurm.cli_backend import SlurmCliBackend

    inbox = job_dir / "inbox"
    inbox.mkdir(mode=0o1733)
    monkeypatch.setenv("ICEFROG_DB", f"sqlite:///{populated}")
    script = job_dir / "t.py"
    script.write_text("print('hi')\n")
    argv = ["submit", "--inbox", str(inbox), "--workdir", str(job_dir / "w"), "--partition"]
    code, out, err = run(capsys, *argv, "gpu", "--job-name", "down-notice", "--", str(script))
    assert code == 0 and out.startswith("Submitted batch job "), err
    job_id = out.split()[-1]
    try:
        assert err == NOTICE
        state = SlurmCliBackend().poll(job_ids=[job_id])[job_id]
        assert (state.state, state.held) == ("PENDING", True)
    finally:
        SlurmCliBackend().cancel(job_id=job_id)
