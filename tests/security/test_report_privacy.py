"""``[reports] private`` for a real non-root user: icefrog-alice, in a child process that
dropped to her uid and gid (``inbox_support.as_user``), reads a root-owned SQLite store
readable by her and sees only her own jobs in ``squeue``, ``sacct`` and ``show job``; with
privacy off (Slurm's default) she sees every job. os.getuid() is her real uid here, nothing
is patched but the site's settings files (absent on a test host, left out explicitly, or
one written by the test). ``icefrog sacct`` lists her own jobs unless she asks for more
(``-a``, ``-u``, ``-j``), as Slurm's sacct does for a user who is not root; root sees every
job; under privacy ``-a`` does not widen her view, and a settings file of her own naming an
operator group cannot make her an operator of a site whose reports are private."""

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


def _config(root: Path, *, private: bool, extra: str = "") -> list[str]:
    cfg = root / f"icefrog-{private}{'-extra' if extra else ''}.toml"
    cfg.write_text(
        f'[store]\nurl = "sqlite:///{root / "icefrog.db"}"\n\n'
        f"[reports]\nprivate = {str(private).lower()}\n{extra}"
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
    code, out, err = as_alice(["sacct", *cfg, "-S", "2026-01-01", "-P", "-n", "-o", "JobID", "-a"])
    assert (code, out.split()) == (0, ["1", "3", "5"]), err  # sacct -a under PrivateData=jobs
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


SACCT = ["sacct", "-S", "2026-01-01", "-P", "-n", "-o", "JobID"]


def test_sacct_lists_the_callers_own_jobs_unless_asked_for_more(site: Path) -> None:
    cfg = _config(site, private=False)
    code, out, err = as_alice([*SACCT, *cfg])
    assert (code, out.split()) == (0, ["1", "3", "5"]), err
    code, out, err = as_alice([*SACCT, *cfg, "-a"])
    assert (code, out.split()) == (0, ["1", "2", "3", "4", "5"]), err
    code, out, err = as_alice([*SACCT, *cfg, "-u", "bob,carol"])
    assert (code, out.split()) == (0, ["2", "4"]), err
    code, out, err = as_alice([*SACCT, *cfg, "-j", "2"])  # a job asked for: whoever's it is
    assert (code, out.split()) == (0, ["2"]), err
    code, out, _ = run_cli([*SACCT, *cfg])  # root: every user's
    assert out.split() == ["1", "2", "3", "4", "5"]


def test_an_operator_group_of_the_users_own_does_not_open_a_private_site(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The site's reports file (root's, 0644) makes the reports private and names no
    operator group; alice's --config names her own group as the operators'."""
    site_file = site / "reports.toml"
    site_file.write_text("[reports]\nprivate = true\n")
    site_file.chmod(0o644)
    monkeypatch.setattr(reportview, "SITE_FILES", (str(site_file),))
    cfg = _config(site, private=True, extra='operator_group = "icefrog-alice"\n')
    code, out, err = as_alice([*SACCT, *cfg, "-a"])
    assert (code, out.split()) == (0, ["1", "3", "5"]), err
    code, out, err = as_alice(["squeue", *cfg, "-t", "all", "-h", "-o", "JobID"])
    assert (code, out.split()) == (0, ["1", "3", "5"]), err
    # the same group named by the site's own file makes her an operator: every job, and
    # every job by default in sacct, as for root
    site_file.write_text('[reports]\nprivate = true\noperator_group = "icefrog-alice"\n')
    code, out, err = as_alice([*SACCT, *_config(site, private=True)])
    assert (code, out.split()) == (0, ["1", "2", "3", "4", "5"]), err
