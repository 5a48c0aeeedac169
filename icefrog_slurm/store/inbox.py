"""The report inbox: untrusted reports from users' jobs, checked, then moved into the store.

A job (or ``icefrog submit``, for ``register``) writes each report as
``<inbox>/<job folder>/<seq>-<kind>.json`` (written under a name starting with ``.`` and
renamed, so a half-written file is never read). The job folder is ``<slurm_job_id>``, or
``<slurm_job_id>.<random token>`` when another user took that name first
(``security.job_folder``); the drain reads every folder of a job, merged in ``seq`` order.
The inbox is mode 1733 like /tmp: anyone can drop, nobody can list or read another user's
files. The controller, as root, accepts a report only if all of these hold, in this order,
and rejects it otherwise with a logged and recorded reason, changing nothing else:

1. its folder is owned by the job's owner (or root) and it is a regular file (no symlink,
   FIFO or hard link), at most ``MAX_REPORT_BYTES``, owned by the job's owner;
2. ``protocol.parse_envelope`` accepts it (schema, size and range limits: every value fits
   its column on SQLite and Postgres), its ``slurm_job_id`` is its folder's and its file
   name is ``<seq>-<kind>.json``;
3. its munge credential decodes (``unmunge``) to that same owner uid and to
   ``body_digest(envelope.body())``, so it was made by the owner for exactly this content;
4. the Slurm job is bound to an icefrog job of that owner and name, or, for ``register``,
   to none yet, Slurm says it carries the icefrog tag (its comment starts ``icefrog:``) and
   it is pending held (``icefrog submit`` registers its job before releasing it; a job
   running unheld, a plain ``sbatch`` with a hand-written tag, stays unmanaged): a new
   icefrog job is created, owned by that uid;
5. (Slurm job, seq) was not accepted before with other content, and is not older than the
   ledger's kept reports of that Slurm job (``ledger.KEPT_REPORTS``, its latest). The same
   content again is a duplicate: it is archived and changes nothing.

Owners come from one batched lookup a drain (``slurm_jobs``: the Slurm backend's poll; the
module ``inbox_apply`` applies what is accepted), for the folders of the files the drain
reads and, in turns, up to 1000 folders with nothing to read (one call a drain, whatever
the number of ids: the backends read all of Slurm's jobs each call, one ``squeue --json``,
and keep those asked for); a
job Slurm has forgotten falls back to the owner the store recorded at register. Every
report read, a plain file of at most ``MAX_REPORT_BYTES``, is moved to
``<archive>/accepted|rejected/<job id>/``; anything else (no plain file, larger, an entry
that is no job folder, a claimed folder) is deleted, and so is a report whose move fails:
nothing is ever processed twice, and no user's junk is kept in the archive. All file
operations go through directory file descriptors with ``O_NOFOLLOW`` (``inbox_files``).
Each log line about a report starts ``job=<icefrog job id> slurm_job=<Slurm job id>:`` (as
far as they are known), and :meth:`ReportInbox.drain` returns the counts by outcome (the
controller's metrics).

Guarantees:

- **A drain cannot be stopped by a report.** Each file is handled under one catch-all:
  anything but a transient fault (below) quarantines it, rejected with a reason made
  printable (``jsonio.printable``) before it is logged or stored, and the drain goes
  on. An owner's first :data:`LOGGED_REJECTIONS` rejections a drain (claimed folders
  included) are logged one by one, the rest in one line. A job folder's name is a Slurm
  job id by regex (ASCII digits, no leading zero, below 2^31: squeue refuses more, failing
  the whole lookup); anything else,
  a name that is not UTF-8 included, is junk, rejected and deleted whole.
- **A transient fault loses nothing.** Slurm's lookup failing, the database unreachable
  (``OperationalError``, ``InterfaceError``, a dropped connection) or munged unreachable
  leaves the files in the inbox for a later drain. munged is judged unreachable only when a
  fresh credential of our own fails too (``security.munged_answers``); then it is asked
  again after ``munge_retry_s``, doubling up to 20 times that. Three transient database
  faults in a row end the drain.
- **A claimed folder blocks nobody.** A folder owned by anyone but the job's owner (or
  root) is logged naming the squatter (uid and user name); the files the drain reads in it
  are rejected, then it is deleted whole, with what the drain did not read (dot files,
  whatever their dates), and the job side writes to a token folder instead.
- **Fair and bounded.** At most ``max_reports_per_owner`` files of each folder owner a
  drain, taken in turns across owners, ``max_reports`` in all. An emptied folder is removed
  ``folder_grace_s`` after its last change once its job has ended (or nobody knows it).
  Archived files and ledger rows older than ``retention_days`` are pruned once an hour.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from icefrog_slurm import protocol, security
from icefrog_slurm.domain.records import ACTIVE_STATES
from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import InboxSettings
from icefrog_slurm.store import inbox_files as files
from icefrog_slurm.store.inbox_apply import Claim, apply_report, user_name
from icefrog_slurm.store.inbox_files import Folder, Item, Rejected
from icefrog_slurm.store.ledger import MAX_DETAIL
from icefrog_slurm.store.sql import SqlStore, transient_db_fault

log = logging.getLogger(__name__)

_MAX_TRANSIENT_IN_A_ROW = 3
_PRUNE_EVERY_S = 3600.0
_IDLE_FOLDERS_A_DRAIN = 1000  # folders with nothing to read looked up a drain
LOGGED_REJECTIONS = 20
"""Rejected entries and claimed folders of one owner a drain logged one by one; the rest
are counted in one line (each entry is still recorded and taken out): a user's junk cannot
flood the journal."""


@dataclass(frozen=True)
class SlurmJobFacts:
    """What Slurm says of a job: its owner's uid, whether it carries the icefrog tag, whether
    it is pending held (True where a stand-in lookup does not say) and whether it is an
    array or heterogeneous job (``SlurmJobState.compound``)."""

    uid: int
    icefrog: bool
    held: bool = True
    compound: bool = False


SlurmJobsLookup = Callable[[Collection[str]], Mapping[str, SlurmJobFacts]]
"""Slurm job ids -> facts of those Slurm knows (one batched call; raises when Slurm is down)."""


class _PolledJob(Protocol):
    @property
    def user_id(self) -> int: ...
    @property
    def is_icefrog(self) -> bool: ...
    @property
    def held(self) -> bool: ...
    @property
    def compound(self) -> bool: ...


class _Polls(Protocol):
    def poll(self, *, job_ids: Collection[str]) -> Mapping[str, _PolledJob]: ...


def slurm_jobs_of(cluster: _Polls) -> SlurmJobsLookup:
    """The lookup as one batched poll of a cluster port (``ClusterPort.poll``: squeue)."""

    def lookup(job_ids: Collection[str]) -> dict[str, SlurmJobFacts]:
        polled = cluster.poll(job_ids=job_ids)
        return {
            k: SlurmJobFacts(uid=j.user_id, icefrog=j.is_icefrog, held=j.held, compound=j.compound)
            for k, j in polled.items()
        }

    return lookup


class _Deferred(Exception):
    """A transient fault: the report stays in the inbox for a later drain."""


@dataclass(frozen=True)
class DrainResult:
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    deferred: int = 0  # left in the inbox by a transient fault


@dataclass(frozen=True)
class _Owner:
    """Who owns a Slurm job, by Slurm or else by the store (uid None: nobody knows it)."""

    uid: int | None
    icefrog: bool  # Slurm shows the icefrog tag
    held: bool  # Slurm shows it pending held
    ended: bool  # the store says it ended, or nobody knows it
    compound: bool = False  # an array or heterogeneous job


class ReportInbox:
    """Reads the inbox folder and moves valid reports into the store."""

    def __init__(
        self,
        *,
        store: SqlStore,
        inbox_dir: str | Path,
        archive_dir: str | Path,
        slurm_jobs: SlurmJobsLookup,
        munge_socket: str | None = None,
        decode: Callable[[str], security.DecodedCredential] | None = None,
        clock: Callable[[], float] = time.time,
        max_reports: int = 10000,
        max_reports_per_owner: int = 1000,
        munge_retry_s: float = 30.0,
        folder_grace_s: float = 86400.0,
        retention_days: float = 30.0,
    ) -> None:
        self.store = store
        self.inbox_dir = Path(inbox_dir)
        self.archive_dir = Path(archive_dir)
        self.slurm_jobs = slurm_jobs
        self.decode = decode or partial(security.decode, socket=munge_socket)
        self.munged_answers = partial(security.munged_answers, socket=munge_socket)
        self.clock = clock
        self.max_reports = max_reports
        self.max_reports_per_owner = max_reports_per_owner
        self.munge_retry_s = munge_retry_s
        self.folder_grace_s = folder_grace_s
        self.retention_s = retention_days * 86400.0
        self._munge_wait_s = munge_retry_s
        self._munge_retry_at: float | None = None
        self._pruned_at: float | None = None
        self._db_fault = False  # the last file waits because the store failed
        self._idle_cursor = 0
        self._turns: dict[int, str] = {}  # where each owner's folders are looked into next
        self._rejected_by = Counter[int]()  # this drain's rejected entries, by owner uid

    @classmethod
    def from_settings(
        cls, settings: InboxSettings, *, store: SqlStore, slurm_jobs: SlurmJobsLookup
    ) -> ReportInbox:
        """The daemon's inbox, as the ``[inbox]`` settings say."""
        return cls(
            store=store,
            inbox_dir=settings.dir,
            archive_dir=settings.archive_dir,
            slurm_jobs=slurm_jobs,
            munge_socket=settings.munge_socket,
            max_reports=settings.max_reports_per_drain,
            max_reports_per_owner=settings.max_reports_per_owner,
            munge_retry_s=settings.munge_retry_s,
            folder_grace_s=settings.folder_grace_s,
            retention_days=settings.retention_days,
        )

    def prepare(self) -> None:
        """Create the inbox (1733: drop-only, like /tmp) and the root-only archive: every
        folder of it 0700, also those an earlier version made 0755 (a junk folder moved in
        from the inbox is its owner's: from inside it, its owner must reach nothing else).
        Each mode is set on a descriptor (``inbox_files.own_dir``): a symbolic link or
        another uid's folder at one of these paths is refused (InputError), never followed."""
        modes = {self.inbox_dir: 0o1733, self.archive_dir: 0o700}
        modes.update({self.archive_dir / sub: 0o700 for sub in ("accepted", "rejected")})
        for folder, mode in modes.items():
            try:
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                with files.own_dir(folder) as fd:
                    os.fchmod(fd, mode)
                if folder.parent == self.archive_dir:
                    files.private_folders(folder)
            except OSError as exc:
                raise InputError(f"{printable(str(folder), 300)}: {exc.strerror}") from None

    def drain(self) -> DrainResult:
        """Process what is in the inbox now (a fair share of it, see the module docstring)."""
        counts: Counter[str] = Counter()
        now = self.clock()
        self._rejected_by = Counter[int]()
        with files.own_dir(self.inbox_dir) as inbox_fd:
            found = files.scan(
                inbox_fd,
                stale_before=now - self.folder_grace_s,
                per_owner=self.max_reports_per_owner,
                turns=self._turns,
            )
            self._turns = found.turns
            plan = files.fair_order(
                found.items, per_owner=self.max_reports_per_owner, total=self.max_reports
            )
            folders = self._folders_to_check(found.folders, plan)
            try:
                owners = self._owners({f.job_id for f in folders})
            except Exception as exc:  # Slurm or the store is down: everything waits
                log.warning("inbox: job owners unknown for now, reports wait: %s", _why(exc))
                return DrainResult(deferred=len(plan))
            self._warn_squatters(folders, owners)
            in_a_row = 0
            for item in plan:
                outcome = self._one(inbox_fd, item, owners)
                counts[outcome] += 1
                in_a_row = in_a_row + 1 if outcome == "deferred" and self._db_fault else 0
                if in_a_row >= _MAX_TRANSIENT_IN_A_ROW:
                    log.warning("inbox: the store keeps failing; the drain stops here")
                    break
            self._remove_folders(inbox_fd, folders, owners)
        for uid, n in sorted(self._rejected_by.items()):
            if n > LOGGED_REJECTIONS:
                log.warning(
                    "inbox: %d more reports or claimed folders of uid %d rejected this drain "
                    "(not logged one by one; each report is recorded)", n - LOGGED_REJECTIONS, uid,
                )  # fmt: skip
        self._prune(now)
        return DrainResult(
            counts["accepted"], counts["rejected"], counts["duplicate"], counts["deferred"]
        )

    # ----- owners ------------------------------------------------------------------------
    def _folders_to_check(self, folders: tuple[Folder, ...], plan: list[Item]) -> list[Folder]:
        """The folders this drain looks up: those of the planned files, and, in turns over
        the drains, up to ``_IDLE_FOLDERS_A_DRAIN`` folders with nothing planned (to remove
        them once their job ended). So the lookup stays bounded however many folders users
        make."""
        planned = {i.folder.name for i in plan if i.folder is not None}
        idle = [f for f in folders if f.name not in planned]
        start = self._idle_cursor % len(idle) if idle else 0
        window = (idle[start:] + idle[:start])[:_IDLE_FOLDERS_A_DRAIN]
        self._idle_cursor = start + len(window)
        return [f for f in folders if f.name in planned] + window

    def _owners(self, job_ids: set[str]) -> dict[str, _Owner]:
        if not job_ids:
            return {}
        facts = self.slurm_jobs(job_ids)  # one call: each reads all of Slurm's jobs
        with self.store.transaction() as tx:
            recorded = tx.slurm_job_owners(slurm_job_ids=job_ids)
        owners = {}
        for job_id in job_ids:
            fact, rec = facts.get(job_id), recorded.get(job_id)
            uid = fact.uid if fact is not None else (None if rec is None else rec[0])
            ended = rec[1] not in ACTIVE_STATES if rec is not None else fact is None
            icefrog, held = (False, False) if fact is None else (fact.icefrog, fact.held)
            compound = fact is not None and fact.compound
            owners[job_id] = _Owner(uid, icefrog, held, ended, compound)
        return owners

    def _warn_squatters(self, folders: list[Folder], owners: dict[str, _Owner]) -> None:
        for f in folders:
            owner = owners[f.job_id].uid
            if owner is not None and f.uid not in (owner, 0):
                self._log_rejection(
                    f.uid,
                    "slurm_job=%s: inbox: folder %s is held by uid %d (%s), not by uid %d who "
                    "owns Slurm job %s: its files are rejected and the folder deleted",
                    f.job_id, f.name, f.uid, printable(user_name(f.uid)), owner, f.job_id,
                )  # fmt: skip

    def _remove_folders(
        self, inbox_fd: int, folders: list[Folder], owners: dict[str, _Owner]
    ) -> None:
        """Delete claimed folders whole (what a drain does not read in them, dot files
        included, would keep them for ever); remove the emptied folders of ended jobs after
        the grace."""
        grace_end = self.clock() - self.folder_grace_s
        for f in folders:
            owner = owners[f.job_id]
            if owner.uid is not None and f.uid not in (owner.uid, 0):
                target = self.archive_dir / "rejected" / f.job_id
                files.discard_folder(inbox_fd, f, target, now=self.clock())
            elif owner.ended:
                files.remove_folder(inbox_fd, f, modified_before=grace_end)

    # ----- one file ----------------------------------------------------------------------
    def _one(self, inbox_fd: int, item: Item, owners: dict[str, _Owner]) -> str:
        """Read, judge and archive one entry; never raises."""
        self._db_fault = False
        try:
            return self._judge(inbox_fd, item, owners)
        except Exception as exc:  # a fault outside any report's reach: try again next drain
            log.error("%sinbox: %s waits: %s", _fields(None, item), item.where, _why(exc))
            return "deferred"

    def _judge(self, inbox_fd: int, item: Item, owners: dict[str, _Owner]) -> str:
        now = self.clock()
        size, claim, job_id = 0, None, None
        try:
            if item.folder is None:
                self._quarantine(inbox_fd, item, "not a job folder: <job id>[.<token>]", 0, None)
                return "rejected"
            owner = owners[item.folder.job_id]
            with files.open_folder(inbox_fd, item.folder) as job_fd:
                try:
                    raw, size = self._read(job_fd, item, owner)
                    claim = self._check(raw, item, owner, now)
                    with self.store.transaction() as tx:
                        outcome, job_id = apply_report(
                            tx,
                            claim,
                            icefrog=owner.icefrog,
                            held=owner.held,
                            compound=owner.compound,
                            now=now,
                        )
                except Rejected as exc:
                    self._quarantine(job_fd, item, str(exc), size, claim)
                    return "rejected"
                except _Deferred:
                    return "deferred"
                except OSError as exc:
                    if exc.errno not in files.TRANSIENT_ERRNOS:
                        self._quarantine(job_fd, item, f"cannot be read: {_why(exc)}", size, claim)
                        return "rejected"
                    log.warning(
                        "%sinbox: %s waits, reading it failed: %s",
                        _fields(None, item), item.where, _why(exc),
                    )  # fmt: skip
                    return "deferred"
                except Exception as exc:
                    if transient_db_fault(exc):
                        self._db_fault = True
                        log.warning(
                            "%sinbox: %s waits, the store failed: %s",
                            _fields(None, item), item.where, _why(exc),
                        )  # fmt: skip
                        return "deferred"
                    self._quarantine(job_fd, item, f"cannot be handled: {_why(exc)}", size, claim)
                    return "rejected"
                self._move(job_fd, item, "rejected" if outcome == "rejected" else "accepted")
        except _Deferred:
            return "deferred"
        except OSError as exc:  # the folder was swapped or removed since the scan
            log.warning("%sinbox: %s skipped: %s", _fields(None, item), item.where, exc.strerror)
            return "deferred"
        if outcome == "accepted":
            log.info(
                "%sreport %s accepted (uid %s)",
                _fields(job_id, item), item.where, claim.uid if claim else "?",
            )  # fmt: skip
        return outcome

    def _read(self, job_fd: int, item: Item, owner: _Owner) -> tuple[bytes, int]:
        assert item.folder is not None
        if owner.uid is None:
            raise Rejected(f"Slurm job {item.folder.job_id} is unknown to Slurm and to icefrog")
        if item.folder.uid not in (owner.uid, 0):
            raise Rejected(
                f"folder {item.folder.name} is held by uid {item.folder.uid} "
                f"({user_name(item.folder.uid)}), not by the job's owner uid {owner.uid}"
            )
        return files.read_report(job_fd, item.name, owner.uid)

    def _check(self, raw: bytes, item: Item, owner: _Owner, now: float) -> Claim:
        assert item.folder is not None and owner.uid is not None
        try:
            env = protocol.parse_envelope(raw)
        except IcefrogError as exc:
            raise Rejected(f"invalid report: {exc}") from None
        if env.slurm_job_id != item.folder.job_id:
            raise Rejected(f"report for Slurm job {env.slurm_job_id} in folder {item.folder.name}")
        if item.name != f"{env.seq}-{env.kind}.json":
            raise Rejected(
                f"file name {item.name!r} does not match seq {env.seq} and kind {env.kind}"
            )
        cred = self._decode(env.credential, now)
        digest = protocol.body_digest(env.body())
        if cred.payload != digest:
            raise Rejected("munge credential signs other content (digest mismatch)")
        if cred.uid != owner.uid:
            raise Rejected(
                f"credential made by uid {cred.uid}; Slurm job {env.slurm_job_id} belongs to "
                f"uid {owner.uid}"
            )
        return Claim(envelope=env, uid=cred.uid, digest=digest, munge_status=cred.status)

    def _decode(self, credential: str, now: float) -> security.DecodedCredential:
        """The decoded credential; _Deferred while munged is unreachable (and backing off).
        A credential munged failed on while it answers a fresh one is asked about once more
        (a fault of a moment, a restart or a timeout under load, must not reject an honest
        report); failing again, the credential is at fault and the report is rejected."""
        if self._munge_retry_at is not None and now < self._munge_retry_at:
            raise _Deferred
        for attempt in (1, 2):
            try:
                cred = self.decode(credential)
                break
            except security.MungeUnavailable as exc:
                if self.munged_answers():
                    if attempt == 2:  # munged works: this credential made it fail twice
                        raise Rejected(f"credential: {exc}") from None
                    continue
                self._munge_retry_at = now + self._munge_wait_s
                log.warning(
                    "inbox: munged unreachable (%s); reports wait, next try in %g s",
                    printable(str(exc), 300), self._munge_wait_s,
                )  # fmt: skip
                self._munge_wait_s = min(2 * self._munge_wait_s, 20 * self.munge_retry_s)
                raise _Deferred from None
            except security.MungeError as exc:
                raise Rejected(str(exc)) from None
        self._munge_retry_at, self._munge_wait_s = None, self.munge_retry_s
        return cred

    # ----- quarantine and archive --------------------------------------------------------
    def _quarantine(
        self, src_fd: int, item: Item, reason: str, size: int, claim: Claim | None
    ) -> None:
        """Record the rejection (a transient store fault defers it) and take the entry out of
        the inbox (:meth:`_move`)."""
        reason = printable(reason, MAX_DETAIL)
        env = None if claim is None else claim.envelope
        uid = None if claim is None or claim.uid > protocol.INT32_MAX else claim.uid
        job_id = None
        try:
            with self.store.transaction() as tx:
                if item.folder is not None:  # whose report it was, for the log line
                    job = tx.job_by_slurm_id(item.folder.job_id)
                    job_id = None if job is None else job.id
                tx.record_rejected(
                    file=item.where,
                    reason=reason,
                    size=size,
                    now=self.clock(),
                    slurm_job_id=None if item.folder is None else item.folder.job_id,
                    seq=None if env is None else env.seq,
                    uid=uid,
                )
        except Exception as exc:
            if transient_db_fault(exc):
                self._db_fault = True
                log.warning(
                    "%sinbox: %s waits, the store failed: %s (to be rejected: %s)",
                    _fields(None, item), item.where, _why(exc), reason,
                )  # fmt: skip
                raise _Deferred from None
            log.error("inbox: rejection of %s not recorded: %s", item.where, _why(exc))
        self._log_rejection(
            item.uid, "%sreport %s rejected: %s", _fields(job_id, item), item.where, reason
        )
        self._move(src_fd, item, "rejected")

    def _log_rejection(self, uid: int, message: str, *args: object) -> None:
        """Log a rejected entry or a claimed folder of ``uid``: its first
        :data:`LOGGED_REJECTIONS` of a drain one by one, the rest in one line at its end."""
        self._rejected_by[uid] += 1
        if self._rejected_by[uid] <= LOGGED_REJECTIONS:
            log.warning(message, *args)

    def _move(self, src_fd: int, item: Item, outcome: str) -> None:
        """Archive the entry if it is a report of a job folder, else delete it
        (``inbox_files.archive``)."""
        folder = files.JUNK_FOLDER if item.folder is None else item.folder.job_id
        target = self.archive_dir / outcome / folder
        files.archive(src_fd, item.name, target, now=self.clock(), keep=item.folder is not None)

    def _prune(self, now: float) -> None:
        """Delete archived files and ledger rows older than the retention, once an hour."""
        if self._pruned_at is not None and now - self._pruned_at < _PRUNE_EVERY_S:
            return
        self._pruned_at = now
        before = now - self.retention_s
        try:
            with self.store.transaction() as tx:
                rows = tx.prune_reports(before=before)
            count = files.prune_archive(self.archive_dir, before=before)
        except Exception as exc:  # the next hour tries again
            log.warning("inbox: pruning failed: %s", _why(exc))
            return
        if rows or count:
            log.info("inbox: pruned %d ledger rows and %d archived files", rows, count)


def _fields(job_id: int | None, item: Item) -> str:
    """``job=<icefrog job> slurm_job=<Slurm job>: `` as far as they are known, at the head
    of a line about a report, so ``grep -w job=<id>`` finds it (the Slurm job id is its
    folder's, ASCII digits by the folder pattern)."""
    fields = [] if job_id is None else [f"job={job_id}"]
    if item.folder is not None:
        fields.append(f"slurm_job={item.folder.job_id}")
    return " ".join(fields) + ": " if fields else ""


def _why(exc: BaseException) -> str:
    return printable(f"{type(exc).__name__}: {exc}", 500)
