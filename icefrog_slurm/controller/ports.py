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
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from icefrog_slurm.protocol import Decision
from icefrog_slurm.store.leader import Lease
from icefrog_slurm.store.records import StoreSnapshot
from icefrog_slurm.store.tx import StoreTx

DECISION_FILE = "decision.json"
CHECKPOINT_MARKER = "checkpointed"
"""A job asked to checkpoint (USR1) writes this file in its run dir once its checkpoint is
safe; the controller then requeues it (a job that exits after checkpointing needs no marker)."""


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
    """The files the controller shares with a job in its run dir."""

    def write_decision(self, *, run_dir: str, decision: Decision, owner_uid: int) -> None:
        """Replace ``<run_dir>/decision.json`` atomically."""
        ...

    def checkpoint_marked(self, *, run_dir: str, since: float) -> bool:
        """Whether the job wrote its checkpoint marker at or after ``since``."""
        ...


class FsJobFiles:
    """Job files on the (shared) filesystem, written safely into a user-owned folder.

    The folder is opened without following symlinks and the file is created there under a
    fresh temporary name (O_EXCL | O_NOFOLLOW), given to the job's owner when we are root,
    and renamed over ``decision.json``: a job never reads half a decision, and a user
    cannot redirect the controller's write elsewhere with a symlink.
    """

    def write_decision(self, *, run_dir: str, decision: Decision, owner_uid: int) -> None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
        dir_fd = os.open(run_dir, flags)
        try:
            tmp = f".{DECISION_FILE}.{os.getpid()}.{time.time_ns()}"
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=dir_fd,
            )
            try:
                os.write(fd, (decision.to_json() + "\n").encode())
                os.fsync(fd)
                if os.geteuid() == 0 and owner_uid != 0:
                    os.fchown(fd, owner_uid, -1)
            finally:
                os.close(fd)
            os.rename(tmp, DECISION_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    def checkpoint_marked(self, *, run_dir: str, since: float) -> bool:
        try:
            st = os.lstat(Path(run_dir) / CHECKPOINT_MARKER)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_mtime >= since - 1.0
