"""The migrations match the models on both databases, and `icefrog db current | history |
upgrade | downgrade` run them: up to the head, down to the base and back, refusing another
application's database and a revision this icefrog does not know."""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import stat
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from icefrog_slurm.cli import main
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.store import migrate
from icefrog_slurm.store.models import Base
from icefrog_slurm.store.sql import SqlStore, make_engine
from tests.support.checkout import source_copy


def test_upgrade_on_empty_db_matches_the_models(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
            assert ctx.get_current_revision() == migrate.head_revision()
            tables = set(inspect(conn).get_table_names())
        assert set(Base.metadata.tables) <= tables
        migrate.upgrade(empty_db_url)  # a second upgrade is a no-op
        migrate.alembic_config(empty_db_url)
        from alembic import command

        command.downgrade(migrate.alembic_config(empty_db_url), "base")
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()


def test_store_refuses_an_unmigrated_db(empty_db_url: str) -> None:
    with pytest.raises(IcefrogError, match="icefrog db upgrade"):
        SqlStore(empty_db_url)


def test_cli_db_upgrade_from_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state" / "x.db"
    config = tmp_path / "icefrog.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{db}"\n')
    assert main(["db", "upgrade", "--config", str(config)]) == 0
    assert migrate.head_revision() in capsys.readouterr().out
    SqlStore(f"sqlite:///{db}").close()  # migrated: the store opens it


def test_cli_db_upgrade_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "icefrog.toml"
    config.write_text("[store]\nurll = 'x'\n")
    assert main(["db", "upgrade", "--config", str(config)]) == 2
    assert "store.urll: unknown field" in capsys.readouterr().err
    assert main(["db", "upgrade", "--url", "nosuchdb://x"]) == 2


def _db(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["db", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_cli_up_to_head_down_to_base_and_back(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    head = migrate.head_revision()
    assert head is not None
    if not empty_db_url.startswith("sqlite"):  # a SQLite file is not there yet
        code, out, _ = _db(capsys, "current", "--url", empty_db_url)
        assert code == 0 and "no icefrog schema (empty)" in out
    assert _db(capsys, "upgrade", "--url", empty_db_url)[0] == 0
    code, out, _ = _db(capsys, "current", "--url", empty_db_url)
    assert code == 0 and out.strip().endswith(f"revision {head} (head)"), out
    code, out, _ = _db(capsys, "downgrade", "--url", empty_db_url, "-1")
    below = migrate.history()[1].revision
    assert code == 0 and out.strip().endswith(f"at revision {below}"), out
    code, out, _ = _db(capsys, "current", "--url", empty_db_url)
    assert f"revision {below}, the newest is {head}" in out
    with pytest.raises(IcefrogError, match="icefrog db upgrade"):
        SqlStore(empty_db_url)  # the store refuses a database below the head
    code, out, _ = _db(capsys, "downgrade", "--url", empty_db_url, "base")
    assert code == 0 and out.strip().endswith("at revision base"), out
    assert _tables(empty_db_url) <= {migrate.VERSION_TABLE}
    assert _db(capsys, "upgrade", "--url", empty_db_url, "0003")[0] == 0
    assert "revision 0003," in _db(capsys, "current", "--url", empty_db_url)[1]
    assert _db(capsys, "upgrade", "--url", empty_db_url)[0] == 0
    _assert_migrated(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:  # back at the head, the schema is the models' again
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
    finally:
        engine.dispose()
    SqlStore(empty_db_url).close()


def test_cli_history_lists_every_revision_newest_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _db(capsys, "history")
    lines = out.strip().splitlines()
    assert code == 0
    assert lines[0].startswith(f"0006 -> {migrate.head_revision()} (head), ")
    assert lines[-1] == "<base> -> 0001, initial schema"
    assert len(lines) == len(migrate.history()) >= 5


def test_every_writing_subcommand_refuses_a_foreign_db(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
            conn.exec_driver_sql("INSERT INTO customers VALUES (7)")
    finally:
        engine.dispose()
    for argv in (["upgrade"], ["upgrade", "0002"], ["downgrade", "base"], ["current"]):
        code, out, err = _db(capsys, argv[0], "--url", empty_db_url, *argv[1:])
        assert code == 2 and out == "", (argv, out, err)
        assert "customers" in err and "not an icefrog database" in err, err
        assert len(err.strip().splitlines()) == 1
    assert _tables(empty_db_url) == {"customers"}  # no version table was added


def test_a_bad_revision_is_one_line(empty_db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _db(capsys, "upgrade", "--url", empty_db_url, "0003")[0] == 0
    for argv, fragment in (
        (["upgrade", "nope"], "revision nope: not a revision of this icefrog's schema"),
        (["downgrade", "f00dfeed"], "revision f00dfeed: not a revision"),
        (["downgrade", "0005"], "revision 0005: "),  # above the current one
        (["upgrade", "--revision", "0004", "0005"], "give the revision once"),
    ):
        code, _, err = _db(capsys, argv[0], "--url", empty_db_url, *argv[1:])
        assert code == 2, (argv, err)
        assert fragment in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert "Traceback" not in err
    assert "revision 0003," in _db(capsys, "current", "--url", empty_db_url)[1]


def test_no_migration_under_a_running_controller(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """While a controller holds the leader lock, upgrade and downgrade refuse (one line, exit
    2) and change nothing; once it lets go they run."""
    assert _db(capsys, "upgrade", "--url", empty_db_url)[0] == 0
    store = SqlStore(empty_db_url)
    lease = store.try_lead()
    assert lease is not None
    try:
        for argv in (["upgrade"], ["downgrade", "-1"]):
            code, _, err = _db(capsys, argv[0], "--url", empty_db_url, *argv[1:])
            assert code == 2 and "a controller is running on it" in err, err
        _assert_migrated(empty_db_url)
        with lease.hold():  # still the leader: looking took nothing from it
            pass
    finally:
        lease.release()
        store.close()
    assert _db(capsys, "downgrade", "--url", empty_db_url, "-1")[0] == 0


@pytest.mark.parametrize("action", [("downgrade", "-1"), ("upgrade",)])
def test_a_standby_cannot_take_the_lead_while_a_migration_runs(
    action: tuple[str, ...], empty_db_url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A standby waits for the lock on a database at its code's revision; the admin stops
    the leader and migrates. The command looked at the lock and let it go: the standby,
    trying again at that moment, took the lead and ran its code on a schema changing
    under it. Now the lock is held until the migration is done."""
    from icefrog_slurm.store import leader

    assert _db(capsys, "upgrade", "--url", empty_db_url)[0] == 0
    if action[0] == "upgrade":
        assert _db(capsys, "downgrade", "--url", empty_db_url, "-1")[0] == 0
    real = getattr(migrate, action[0])
    standby = make_engine(empty_db_url)
    leads = []

    def migrating(url: str, revision: str) -> None:
        lease = leader.try_lead(standby)  # the standby's try, just as the migration starts
        leads.append(lease is not None)
        if lease is not None:
            lease.release()
        real(url, revision)

    monkeypatch.setattr(migrate, action[0], migrating)
    try:
        assert _db(capsys, *action, "--url", empty_db_url)[0] == 0
        assert leads == [False]
        lease = leader.try_lead(standby)  # once it is done, the lock is free again
        assert lease is not None
        lease.release()
    finally:
        standby.dispose()


def test_nothing_to_downgrade(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    code, _, err = _db(capsys, "downgrade", "--url", url, "base")
    assert code == 2 and "does not exist: nothing to downgrade" in err
    code, _, err = _db(capsys, "current", "--url", url)
    assert code == 2 and "does not exist" in err
    assert not (tmp_path / "x.db").exists()  # neither made the file
    (tmp_path / "x.db").write_bytes(b"")
    code, _, err = _db(capsys, "downgrade", "--url", url, "base")
    assert code == 2 and "has no icefrog schema: nothing to downgrade" in err


def test_looking_leaves_a_foreign_sqlite_file_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refusing another application's SQLite file reads it read-only: not even its journal
    mode changes (the store's engine would switch it to WAL on connect)."""
    path = tmp_path / "theirs.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE customers (id INTEGER PRIMARY KEY); INSERT INTO customers VALUES (1);"
    )
    conn.close()
    before = path.read_bytes()
    for argv in (["upgrade"], ["downgrade", "base"], ["current"]):
        assert _db(capsys, argv[0], "--url", f"sqlite:///{path}", *argv[1:])[0] == 2
    assert path.read_bytes() == before


def test_looking_leaves_no_files_beside_a_closed_sqlite_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`current` and the upgrade's own last look open the file read-only; with no -wal
    there (the store was closed) they make none, nor a -shm."""
    db = tmp_path / "icefrog.db"
    assert _db(capsys, "upgrade", "--url", f"sqlite:///{db}")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["icefrog.db"]
    assert _db(capsys, "current", "--url", f"sqlite:///{db}")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["icefrog.db"]


def test_upgrade_makes_the_folders_of_a_sqlite_file_0755(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever the umask: users must pass through the state folder to reach the inbox."""
    db = tmp_path / "a" / "b" / "icefrog.db"
    old = os.umask(0o077)
    try:
        assert _db(capsys, "upgrade", "--url", f"sqlite:///{db}")[0] == 0
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder


REPO = Path(__file__).resolve().parents[3]


def _run(python: str, code: str, *, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [python, "-c", code], check=True, cwd=cwd, env=env, capture_output=True, text=True
    )
    return done.stdout


def _assert_migrated(url: str) -> None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            revision = MigrationContext.configure(conn).get_current_revision()
        assert revision == migrate.head_revision()
    finally:
        engine.dispose()


# Run by the child: where icefrog_slurm and db/ came from, then `icefrog db upgrade`.
_UPGRADE = (
    "import sys, icefrog_slurm; from icefrog_slurm.cli import main; "
    "from icefrog_slurm.store.migrate import migrations_dir; "
    "print(icefrog_slurm.__file__); print(migrations_dir()); "
    "sys.exit(main(['db', 'upgrade', '--url', {url!r}]))"
)


@pytest.mark.slow
def test_a_wheel_install_can_migrate(tmp_path: Path) -> None:
    """Admins `pip install` a wheel: db/ must be inside it (as icefrog_slurm.db), and the
    Philly trace. Build the wheel, install it into a bare folder, and run `icefrog db
    upgrade` and `icefrog trace sample` from there (not from this checkout)."""
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    src = source_copy(tmp_path / "src")  # a checkout's build/ may hold stale files
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp_path / "w")],
        check=True,
        cwd=tmp_path,
        capture_output=True,
    )
    [wheel] = (tmp_path / "w").glob("icefrog_slurm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = ["db/env.py", "db/script.py.mako", "db/versions/0001_initial_schema.py",
               "sim/data/philly.csv.gz", "sim/data/philly.LICENSE"]  # fmt: skip
    for name in shipped:
        assert f"icefrog_slurm/{name}" in names, name
    assert not [n for n in names if n.startswith("icefrog_slurm/store/migrations/")]
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    out = _run(sys.executable, _UPGRADE.format(url=url), cwd=tmp_path, env=env).splitlines()
    assert out[0].startswith(str(site)) and out[1] == str(site / "icefrog_slurm" / "db"), out
    _assert_migrated(url)
    sample = (
        "import sys; from icefrog_slurm.cli import main; "
        "sys.exit(main(['trace', 'sample', '--seed', '1', '--jobs', '10', '--out', 'w.csv']))"
    )
    _run(sys.executable, sample, cwd=tmp_path, env=env)
    assert "packaged" in (tmp_path / "w.json").read_text()


def test_the_editable_install_finds_db(tmp_path: Path) -> None:
    """The dev venv's editable install maps icefrog_slurm.db to the checkout's db/."""
    if importlib.util.find_spec("icefrog_slurm.db") is None:
        pytest.skip("icefrog-slurm is not installed in editable mode here")
    assert migrate.migrations_dir() == REPO / "db"
    url = f"sqlite:///{tmp_path / 'state.db'}"
    out = _run(sys.executable, _UPGRADE.format(url=url), cwd=tmp_path,
               env={"PATH": "/usr/bin:/bin"}).splitlines()  # fmt: skip
    assert out[1] == str(REPO / "db"), out
    _assert_migrated(url)


def test_a_source_checkout_finds_db(tmp_path: Path) -> None:
    """PYTHONPATH=checkout, nothing installed: a fresh venv that sees the dev venv's
    dependencies (a .pth naming its site-packages, whose own .pth files, the editable
    finder among them, are not run) finds the checkout's db/ beside the package."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")],
                   check=True)  # fmt: skip
    [site] = (tmp_path / "v" / "lib").glob("python3*/site-packages")
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = str(tmp_path / "v" / "bin" / "python")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    finders = "import sys; assert not any('editable' in repr(f) for f in sys.meta_path); "
    out = _run(python, finders + _UPGRADE.format(url=url), cwd=tmp_path, env=env).splitlines()
    assert out[0] == str(REPO / "icefrog_slurm" / "__init__.py"), out
    assert out[1] == str(REPO / "db"), out
    _assert_migrated(url)


def test_a_store_with_rows_in_every_table_goes_down_to_the_first_revision_and_up_again(
    empty_db_url: str,
) -> None:
    """A job with a chain of Slurm jobs, a round, an intent and an audit entry survives a
    downgrade to the first revision and the upgrade back (SQLite's batch mode rebuilds
    tables that others name in foreign keys: the check must come after, not during)."""
    from tests.integration.store.helpers import spec

    migrate.upgrade(empty_db_url)
    store = SqlStore(empty_db_url)
    with store.transaction() as tx:
        job = tx.create_job(name="j", owner_uid=1000, owner_user="u", slurm_job_id="7",
                            spec=spec(), now=1.0)  # fmt: skip
        tx.link_slurm_job(job_id=job, slurm_job_id="8", reason="resubmitted", now=2.0)
        tx.record_round(round_no=1, now=3.0, policy="p", capacity_gpus=4, allocations=[])
        tx.add_intent(action="start", params={"target": {}}, now=3.0, job_id=job, round_no=1)
        tx.log_action(action="release", command=("release", "8"), outcome="ok", now=4.0,
                      duration_s=0.0, slurm_job_id="8", job_id=job)  # fmt: skip
    store.close()
    migrate.downgrade(empty_db_url, "0001")
    migrate.upgrade(empty_db_url)
    store = SqlStore(empty_db_url)
    with store.transaction() as tx:
        assert tx.job(job).slurm_job_ids == ("7", "8")
        assert [a.action for a in tx.actions(job_id=job)] == ["release"]
        assert tx.round() is not None
    store.close()
