"""A symbolic link at the inbox's or the archive's path, as nobody (uid 65534) plants it in
a sticky folder like a 1777 /scratch that holds them: root must never follow it (it made
root chmod the folder it points to, 1733 for the inbox, and move that folder's files into
the archive). The first start refuses it also when it appears after the check, the inbox's
preparation refuses it, a drain reads nothing through it. Run as root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from icefrog_slurm.commands import preflight, state_folders
from icefrog_slurm.errors import InputError
from icefrog_slurm.settings import load_settings
from icefrog_slurm.store import migrate
from icefrog_slurm.store.inbox import ReportInbox
from tests.support.trusting_inbox import trusting_inbox

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid")


def _site(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(a root folder standing for /etc, with a file; a sticky shared folder; the config
    that puts the inbox and the archive in the shared folder)."""
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    etc, shared = base / "etc", base / "shared"
    etc.mkdir(mode=0o755)
    (etc / "passwd").write_text("root:x:0:0\n")
    shared.mkdir()
    os.chmod(shared, 0o1777)
    config = base / "icefrog.toml"
    config.write_text(
        f'[state]\ndir = "{base}/state"\n'
        f'[inbox]\ndir = "{shared}/inbox"\narchive_dir = "{shared}/archive"\n'
    )
    (base / "state").mkdir(mode=0o755)
    migrate.upgrade(f"sqlite:///{base}/state/icefrog.db")
    return etc, shared, config


def _nobodys_link(link: Path, target: Path) -> None:
    link.symlink_to(target)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)


def _untouched(etc: Path) -> None:
    assert stat.S_IMODE(etc.stat().st_mode) == 0o755
    assert os.listdir(etc) == ["passwd"]


def test_a_link_put_at_the_inbox_after_the_check_is_refused_by_the_first_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody wins the race between the start's look at the (absent) inbox and its mkdir:
    the start stops in one line, and the folder the link points to keeps its mode."""
    etc, _shared, config = _site(tmp_path)
    looked = state_folders.inspect

    def inspect_then_plant(folder: state_folders.Folder, **kw: Path | None) -> tuple[bool, str]:
        seen = looked(folder, **kw)
        if folder.key == "inbox.dir" and not os.path.lexists(folder.path):
            _nobodys_link(folder.path, etc)
        return seen

    monkeypatch.setattr(state_folders, "inspect", inspect_then_plant)
    settings = load_settings(config)
    with pytest.raises(InputError, match=r"inbox\.dir: .*/shared/inbox is a symbolic link"):
        preflight.first_start(settings, config=str(config))
    box = ReportInbox(store=None, inbox_dir=settings.inbox.dir,  # type: ignore[arg-type]
                      archive_dir=settings.inbox.archive_dir, slurm_jobs=dict)  # fmt: skip
    with pytest.raises(InputError, match=r"/shared/inbox: a symbolic link or no folder"):
        box.prepare()  # what the daemon runs next: it would have chmod'ed etc 1733
    _untouched(etc)


@pytest.mark.parametrize("which", ["inbox", "archive"])
def test_a_link_at_the_inbox_or_the_archive_is_refused_never_followed(
    which: str, tmp_path: Path
) -> None:
    """Also a root-owned link (an admin's) is refused: the path itself must be the folder."""
    etc, shared, config = _site(tmp_path)
    _nobodys_link(shared / which, etc)
    settings = load_settings(config)
    box = ReportInbox(store=None, inbox_dir=settings.inbox.dir,  # type: ignore[arg-type]
                      archive_dir=settings.inbox.archive_dir, slurm_jobs=dict)  # fmt: skip
    with pytest.raises(InputError, match=rf"/shared/{which}: a symbolic link or no folder"):
        box.prepare()
    _untouched(etc)
    with pytest.raises(InputError, match=rf"/shared/{which} is a symbolic link \(never followed\)"):
        preflight.first_start(settings, config=str(config))
    os.chown(shared / which, 0, 0, follow_symlinks=False)  # the admin's own link
    folder = next(f for f in state_folders.folders(settings) if f.path == shared / which)
    fine, why = state_folders.inspect(folder)
    assert not fine and "is a symbolic link (never followed)" in why, why


def test_a_drain_reads_nothing_through_a_link_at_the_inbox(tmp_path: Path) -> None:
    """The inbox swapped for a link to a root folder: the drain stops at once (the daemon
    logs it and goes on with its tick); nothing of that folder is read, moved or deleted."""
    etc, _shared, _config = _site(tmp_path)
    with trusting_inbox(tmp_path) as box:
        box.inbox_dir.rmdir()
        _nobodys_link(box.inbox_dir, etc)
        with pytest.raises(OSError, match="a symbolic link or no folder"):
            box.drain()
    _untouched(etc)
    assert os.listdir(tmp_path / "archive" / "rejected") == []
