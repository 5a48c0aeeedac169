"""The controller's folders on the host: the state folder, the report inbox and its archive.

What each must be (docs/security.md, "Installing it safely"), made at the controller's first
start (:func:`make`) and looked at, without changing anything, by ``icefrog controller
--check`` (:func:`inspect`):

- ``state.dir``: a folder of root's (the controller runs as root), mode 0755: everyone may pass
  through it to the inbox, nobody else may write in it (it holds ``tag.key`` and, by
  default, the SQLite database);
- ``inbox.dir``: root's, mode 1733 (drop-only and sticky, like /tmp);
- ``inbox.archive_dir``: root's, mode 0700, on the inbox's filesystem (reports are renamed
  into it, not copied).

Every path the controller trusts, these folders, the settings file and a SQLite database
with its ``-wal``, ``-shm`` and ``.leader`` files, must pass :func:`unsafe_path` (sshd's
StrictModes): it and every folder above it, as written and as resolved, owned by root (or
the controller's uid) and writable by nobody else, but for a root-owned folder with the
sticky bit (like /tmp); else a user could rewrite it or put another in its place.

A missing folder is made, its missing parents mode 0755, and its mode set whatever the
umask, on a descriptor opened without following a link. A symbolic link at one of these
paths (never followed: a user's link in a sticky folder would have root change the mode of
the folder it points to), an existing folder owned by another uid, a state folder others
may write in or cannot pass through, or an archive on another filesystem is refused with
the command that fixes it: the controller changes no mode of a folder it did not make,
except the inbox's and the archive's, which it sets at every start
(``ReportInbox.prepare``).
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import Settings
from icefrog_slurm.store.inbox_files import own_dir

STATE_MODE = 0o755
INBOX_MODE = 0o1733
ARCHIVE_MODE = 0o700


@dataclass(frozen=True)
class Folder:
    """One folder the controller needs: its settings key, path and mode."""

    key: str
    path: Path
    mode: int
    set_at_start: bool  # the controller sets this mode at every start


def folders(settings: Settings) -> tuple[Folder, Folder, Folder]:
    return (
        Folder("state.dir", Path(settings.state.dir), STATE_MODE, False),
        Folder("inbox.dir", Path(settings.inbox.dir), INBOX_MODE, True),
        Folder("inbox.archive_dir", Path(settings.inbox.archive_dir), ARCHIVE_MODE, True),
    )


def inspect(folder: Folder, *, inbox: Path | None = None) -> tuple[bool, str]:
    """(fine, what it is) of an existing folder, or of an absent one the first start makes;
    the text of a refused one names the fix. ``inbox``: the archive's filesystem must be
    this folder's (when it exists)."""
    shown = printable(str(folder.path), 300)
    try:
        st = os.lstat(folder.path)
    except FileNotFoundError:
        above = unsafe_path(folder.path, itself=False)
        if above is not None:
            return False, above
        if inbox is not None and _device(folder.path) != _device(inbox):
            return False, (
                f"{shown} would be made on another filesystem than the inbox: "
                f"set {folder.key} beside the inbox"
            )
        return True, f"absent: the first start makes it, mode {folder.mode:04o}"
    except OSError as exc:
        return False, f"{shown}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return False, (
            f"{shown} is a symbolic link (never followed): set {folder.key} to the folder itself"
        )
    if not stat.S_ISDIR(st.st_mode):
        return False, f"{shown} is not a folder: remove it, or set {folder.key} elsewhere"
    uid, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    if st.st_uid != uid:
        return False, f"{shown} is owned by uid {st.st_uid}: run `chown root {shown}`"
    if not folder.set_at_start and mode & 0o022:
        return (
            False,
            f"{shown} has mode {mode:04o}, others may write in it: run `chmod 0755 {shown}`",
        )
    if not folder.set_at_start and not mode & 0o001:
        return False, (
            f"{shown} has mode {mode:04o}, users cannot reach the inbox through it: "
            f"run `chmod 0755 {shown}`"
        )
    if inbox is not None:
        try:
            inbox_dev = os.stat(inbox).st_dev
        except OSError:
            inbox_dev = st.st_dev
        if inbox_dev != st.st_dev:
            return False, f"{shown} is on another filesystem than the inbox: set {folder.key}"
    above = unsafe_path(folder.path, itself=False)
    if above is not None:
        return False, above
    if mode != folder.mode and folder.set_at_start:
        return True, f"mode {mode:04o}, set to {folder.mode:04o} at start"
    return True, f"mode {mode:04o}, uid {uid}"


def unsafe_path(path: Path, *, itself: bool = True) -> str | None:
    """Why a user could change ``path`` or put another in its place, with the command that
    fixes it; None when nobody but root (or the controller's uid) can. ``path`` and every
    folder above it, as written and as resolved, must be owned by root or the controller's
    uid and writable by nobody else, a root-owned folder with the sticky bit excepted (like
    /tmp: only an entry's owner may rename it); a symbolic link on the way must be owned so.
    ``itself`` False: the mode of ``path`` is the caller's to check (a folder the start
    sets). What does not exist is not looked at: the controller makes it."""
    real = Path(os.path.realpath(path))
    ends = {Path(os.path.abspath(path)), real}
    seen: set[Path] = set()
    for part in itertools.chain(_on_the_way(Path(path)), _on_the_way(real)):
        if part in seen:
            continue
        seen.add(part)
        try:
            st = os.lstat(part)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{printable(str(part), 300)}: {exc.strerror}"
        why = _unsafe_entry(part, st, mode_too=itself or part not in ends)
        if why is not None:
            return why
    return None


def _on_the_way(path: Path, links: int = 0) -> Iterator[Path]:
    """Every entry met on the way to ``path``: each folder above it, itself, and for each
    symbolic link among them every entry met on the way to its target (40 links at most,
    the kernel's bound). Lazily: a link is looked into only once it was found safe."""
    whole = Path(os.path.abspath(path))
    for part in (*reversed(whole.parents), whole):
        yield part
        if links < 40 and part.is_symlink():
            try:
                target = part.parent / os.readlink(part)
            except OSError:  # gone meanwhile
                continue
            yield from _on_the_way(target, links + 1)


def _unsafe_entry(part: Path, st: os.stat_result, *, mode_too: bool) -> str | None:
    shown = printable(str(part), 300)
    if st.st_uid not in (0, os.geteuid()):
        return f"{shown} is owned by uid {st.st_uid}: run `chown root {shown}`"
    mode = stat.S_IMODE(st.st_mode)
    if not mode_too or stat.S_ISLNK(st.st_mode) or not mode & 0o022:
        return None
    if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and mode & stat.S_ISVTX:
        return None
    return f"{shown} has mode {mode:04o}, others may write it: run `chmod go-w {shown}`"


def _device(path: Path) -> int | None:
    """The filesystem ``path`` is on, or would be made on: its nearest existing folder's
    (None when not even ``/`` can be looked at)."""
    for p in (path, *path.parents):
        try:
            return os.stat(p).st_dev
        except OSError:
            continue
    return None


def make(settings: Settings) -> None:
    """Refuse a folder :func:`inspect` refuses (InputError naming the fix); make the missing
    ones with their modes; then look again (a link a user put in place of one after the
    first look, an archive made on another filesystem)."""
    state, inbox, archive = folders(settings)
    for again in (False, True):
        for folder in (state, inbox, archive):
            fine, why = inspect(folder, inbox=inbox.path if folder is archive else None)
            if not fine:
                raise InputError(f"{folder.key}: {why}")
            if not again:
                make_folder(folder.path, folder.mode)


def make_folder(path: Path, mode: int) -> None:
    """``path`` and its missing parents (mode 0755), ``path`` with ``mode``, whatever the
    umask; an existing folder is left as it is. Each is made by ``mkdir`` and its mode set
    on a descriptor (``inbox_files.own_dir``): a symbolic link or another uid's folder put
    in place of one meanwhile (any user may, in a sticky folder like /tmp) is refused,
    never followed."""
    missing = []
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    for folder in reversed(missing):
        shown = printable(str(folder), 300)
        try:
            folder.mkdir(mode=0o700)
            made = True
        except FileExistsError:  # made meanwhile: taken if it is root's own folder
            made = False
        except OSError as exc:
            raise InputError(f"{shown}: cannot make the folder: {exc.strerror}") from None
        try:
            with own_dir(folder) as fd:
                if made:
                    os.fchmod(fd, mode if folder == path else STATE_MODE)
        except OSError as exc:
            raise InputError(f"{shown}: {exc.strerror}") from None
