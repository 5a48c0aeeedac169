"""The ports the controller works through, besides ``ClusterPort`` (icefrog_slurm.slurm.port).

Time, the store and the job's files are ports so that the simulator drives the very same
tick and reconcile with a simulated clock, cluster and store: nothing in the controller asks
whether it is simulated. Real adapters: :class:`SystemClock`, ``SqlStore``
(icefrog_slurm.store) and :class:`FsJobFiles`.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from typing import Protocol

from icefrog_slurm.controller.jobdir import UnsafeJobDir, open_job_dir
from icefrog_slurm.domain.records import StoreSnapshot
from icefrog_slurm.protocol import Decision
from icefrog_slurm.runfiles import CHECKPOINT_MARKER, DECISION_FILE
from icefrog_slurm.store.leader import Lease
from icefrog_slurm.store.tx import StoreTx


class Clock(Protocol):
    """Wall time in seconds since the epoch, and waiting."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class StorePort(Protocol):
    """What the controller asks of the state store (``SqlStore`` implements it)."""

    def transaction(self, *, consistent: bool = False) -> AbstractContextManager[StoreTx]: ...

    def snapshot(self, *, include_finished: bool = False) -> StoreSnapshot: ...

    def try_lead(self) -> Lease | None:
        """Take the lead (a lease whose epoch every later write transaction checks), or None
        while another controller holds it."""
        ...


class JobFiles(Protocol):
    """The files the controller shares with a job in its run dir (the job owner's folder)."""

    def write_decision(self, *, run_dir: str, decision: Decision, owner_uid: int) -> None:
        """Replace ``<run_dir>/decision.json`` atomically; raise ``UnsafeJobDir`` when the
        folder is not one the controller may write in for ``owner_uid``."""
        ...

    def checkpoint_marked(self, *, run_dir: str, since: float, owner_uid: int) -> bool:
        """Whether the job wrote its checkpoint marker at or after ``since``."""
        ...


class FsJobFiles:
    """Job files on the (shared) filesystem, in the job owner's own folder.

    The folder is opened by :func:`~icefrog_slurm.controller.jobdir.open_job_dir` (from ``/``,
    no symlink followed at any level, every component owned by the job's owner or root and
    writable by nobody else) and everything after goes through its descriptor. The decision
    is written to ``.decision.json.tmp`` (created exclusively, no symlink followed; one a
    killed write left is removed first), given to the job's owner when we are root, and
    renamed over ``decision.json``: a job never reads half a decision. A failed write leaves
    no temporary file. ``after_step`` is called with ``"decision:temp"`` once the temporary
    file is complete, before the rename (tests kill the process there).
    """

    def __init__(self, *, after_step: Callable[[str], None] | None = None) -> None:
        self.after_step = after_step or (lambda _what: None)

    def write_decision(self, *, run_dir: str, decision: Decision, owner_uid: int) -> None:
        dir_fd = open_job_dir(run_dir, owner_uid=owner_uid)
        try:
            data = (decision.to_json() + "\n").encode()
            self._replace(dir_fd, DECISION_FILE, data, owner_uid)
        finally:
            os.close(dir_fd)

    def _replace(self, dir_fd: int, name: str, data: bytes, owner_uid: int) -> None:
        tmp = f".{name}.tmp"
        _unlink(tmp, dir_fd)
        fd = os.open(tmp, _NEW_FILE, 0o644, dir_fd=dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                if os.geteuid() == 0 and owner_uid != 0:
                    os.fchown(fd, owner_uid, -1)
            finally:
                os.close(fd)
            self.after_step("decision:temp")
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            _unlink(tmp, dir_fd)
            raise
        os.fsync(dir_fd)

    def checkpoint_marked(self, *, run_dir: str, since: float, owner_uid: int) -> bool:
        try:
            dir_fd = open_job_dir(run_dir, owner_uid=owner_uid)
        except (OSError, UnsafeJobDir):
            return False  # (the decision write records why the folder is refused)
        try:
            st = os.stat(CHECKPOINT_MARKER, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return False
        finally:
            os.close(dir_fd)
        return stat.S_ISREG(st.st_mode) and st.st_mtime >= since - 1.0


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _unlink(name: str, dir_fd: int) -> None:
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
