"""Reports run by an ordinary user (icefrog-alice) write nothing to the controller's store.

The SQLite store is root's (mode 0644 in a 0755 folder), as the admin guide installs it:
alice runs ``icefrog squeue``, ``sacct`` and ``show job`` with the controller stopped (no
``-wal`` or ``-shm`` file) and while a root writer holds the database open; they work and
leave the folder, the file and its mtime as they were. On the real Postgres a role made
with the admin guide's recipe ("Users reading reports") reads the reports and may not
write. A controller settings file alice may not read (0600) is one line saying what to set
instead, exit 2. Alice's commands run in a forked child that dropped to her uid
(``inbox_support.as_user``); each is run once as root first, so that everything it imports
is loaded while the interpreter's files (under /root) can still be read.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

import icefrog_slurm.commands.sacct
import icefrog_slurm.commands.squeue  # noqa: F401 (loaded before a child drops to alice)
from icefrog_slurm.cli import main
from icefrog_slurm.commands import downnotice, storeargs
from icefrog_slurm.store.sql import SqlStore
from tests.integration.report.populate import populate
from tests.security.inbox_support import as_user
from tests.support.postgres import PgServer

ALICE = "icefrog-alice"
REPO = Path(__file__).resolve().parents[2]
_roles = itertools.count()


def run_cli(argv: list[str], env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """``icefrog ARGV`` in this process with ``env`` added: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def as_alice(argv: list[str], env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    run_cli(argv, env)  # as root first: every module it needs is imported
    result: tuple[int, str, str] = as_user(ALICE, lambda: run_cli(argv, env))
    return result


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A root-owned 0755 folder every user can traverse (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="icefrog-reports-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def root_store(shared_dir: Path, sqlite_template: Path) -> Path:
    """A populated store as the controller leaves it: root's, 0644, WAL mode, closed."""
    folder = shared_dir / "state"
    folder.mkdir(mode=0o755)
    path = folder / "icefrog.db"
    shutil.copyfile(sqlite_template, path)
    store = SqlStore(f"sqlite:///{path}")
    try:
        populate(store)
    finally:
        store.close()
    path.chmod(0o644)
    assert sorted(os.listdir(folder)) == ["icefrog.db"]  # the writer's -wal/-shm are gone
    assert path.read_bytes()[18:20] == b"\x02\x02"  # the header's WAL mode
    return path


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}


def test_alice_reads_a_stopped_controllers_sqlite_store_and_writes_nothing(
    munge_users: dict[str, int], root_store: Path
) -> None:
    folder = root_store.parent
    before = _listing(folder)
    db = ["--db", f"sqlite:///{root_store}"]
    code, out, err = as_alice(["squeue", *db, "-t", "all", "-h", "-o", "JobID,User"])
    assert code == 0, err
    assert out.split() == ["1", "alice", "2", "bob", "3", "alice", "4", "carol", "5", "alice"]
    assert "the icefrog controller has not run since" in err  # its last round was long ago
    code, out, err = as_alice(["sacct", *db, "-S", "2026-01-01", "-P", "-n", "-o", "JobID", "-a"])
    assert (code, out.split()) == (0, ["1", "2", "3", "4", "5"]), err
    code, out, err = as_alice(["show", "job", "1", *db])
    assert code == 0 and out.startswith("JobId=1 JobName=cnn"), err
    assert _listing(folder) == before  # no -wal, no -shm, the file untouched


def test_alice_reads_while_the_controller_writes(
    munge_users: dict[str, int], root_store: Path
) -> None:
    """A root connection holds the database open (its -wal and -shm exist, 0644) and has
    committed a job the main file does not hold yet: alice's report reads it too."""
    folder = root_store.parent
    writer = sqlite3.connect(root_store)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("UPDATE jobs SET name = 'renamed' WHERE id = 5")
        writer.commit()
        assert {"icefrog.db-wal", "icefrog.db-shm"} <= set(os.listdir(folder))
        argv = ["squeue", "--db", f"sqlite:///{root_store}", "-h", "-j", "5", "-o", "Name"]
        code, out, err = run_cli(argv)  # root's read may touch the -shm
        assert (code, out.strip()) == (0, "renamed"), err
        before = _listing(folder)
        code, out, err = as_user(ALICE, lambda: run_cli(argv))
        assert (code, out.strip()) == (0, "renamed"), err
        assert _listing(folder) == before
    finally:
        writer.close()


def test_alice_reads_after_the_controller_was_killed(
    munge_users: dict[str, int], root_store: Path
) -> None:
    """A writer that died without closing (SIGKILL, or systemd's SIGTERM to a daemon that
    does not catch it) leaves its -wal (holding its last commit) and -shm behind: alice's
    report reads through them, and changes neither."""
    folder = root_store.parent
    pid = os.fork()
    if pid == 0:  # the "controller": commit, then die without closing
        conn = sqlite3.connect(root_store)
        conn.execute("UPDATE jobs SET name = 'last-words' WHERE id = 5")
        conn.commit()
        os._exit(0)
    os.waitpid(pid, 0)
    assert {"icefrog.db-wal", "icefrog.db-shm"} <= set(os.listdir(folder))
    before = _listing(folder)
    argv = ["squeue", "--db", f"sqlite:///{root_store}", "-h", "-j", "5", "-o", "Name"]
    code, out, err = as_user(ALICE, lambda: run_cli(argv))
    assert (code, out.strip()) == (0, "last-words"), err
    assert _listing(folder) == before


@pytest.mark.slurm
@pytest.mark.slow
def test_alice_reads_the_real_controllers_store_while_it_runs_and_after_it_stopped(
    munge_users: dict[str, int], shared_dir: Path
) -> None:
    """The real daemon (2 s rounds, on the local cluster) keeps a SQLite store in a root
    folder: alice's squeue reads it while it runs, without a notice; once it is stopped
    (SIGTERM, as systemd stops it) her squeue says it has not run since its last round,
    still exits 0, and leaves the folder as it was."""
    state = shared_dir / "state"
    config = shared_dir / "icefrog.toml"
    config.write_text(
        f'[state]\ndir = "{state}"\n[controller]\nround_period_s = 2.0\n[inbox]\npoll_s = 0.5\n'
    )
    config.chmod(0o644)
    assert run_cli(["db", "upgrade", "--config", str(config)])[0] == 0
    (state / "icefrog.db").chmod(0o644)
    log = (shared_dir / "controller.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "icefrog_slurm", "controller", "--config", str(config)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        store = SqlStore(f"sqlite:///{state / 'icefrog.db'}", readonly=True)
        try:
            while len(downnotice.round_times(store)) < 3:
                assert daemon.poll() is None and time.monotonic() < deadline, (
                    shared_dir / "controller.log"
                ).read_text()
                time.sleep(0.5)
        finally:
            store.close()
        code, out, err = as_alice(["squeue", "--config", str(config)])
        assert (code, err) == (0, "") and out.split()[0] == "JOBID", err
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        log.close()
    before = _listing(state)
    time.sleep(8)  # more than 3 round periods
    code, out, err = as_user(ALICE, functools.partial(run_cli, ["squeue", "--config", str(config)]))
    assert code == 0 and out.split()[0] == "JOBID", err
    assert "the icefrog controller has not run since" in err and len(err.splitlines()) == 1
    assert _listing(state) == before


def test_an_unreadable_controller_settings_file_is_one_line_saying_what_to_set(
    munge_users: dict[str, int], shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = shared_dir / "icefrog.toml"
    config.write_text('[store]\nurl = "postgresql+psycopg://icefrog:secret@dbhost/icefrog"\n')
    config.chmod(0o600)
    monkeypatch.delenv("ICEFROG_DB", raising=False)
    monkeypatch.delenv("ICEFROG_REPORTS_CONFIG", raising=False)
    for argv in (["sacct", "--config", str(config)], ["squeue"]):
        monkeypatch.setattr(storeargs, "CONTROLLER_CONFIG", str(config))
        monkeypatch.setattr(storeargs, "REPORTS_CONFIG", str(shared_dir / "absent.toml"))
        code, out, err = as_user(ALICE, functools.partial(run_cli, argv, {}))
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1, err
        assert "Traceback" not in err and "secret" not in err and str(config) in lines[0]
    # found by itself (not named with --config): the line says what to set instead
    assert "not readable by you" in lines[0], err
    assert "--db URL" in lines[0] and "ICEFROG_DB" in lines[0] and "reports.toml" in lines[0]


def _reader_recipe(role: str, owner: str, dbname: str) -> list[str]:
    """The admin guide's read-only role recipe, for this server's names."""
    guide = (REPO / "docs" / "admin-guide.md").read_text()
    section = guide.split("## Users reading reports", 1)[1]
    sql = re.search(r"```sql\n(.*?)```", section, re.S)
    assert sql is not None, "the admin guide's reader recipe (a ```sql block) is missing"
    recipe = sql.group(1).replace("icefrog_reader", role)
    recipe = recipe.replace("DATABASE icefrog ", f"DATABASE {dbname} ")
    recipe = recipe.replace("FOR ROLE icefrog ", f"FOR ROLE {owner} ")
    return [s.strip() for s in recipe.split(";") if s.strip()]


@pytest.fixture
def pg_db(pg_server: PgServer, pg_template: str) -> Iterator[str]:
    name = f"icefrog_readers_{os.getpid()}_{next(_roles)}"
    janitor = pg_server.janitor(name, template=pg_template)
    janitor.init()
    try:
        yield pg_server.url(name)
    finally:
        janitor.drop()


@pytest.mark.postgres
def test_alice_reads_postgres_through_the_read_only_role_of_the_guide(
    munge_users: dict[str, int], pg_server: PgServer, pg_db: str
) -> None:
    db_url = pg_db
    store = SqlStore(db_url)
    try:
        populate(store)
    finally:
        store.close()
    dbname = db_url.rsplit("/", 1)[1]
    role = f"icefrog_reader_{os.getpid()}_{next(_roles)}"
    admin = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            for statement in _reader_recipe(role, pg_server.user, dbname):
                conn.execute(text(statement.replace("choose-a-password", "pw")))
        reader_url = f"postgresql+psycopg://{role}@{pg_server.host}:{pg_server.port}/{dbname}"
        env = {"ICEFROG_DB": reader_url, "PGPASSWORD": "pw"}
        code, out, err = as_alice(["squeue", "-t", "all", "-h", "-o", "JobID"], env)
        assert (code, out.split()) == (0, ["1", "2", "3", "4", "5"]), err
        code, out, err = as_alice(
            ["sacct", "-a", "-S", "2026-01-01", "-P", "-n", "-o", "User"], env
        )
        assert (code, out.split()) == (0, ["alice", "bob", "alice", "carol", "alice"]), err
        writer = create_engine(reader_url, connect_args={"password": "pw"})
        try:
            with pytest.raises(DBAPIError, match="permission denied"), writer.begin() as w:
                w.execute(text("UPDATE jobs SET name = 'x' WHERE id = 1"))
            with pytest.raises(DBAPIError, match="permission denied"), writer.begin() as w:
                w.execute(text("DELETE FROM rounds"))
        finally:
            writer.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()
