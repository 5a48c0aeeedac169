"""``[reports] private`` for a real non-root user: icefrog-alice, in a child process that
dropped to her uid and gid (``inbox_support.as_user``), reads a root-owned SQLite store
readable by her and sees only her own jobs in ``squeue``, ``sacct`` and ``show job``; with
privacy off (Slurm's default) she sees every job. os.getuid() is her real uid here, nothing
is patched but the site's settings files (absent on a test host, left out explicitly)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import icefrog_slurm.commands.sacct
import icefrog_slurm.commands.show
import icefrog_slurm.commands.squeue  # noqa: F401 (loaded before a child drops to alice)
from icefrog_slurm.cli import main
from icefrog_slurm.commands import reportview
from icefrog_slurm.store.sql import SqlStore
from tests.integration.report.populate import populate
from tests.security.inbox_support import as_user

ALICE = "icefrog-alice"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def as_alice(argv: list[str]) -> tuple[int, str, str]:
    run_cli(argv)  # as root first: every module it needs is imported
    result: tuple[int, str, str] = as_user(ALICE, lambda: run_cli(argv))
    return result


@pytest.fixture
def site(
    munge_users: dict[str, int], sqlite_template: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A root-owned 0755 folder with a populated 0644 store whose 'alice' jobs (1, 3, 5)
    belong to the real icefrog-alice."""
    monkeypatch.setattr(reportview, "SITE_FILES", ())
    root = Path(tempfile.mkdtemp(prefix="icefrog-private-", dir="/tmp"))
    root.chmod(0o755)
    try:
        path = root / "icefrog.db"
        shutil.copyfile(sqlite_template, path)
        store = SqlStore(f"sqlite:///{path}")
        try:
            populate(store)
        finally:
            store.close()
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute(
                "UPDATE jobs SET owner_uid = ? WHERE owner_user = 'alice'",
                (munge_users[ALICE],),
            )
            conn.commit()
        path.chmod(0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _config(root: Path, *, private: bool) -> list[str]:
    cfg = root / f"icefrog-{private}.toml"
    cfg.write_text(
        f'[store]\nurl = "sqlite:///{root / "icefrog.db"}"\n\n'
        f"[reports]\nprivate = {str(private).lower()}\n"
    )
    cfg.chmod(0o644)
    return ["--config", str(cfg)]


def test_alice_sees_only_her_jobs_when_private(site: Path) -> None:
    cfg = _config(site, private=True)
    code, out, err = as_alice(["squeue", *cfg, "-t", "all", "-h", "-o", "JobID"])
    assert (code, out.split()) == (0, ["1", "3", "5"]), err
    code, out, err = as_alice(["sacct", *cfg, "-S", "2026-01-01", "-P", "-n", "-o", "JobID"])
    assert (code, out.split()) == (0, ["1", "3", "5"]), err
    code, out, err = as_alice(["sacct", *cfg, "-S", "2026-01-01", "-n", "-u", "bob"])
    assert (code, out) == (0, ""), err
    code, out, err = as_alice(["show", "job", "1", *cfg])
    assert code == 0 and out.startswith("JobId=1 JobName=cnn"), err
    code, out, err = as_alice(["show", "job", "2", *cfg])  # bob's: as if it did not exist
    assert (code, out) == (1, "") and "no icefrog job with" in err
    # root, on the same settings, sees everyone's
    code, out, _ = run_cli(["squeue", *cfg, "-t", "all", "-h", "-o", "JobID"])
    assert out.split() == ["1", "2", "3", "4", "5"]


def test_alice_sees_every_job_when_not_private(site: Path) -> None:
    cfg = _config(site, private=False)
    code, out, err = as_alice(["squeue", *cfg, "-t", "all", "-h", "-o", "JobID"])
    assert (code, out.split()) == (0, ["1", "2", "3", "4", "5"]), err
    assert os.getuid() == 0  # the test itself stayed root; only the child was alice
