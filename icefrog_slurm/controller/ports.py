"""The ports the controller works through, besides ``ClusterPort`` (icefrog_slurm.slurm.port).

Time, the store and the job's files are ports so that the simulator drives the very same
tick and reconcile with a simulated clock, cluster and store: nothing in the controller asks
whether it is simulated. The store port is three protocols: :class:`StorePort` opens
transactions and takes the lead, :class:`StoreTx` is what the controller reads and writes in
one transaction, :class:`Lease` is the lead it holds. Real adapters: :class:`SystemClock`,
``SqlStore``/``SqlStoreTx``/``SqlLease`` (icefrog_slurm.store, wired in by
icefrog_slurm.commands and icefrog_slurm.sim; the controller never imports them) and
:class:`FsJobFiles`.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from typing import Any, Protocol, runtime_checkable

from icefrog_slurm.controller.jobdir import UnsafeJobDir, open_job_dir
from icefrog_slurm.domain.records import (
    Allocation,
    Intent,
    JobRecord,
    NewIntent,
    RoundRecord,
    SlurmAction,
    StoreSnapshot,
)
from icefrog_slurm.protocol import Decision
from icefrog_slurm.runfiles import CHECKPOINT_MARKER, DECISION_FILE


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


@runtime_checkable
class DrainCounts(Protocol):
    """What one drain of the report inbox did, by outcome (the store's ``DrainResult``);
    the daemon hands it on to the metrics."""

    @property
    def accepted(self) -> int: ...

    @property
    def rejected(self) -> int: ...

    @property
    def duplicates(self) -> int: ...

    @property
    def deferred(self) -> int: ...


class Lease(Protocol):
    """The lead of the one active controller: a lock and an epoch (the fencing token).

    ``hold()`` wraps every tick: it proves the lock is still held and the epoch still ours,
    else raises :class:`~icefrog_slurm.errors.LostLead`; ``release()`` lets go of the lock."""

    @property
    def epoch(self) -> int: ...

    def hold(self) -> AbstractContextManager[None]: ...

    def release(self) -> None: ...


class StoreTx(Protocol):
    """What the controller reads and writes inside one store transaction; every method
    returns immutable domain records, and only the store commits."""

    def snapshot(
        self,
        *,
        include_finished: bool = False,
        measurements: bool | Callable[[RoundRecord | None], bool] = True,
    ) -> StoreSnapshot: ...

    def job(self, job_id: int) -> JobRecord: ...

    def set_state(self, *, job_id: int, state: str, now: float) -> None: ...

    def link_slurm_job(
        self, *, job_id: int, slurm_job_id: str, reason: str, now: float
    ) -> None: ...

    def round(self, round_no: int | None = None) -> RoundRecord | None: ...

    def record_round(
        self,
        *,
        round_no: int,
        now: float,
        policy: str,
        capacity_gpus: int,
        allocations: Sequence[Allocation],
        solve_s: float | None = None,
        min_share: float | None = None,
        reasons: Mapping[int, str] | None = None,
    ) -> None: ...

    def add_intent(
        self,
        *,
        action: str,
        params: Mapping[str, Any],
        now: float,
        job_id: int | None = None,
        round_no: int | None = None,
        supersede: bool = True,
    ) -> int: ...

    def add_intents(
        self, *, intents: Sequence[NewIntent], now: float, round_no: int | None = None
    ) -> None: ...

    def start_intent(self, *, intent_id: int, now: float) -> Intent: ...

    def finish_intent(
        self, *, intent_id: int, status: str, now: float, detail: str = ""
    ) -> None: ...

    def open_intents(self) -> list[Intent]: ...

    def log_action(
        self,
        *,
        action: str,
        command: Sequence[str],
        outcome: str,
        now: float,
        duration_s: float,
        rc: int | None = None,
        detail: str = "",
        slurm_job_id: str | None = None,
        job_id: int | None = None,
        intent_id: int | None = None,
    ) -> int: ...

    def actions(
        self, *, job_id: int | None = None, intent_id: int | None = None
    ) -> list[SlurmAction]: ...


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
