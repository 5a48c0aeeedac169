"""The inbox's file side: what lies in the inbox, in which order to read it, and where it goes.

Everything here works through directory file descriptors and never follows a symlink: users
own the job folders and may swap anything for a link at any time. Names are what the kernel
gives (``os.listdir`` on a descriptor: undecodable bytes come back as lone surrogates), and
only names that match :data:`FOLDER` and :data:`FILE` exactly (ASCII digits, never
``str.isdigit``) are taken as a job's; anything else is *junk* and is quarantined like a bad
report. Nothing here raises for a name or a file a user chose; an entry that vanishes while
it is looked at is simply not there.

- :func:`scan` lists the inbox: job folders (``<job id>`` and ``<job id>.<token>``, see
  ``security.job_folder``) with their owner and report files, and junk entries; it looks at
  every entry of the inbox but takes at most :data:`MAX_OWNER_ENTRIES` of each owner (so
  one user's million folders cannot push anyone else's out of a scan) and keeps, of each
  owner, only the entries one drain may read of him (``per_owner``), those that come first
  in a drain's order (junk, then each job's reports by ``seq``): of each job folder they
  are chosen from its listing alone (no file is looked at for it), so a folder that grew
  past the bound while the controller was away is still read in order. It looks into one
  owner's job folders :data:`MAX_OWNER_LOOKS` times at most (folders opened, names
  listed, dot files looked at), the folders in turns over the scans: a user's millions of
  names (hard links of one file cost no inodes) slow no drain and take no memory.
- :func:`fair_order` picks what one drain reads: at most ``per_owner`` entries of each
  owner, taken in turn across owners, ``total`` in all, each job's reports in ``seq`` order.
- :func:`read_report` reads a report file after checking what it is and who owns it.
- :func:`archive` moves a report read into the archive and deletes anything else (no
  plain file, larger than a report, no job folder's), :func:`discard_folder` deletes a
  claimed job folder with all it holds; :func:`prune_archive` deletes archived files older
  than the retention. Deleting goes by descriptors and follows no link (:func:`delete`).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from icefrog_slurm import protocol
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.protocol import is_slurm_job_id

log = logging.getLogger(__name__)

FOLDER = re.compile(r"([0-9]{1,10})(?:\.[0-9a-f]{8,64})?")
"""A job folder: ``<job id>`` or ``<job id>.<hex token>`` (``fullmatch``, then the id is
checked by ``protocol.is_slurm_job_id``)."""
FILE = re.compile(r"([0-9]{1,18})-([a-z_]{1,32})\.json")
"""A report file: ``<seq>-<kind>.json``; matched with ``fullmatch``."""
MAX_OWNER_ENTRIES = 10_000
"""Entries of the inbox of one owner (uid) one scan keeps (the rest wait until these are
gone); the scan itself goes over every entry, whoever owns it."""
MAX_OWNER_LOOKS = 100_000
"""What one scan does in one owner's job folders, all of them together: each folder
opened, each name listed and each dot file looked at (``lstat``) counts one. Past it the
owner's other folders wait for the next scan, which starts after the folder where this one
stopped (a user's million names cost a scan no more than this: about 0.15-0.25 s of CPU,
``benchmarks.hostile_costs folder``). A job with short epochs (about 500 reports an hour)
fills it in a week of controller outage."""
JUNK_FOLDER = "_inbox"
"""The archive folder of entries that are no job folder and could not be deleted
(``archive/rejected/_inbox``)."""

TRANSIENT_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EIO, errno.ESTALE, errno.EINTR,
     errno.EAGAIN, errno.ETIMEDOUT, errno.ENOBUFS}
)  # fmt: skip
"""Errors reading a report that no user's file causes (descriptors or memory run out, a
disk or NFS fault): the report waits for the next drain instead of being rejected."""

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SAFE_NAME = re.compile(r"\.?[0-9A-Za-z_.-]{1,100}")


class Rejected(IcefrogError):
    """A report failed a check; the message is the recorded reason."""


@dataclass(frozen=True)
class Folder:
    """A job folder as the scan found it; ``ident`` tells if it was swapped since."""

    name: str
    job_id: str
    uid: int
    ident: tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True)
class Item:
    """One entry to read: a file of a job folder, or (``folder`` None) a junk entry."""

    folder: Folder | None
    name: str
    uid: int  # whose budget it uses: the folder's owner, or the junk entry's

    @property
    def where(self) -> str:
        """``folder/name`` fit for a log line and a database column."""
        inside = self.name if self.folder is None else f"{self.folder.name}/{self.name}"
        return printable(inside, 160)

    @property
    def order(self) -> tuple[int, int, str]:
        job = int(self.folder.job_id) if self.folder is not None else -1
        return job, *_name_order(self.name)


@dataclass(frozen=True)
class Scan:
    folders: tuple[Folder, ...]
    items: tuple[Item, ...]
    turns: dict[int, str]
    """Of each owner whose folders took :data:`MAX_OWNER_LOOKS`: the folder after which
    its next scan starts (``turns`` of :func:`scan`)."""


def scan(
    inbox_fd: int,
    *,
    stale_before: float,
    per_owner: int,
    turns: Mapping[int, str] | None = None,
) -> Scan:
    """The inbox now: of each owner, the ``per_owner`` entries a drain reads first
    (:attr:`Item.order`: junk, then each job's reports by ``seq``), chosen with a heap of
    that size, so a scan holds no more whatever users put there. Dot files are being
    written and are left alone, unless they were last changed before ``stale_before``
    (their ``st_ctime``, which no user can set: left behind by a writer that died): then
    they are junk of their folder. An owner's job folders are looked into in the order of
    their names, starting after ``turns[uid]`` (the ``turns`` of the scan before), until
    :data:`MAX_OWNER_LOOKS` is taken."""
    folders: dict[int, list[Folder]] = {}
    junk: dict[int, list[Item]] = {}
    kept: dict[int, int] = {}  # entries kept by owner
    for name in _names(inbox_fd):
        st = _lstat(name, inbox_fd)
        if st is None:
            continue
        kept[st.st_uid] = kept.get(st.st_uid, 0) + 1
        if kept[st.st_uid] > MAX_OWNER_ENTRIES:
            continue
        m = FOLDER.fullmatch(name)
        if m is None or not is_slurm_job_id(m.group(1)) or not stat.S_ISDIR(st.st_mode):
            junk.setdefault(st.st_uid, []).append(Item(None, name, st.st_uid))
            continue
        folder = Folder(name, m.group(1), st.st_uid, (st.st_dev, st.st_ino))
        folders.setdefault(st.st_uid, []).append(folder)
    items: list[Item] = []
    next_turns: dict[int, str] = {}
    for uid, count in kept.items():
        if count > MAX_OWNER_ENTRIES:
            log.warning(
                "inbox: uid %d has %d entries; %d are looked at a drain, the rest wait",
                uid, count, MAX_OWNER_ENTRIES,
            )  # fmt: skip
        owned = sorted(folders.get(uid, []), key=lambda f: f.name)
        after = (turns or {}).get(uid, "")
        start = next((i for i, f in enumerate(owned) if f.name > after), 0)
        looks = _Looks(MAX_OWNER_LOOKS, per_owner)
        inside = _owner_items(inbox_fd, owned[start:] + owned[:start], stale_before, looks)
        items += heapq.nsmallest(
            per_owner, itertools.chain(junk.get(uid, []), inside), key=lambda i: i.order
        )
        if looks.left <= 0:
            next_turns[uid] = looks.last
            log.warning(
                "inbox: the job folders of uid %d hold more than a drain looks at (%d "
                "names); the rest wait, its folders are looked into in turns",
                uid, MAX_OWNER_LOOKS,
            )  # fmt: skip
    return Scan(tuple(f for owned in folders.values() for f in owned), tuple(items), next_turns)


@dataclass
class _Looks:
    """What a scan may still do in one owner's folders, the entries it keeps of each, and
    the last folder it looked into."""

    left: int
    per_folder: int
    last: str = ""


def _owner_items(
    inbox_fd: int, folders: list[Folder], stale_before: float, looks: _Looks
) -> Iterator[Item]:
    """The entries of each folder a drain reads first, folder after folder while
    ``looks`` lasts."""
    for folder in folders:
        if looks.left <= 0:
            return
        yield from _folder_items(inbox_fd, folder, stale_before, looks)


def _folder_items(inbox_fd: int, folder: Folder, stale_before: float, looks: _Looks) -> list[Item]:
    """The entries of the folder a drain reads first (:func:`_first_names`), fresh dot files
    left out; each look taken from ``looks``."""
    looks.left -= 1
    looks.last = folder.name
    try:
        with open_folder(inbox_fd, folder) as job_fd:
            items = []
            for n in _first_names(job_fd, looks):
                if n.startswith("."):
                    if looks.left <= 0:
                        continue
                    looks.left -= 1
                    if not _stale(n, job_fd, stale_before):
                        continue
                items.append(Item(folder, n, folder.uid))
            return items
    except OSError as exc:  # swapped or removed meanwhile: next drain
        log.warning("inbox: cannot read folder %s: %s", printable(folder.name), exc.strerror)
        return []


def fair_order(items: Sequence[Item], *, per_owner: int, total: int) -> list[Item]:
    """At most ``per_owner`` items of each uid, in turns across uids, ``total`` in all."""
    queues: dict[int, list[Item]] = {}
    for item in sorted(items, key=lambda i: i.order):
        queue = queues.setdefault(item.uid, [])
        if len(queue) < per_owner:
            queue.append(item)
    out: list[Item] = []
    for turn in range(per_owner):
        for queue in queues.values():
            if turn < len(queue):
                out.append(queue[turn])
                if len(out) >= total:
                    return out
    return out


@contextmanager
def dir_fd(path: str | Path, *, at: int | None = None) -> Iterator[int]:
    """A descriptor of the directory ``path`` (relative to ``at``); no symlink followed."""
    fd = os.open(path, _DIR_FLAGS, dir_fd=at)
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def own_dir(path: str | Path) -> Iterator[int]:
    """A descriptor of the folder ``path``, which must be this process's (root's) own and no
    symbolic link: the last component is opened with ``O_NOFOLLOW`` and checked on the
    descriptor, so a link or another uid's folder put in its place is refused (OSError),
    never followed. The folders above it are the admin's, checked at start
    (``state_folders.unsafe_path``)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            why = "a symbolic link or no folder (never followed)"
            raise OSError(exc.errno, why, str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            why = f"owned by uid {st.st_uid}, not by this process's"
            raise OSError(errno.EPERM, why, str(path))
        yield fd
    finally:
        os.close(fd)


@contextmanager
def open_folder(inbox_fd: int, folder: Folder) -> Iterator[int]:
    """The folder's descriptor; OSError if it is no longer the folder the scan saw."""
    with dir_fd(folder.name, at=inbox_fd) as fd:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != folder.ident or st.st_uid != folder.uid:
            raise OSError(errno.ESTALE, "replaced since the scan")
        yield fd


def archive(src_fd: int, name: str, target: Path, *, now: float, keep: bool = True) -> None:
    """Take the entry ``name`` of ``src_fd`` out of the inbox, so it is never read twice: a
    report worth keeping (``keep``, and a plain file of one link and at most
    ``MAX_REPORT_BYTES``) is moved into the folder ``target`` (made if missing) as
    ``<now>-<ns>-<name>``; anything else is deleted (:func:`delete`: junk of any size kept
    ``retention_days`` in root's archive would fill the filesystem out of its owner's
    reach), and so is a report that cannot be moved. What cannot be deleted either (a
    folder nested past Python's recursion limit) is moved all the same."""
    st = _lstat(name, src_fd)
    if st is None:  # gone
        return
    report = keep and _plain(st) and st.st_size <= protocol.MAX_REPORT_BYTES
    if report and _move(src_fd, name, target, now):
        return
    if not delete(src_fd, name):
        _move(src_fd, name, target, now)


def _move(src_fd: int, name: str, target: Path, now: float) -> bool:
    """Move the entry into the archive folder ``target``; False (logged) when it cannot be."""
    safe = name if _SAFE_NAME.fullmatch(name) else "unnamed"
    try:
        target.mkdir(exist_ok=True, mode=0o700)  # root's alone (umask only takes bits)
        with own_dir(target) as dst_fd:
            os.rename(name, f"{int(now)}-{time.time_ns()}-{safe}", src_dir_fd=src_fd,
                      dst_dir_fd=dst_fd)  # fmt: skip
    except OSError as exc:
        log.error("inbox: cannot archive %s: %s", printable(name), exc.strerror)
        return False
    return True


def delete(dir_fd: int, name: str) -> bool:
    """Delete the entry ``name`` of the folder ``dir_fd``, a folder with all it holds, by
    descriptors (``shutil.rmtree`` with ``dir_fd``: no symbolic link is followed, also
    inside); True when it is gone. What cannot be deleted is logged and left (a user's junk
    folder nested thousands deep makes ``shutil.rmtree`` recurse past Python's limit)."""
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except (OSError, RecursionError) as exc:
        if _lstat(name, dir_fd) is None:  # gone meanwhile
            return True
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else "nested too deep"
        log.warning("inbox: cannot delete %s: %s; left", printable(name), printable(why))
        return False
    return True


def remove_folder(inbox_fd: int, folder: Folder, *, modified_before: float) -> bool:
    """Remove the folder if it is still the scanned one, empty, and was last changed
    before ``modified_before`` (its ``st_ctime``, which no user can set: ``touch -d`` a
    century ahead does not keep a folder); True when it is gone."""
    try:
        st = os.stat(folder.name, dir_fd=inbox_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != folder.ident or st.st_ctime >= modified_before:
            return False
        os.rmdir(folder.name, dir_fd=inbox_fd)
    except OSError:  # not empty (a report just arrived), or gone: fine either way
        return False
    return True


def discard_folder(inbox_fd: int, folder: Folder, target: Path, *, now: float) -> None:
    """Delete the folder with whatever is in it if it is still the scanned one (moved into
    the archive folder ``target`` if it cannot be: :func:`archive`)."""
    st = _lstat(folder.name, inbox_fd)
    if st is not None and (st.st_dev, st.st_ino) == folder.ident:
        archive(inbox_fd, folder.name, target, now=now, keep=False)


def prune_archive(archive_dir: Path, *, before: float) -> int:
    """Delete archived entries whose name says they were archived before ``before``, and
    the folders left empty; returns how many went."""
    removed = 0
    for outcome in ("accepted", "rejected"):
        base = archive_dir / outcome
        for sub in _listdir_path(base):
            try:
                with dir_fd(base / sub) as fd:
                    for name in os.listdir(fd):
                        head = name.split("-", 1)[0]
                        if head.isascii() and head.isdigit() and int(head) < before:
                            removed += delete(fd, name)
            except OSError:  # no folder, or gone
                continue
            with contextlib.suppress(OSError):  # not empty
                os.rmdir(base / sub)
    return removed


def read_report(dir_fd: int, name: str, owner: int) -> tuple[bytes, int]:
    """The file's bytes, after checking what it is and who owns it (before reading). Only
    a plain file is opened (a device, a FIFO or a socket never: ``lstat`` first), without
    blocking and never as a controlling terminal, and checked again on its descriptor (it
    may have been swapped between)."""
    if not FILE.fullmatch(name):
        raise Rejected(f"file name {printable(name, 300)!r} is not <seq>-<kind>.json")
    try:
        if not _plain(os.stat(name, dir_fd=dir_fd, follow_symlinks=False)):
            raise Rejected("not a plain file with one link")
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in TRANSIENT_ERRNOS:
            raise  # the reader's fault, not the file's: the report waits
        raise Rejected(f"cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not _plain(st):
            raise Rejected("not a plain file with one link")
        if st.st_uid != owner:
            raise Rejected(f"file owned by uid {st.st_uid}, not by the job's owner uid {owner}")
        if st.st_size > protocol.MAX_REPORT_BYTES:
            raise Rejected(f"{st.st_size} bytes, more than the limit {protocol.MAX_REPORT_BYTES}")
        raw = os.read(fd, protocol.MAX_REPORT_BYTES + 1)
        return raw, len(raw)
    finally:
        os.close(fd)


def private_folders(base: Path) -> None:
    """Make every folder directly in ``base`` (an archive's per-job folders) 0700."""
    with own_dir(base) as base_fd:
        for name in os.listdir(base_fd):
            with contextlib.suppress(OSError), dir_fd(name, at=base_fd) as fd:  # gone, no folder
                if os.fstat(fd).st_uid == os.geteuid():
                    os.fchmod(fd, 0o700)


def _names(fd: int) -> Iterator[str]:
    """Every name of the folder, one at a time (a huge inbox is not held in memory)."""
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                yield entry.name
    except OSError as exc:
        log.warning("inbox: cannot list a folder: %s", exc.strerror)


def _first_names(fd: int, looks: _Looks) -> list[str]:
    """The ``looks.per_folder`` names of a job folder that a drain reads first
    (:func:`_name_order`: junk, then reports by ``seq``), from at most ``looks.left`` names
    of its listing (each taken from it); nothing but the listing is read, and only those
    names are held. Taking the first names in the folder's own order instead would read a
    folder grown past the bound (a long controller outage) out of order, and an older
    report left for a later drain would fall below the ledger's kept window and be refused
    as a replay."""

    def listed(entries: Iterator[os.DirEntry[str]]) -> Iterator[str]:
        for entry in itertools.islice(entries, max(looks.left, 0)):
            looks.left -= 1
            yield entry.name

    try:
        with os.scandir(fd) as entries:
            return heapq.nsmallest(looks.per_folder, listed(entries), key=_name_order)
    except OSError as exc:
        log.warning("inbox: cannot list a folder: %s", exc.strerror)
        return []


def _name_order(name: str) -> tuple[int, str]:
    """A job folder's entry's place in :attr:`Item.order`: junk (no ``<seq>-<kind>.json``
    name) first, as -1, then the seq."""
    m = FILE.fullmatch(name)
    return (int(m.group(1)) if m else -1), name


def _listdir_path(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _lstat(name: str, fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None


def _plain(st: os.stat_result) -> bool:
    """A plain file of one link (no hard link of another file), as a report must be."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _stale(name: str, fd: int, before: float) -> bool:
    st = _lstat(name, fd)
    return st is not None and st.st_ctime < before
