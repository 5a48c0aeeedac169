"""Opening a job's own folder as root, in a way neither its owner nor anyone else can steer.

The controller (root) writes ``decision.json`` into a job's folder and looks there for the
job's checkpoint marker. The folder's path is the job owner's to choose, so
:func:`open_job_dir` trusts no name in it: it opens the folder from ``/`` one component at
a time with ``openat(O_DIRECTORY | O_NOFOLLOW)`` (a symlink at any level is refused, never
followed) and checks each directory it opened by its file descriptor (``fstat``: what is
checked is what is then used):

- every component is owned by root or by the job's owner;
- none is writable by its group or by others, except one root owns with the sticky bit set
  (``/tmp``: there only an entry's owner may rename or delete it);
- the folder itself is owned by the job's owner and writable by nobody else.

Anything else raises :class:`UnsafeJobDir`, naming the component and what is wrong with it.
The caller then works only through the returned descriptor: renaming or swapping a folder
of the path afterwards changes nothing about which folder that is.
"""

from __future__ import annotations

import errno
import os
import stat

from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.jsonio import printable

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class UnsafeJobDir(IcefrogError):
    """A job's folder the controller refuses to work in (the message names the component)."""


def open_job_dir(path: str, *, owner_uid: int) -> int:
    """A descriptor of the folder ``path`` (module docstring), to be closed by the caller."""
    names = _components(path)
    where = "/"
    fd = os.open("/", _DIR_FLAGS)
    try:
        _check(fd, where, owner_uid, last=not names)
        for i, name in enumerate(names):
            where = f"{where.rstrip('/')}/{name}"
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise UnsafeJobDir(f"{printable(where)}: {_open_failure(name, fd, exc)}") from None
            os.close(fd)
            fd = child
            _check(fd, where, owner_uid, last=i == len(names) - 1)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _components(path: str) -> list[str]:
    if not path.startswith("/"):
        raise UnsafeJobDir(f"{printable(path)!r}: not an absolute path")
    if "\0" in path:
        raise UnsafeJobDir(f"{printable(path)!r}: contains a NUL byte")
    names = [n for n in path.split("/") if n]
    if any(n in (".", "..") for n in names):
        raise UnsafeJobDir(f"{printable(path)}: '.' and '..' are refused in a job's folder path")
    return names


def _open_failure(name: str, dir_fd: int, exc: OSError) -> str:
    """Why ``name`` did not open as a folder (O_NOFOLLOW on a link: ELOOP or ENOTDIR)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (never followed)"
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        return "is not a folder"
    return exc.strerror or str(exc)


def _check(fd: int, where: str, owner_uid: int, *, last: bool) -> None:
    st = os.fstat(fd)
    shown = printable(where)
    if st.st_uid not in (0, owner_uid):
        raise UnsafeJobDir(
            f"{shown}: owned by uid {st.st_uid}, neither the job's owner (uid {owner_uid}) nor root"
        )
    sticky_root = st.st_uid == 0 and bool(st.st_mode & stat.S_ISVTX) and not last
    if st.st_mode & _WRITABLE_BY_OTHERS and not sticky_root:
        who = " and ".join(
            w
            for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others"))
            if st.st_mode & bit
        )
        raise UnsafeJobDir(
            f"{shown}: writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); only a "
            "root-owned folder with the sticky bit may be, and never the job's own folder"
        )
    if last and st.st_uid != owner_uid:
        raise UnsafeJobDir(
            f"{shown}: the job's folder is owned by uid {st.st_uid}, not by the job's owner "
            f"(uid {owner_uid})"
        )
