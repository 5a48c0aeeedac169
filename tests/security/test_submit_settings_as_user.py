"""``icefrog submit`` by an ordinary user (icefrog-alice) when the controller's settings file
is root's, mode 0600 (as the admin guide installs it when it holds a database password):
without the site file every user may read, it is one line saying what to give instead
(exit 2, nothing written); with ``--inbox`` and ``--partition`` it goes on; with the site
file (0644) the inbox, partition and ``[submit]`` come from there. Alice runs in a forked
child that dropped to her uid (``inbox_support.as_user``)."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm.commands import submit
from icefrog_slurm.errors import InputError
from icefrog_slurm.settings import Settings
from tests.security.inbox_support import as_user
from tests.security.test_reports_as_user import ALICE, run_cli


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch, munge_users: dict[str, int]) -> Iterator[Path]:
    """A root-owned 0755 folder holding the controller's settings, mode 0600; the module's
    paths point there (the site file is not made yet)."""
    root = Path(tempfile.mkdtemp(prefix="icefrog-submit-", dir="/tmp"))
    root.chmod(0o755)
    controller = root / "icefrog.toml"
    controller.write_text(
        '[slurm]\npartition = "secret"\n[store]\nurl = "postgresql://x:pw@h/db"\n'
    )
    controller.chmod(0o600)
    monkeypatch.setattr(submit, "DEFAULT_CONFIG", str(controller))
    monkeypatch.setattr(submit, "REPORTS_CONFIG", str(root / "reports.toml"))
    monkeypatch.delenv("ICEFROG_REPORTS_CONFIG", raising=False)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _settings(**given: str | None) -> Settings:
    args = argparse.Namespace(config=None, inbox=None, partition=None)
    for k, v in given.items():
        setattr(args, k, v)
    return submit._settings(args)


def test_unreadable_controller_settings_say_what_to_give(site: Path) -> None:
    with pytest.raises(InputError) as exc:
        as_user(ALICE, _settings)
    message = str(exc.value)
    assert "not readable by you: give --inbox DIR and --partition NAME" in message
    assert str(site / "reports.toml") in message
    # root reads it: the controller's own partition
    assert _settings().slurm.partition == "secret"


def test_inbox_and_partition_given_need_no_settings(site: Path) -> None:
    settings = as_user(ALICE, lambda: _settings(inbox="/i", partition="gpu"))
    assert settings == Settings()


def test_the_site_file_every_user_reads(site: Path) -> None:
    (site / "reports.toml").write_text(
        '[inbox]\ndir = "/shared/inbox"\n[slurm]\npartition = "a800"\n'
        "[submit]\nmem_per_gpu_mb = 2048\n"
    )
    (site / "reports.toml").chmod(0o644)
    settings = as_user(ALICE, _settings)
    assert (settings.inbox.dir, settings.slurm.partition) == ("/shared/inbox", "a800")
    assert settings.submit.mem_per_gpu_mb == 2048


def test_the_command_exits_2_with_one_line(site: Path, tmp_path: Path) -> None:
    argv = ["submit", "--workdir", "/nonexistent/w", "t.py"]
    code, out, err = as_user(ALICE, lambda: run_cli(argv))  # as alice only: root could submit
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "not readable by you" in err
