"""The report inbox: untrusted reports from users' jobs, checked, then moved into the store.

A job (or ``icefrog submit``, for ``register``) writes each report as
``<inbox>/<slurm_job_id>/<seq>-<kind>.json`` (written under a name starting with ``.`` and
renamed, so a half-written file is never read). The inbox is mode 1733 like /tmp: anyone
can drop, nobody can list or read another user's files. The controller, as root, accepts a
report only if all of these hold, in this order, and rejects it otherwise with a logged and
recorded reason, changing nothing else:

1. it is a regular file (no symlink, FIFO or hard link), at most ``MAX_REPORT_BYTES``, owned
   by the uid that owns the Slurm job named by its folder;
2. ``protocol.parse_envelope`` accepts it (schema, size limits), its ``slurm_job_id`` is its
   folder's and its file name is ``<seq>-<kind>.json``;
3. its munge credential decodes (``unmunge``) to that same owner uid and to
   ``body_digest(envelope.body())``, so it was made by the owner for exactly this content;
4. the Slurm job is bound to an icefrog job of that owner and name (or, for ``register``,
   to none yet: a new icefrog job is created, owned by that uid);
5. (Slurm job, seq) was not accepted before with other content. The same content again is
   a duplicate: it is archived and changes nothing.

The owner of a Slurm job comes from ``owner_of`` (the Slurm backend: ``squeue``/``scontrol``);
when Slurm has forgotten a finished job, the owner recorded when the job registered is used.
Every file read is moved to ``<archive>/accepted|rejected/<slurm_job_id>/``; if a move fails
the file is deleted, so nothing is ever processed twice. All file operations go through
directory file descriptors with ``O_NOFOLLOW``: users own the per-job folders and could swap
a folder for a symlink.
"""

from __future__ import annotations

import errno
import logging
import os
import pwd
import re
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icefrog_slurm import protocol, security
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.store.sql import SqlStore
from icefrog_slurm.store.tx import StoreTx

log = logging.getLogger(__name__)

OwnerLookup = Callable[[str], "int | None"]
"""Slurm job id -> uid of its owner, or None when Slurm does not know the job."""

_FILE_NAME = re.compile(r"^(\d{1,18})-([a-z_]{1,32})\.json$")
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Rejected(IcefrogError):
    """A report failed a check; the message is the recorded reason."""


@dataclass(frozen=True)
class DrainResult:
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0


@dataclass(frozen=True)
class _Claim:
    """What a checked report proves: who sent what for which Slurm job."""

    envelope: protocol.Envelope
    uid: int
    digest: str
    munge_status: int


class ReportInbox:
    """Reads the inbox folder and moves valid reports into the store."""

    def __init__(
        self,
        *,
        store: SqlStore,
        inbox_dir: str | Path,
        archive_dir: str | Path,
        owner_of: OwnerLookup,
        decode: Callable[[str], security.DecodedCredential] = security.decode,
        clock: Callable[[], float] = time.time,
        max_reports: int = 10000,
    ) -> None:
        self.store = store
        self.inbox_dir = Path(inbox_dir)
        self.archive_dir = Path(archive_dir)
        self.owner_of = owner_of
        self.decode = decode
        self.clock = clock
        self.max_reports = max_reports

    def prepare(self) -> None:
        """Create the inbox (1733: drop-only, like /tmp) and the root-only archive."""
        self.inbox_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.inbox_dir, 0o1733)
        for sub in ("accepted", "rejected"):
            (self.archive_dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.archive_dir, 0o700)

    def drain(self) -> DrainResult:
        """Process what is in the inbox now (at most ``max_reports`` files)."""
        counts: Counter[str] = Counter()
        with _dir_fd(self.inbox_dir, follow=True) as inbox_fd:
            for folder in sorted(os.listdir(inbox_fd), key=_numeric_key):
                if counts.total() >= self.max_reports:
                    break
                if not folder.isdigit() or len(folder) > 18:
                    continue  # not a job folder: nothing of ours
                try:
                    owner: int | Rejected = self._owner(folder)
                except Rejected as exc:
                    owner = exc  # every file in the folder is rejected with this reason
                except Exception as exc:  # the Slurm lookup failed: leave it for next pass
                    log.warning("inbox: owner of Slurm job %s unknown for now: %s", folder, exc)
                    continue
                try:
                    with _dir_fd(folder, dir_fd=inbox_fd) as job_fd:
                        self._folder(job_fd, folder, owner, counts)
                except OSError as exc:  # e.g. a symlink in place of the folder
                    log.warning("inbox: skipping %s: %s", folder, exc)
        return DrainResult(counts["accepted"], counts["rejected"], counts["duplicate"])

    def _folder(
        self, job_fd: int, folder: str, owner: int | Rejected, counts: Counter[str]
    ) -> None:
        for name in sorted(os.listdir(job_fd), key=_numeric_key):
            if counts.total() >= self.max_reports:
                return
            if not name.startswith("."):  # a dot file is still being written
                counts[self._one(job_fd, folder, name, owner)] += 1

    # ----- one file ----------------------------------------------------------------------
    def _one(self, job_fd: int, folder: str, name: str, owner: int | Rejected) -> str:
        now = self.clock()
        where = f"{folder}/{name}"
        size, claim, outcome = 0, None, "rejected"
        try:
            if isinstance(owner, Rejected):
                raise owner
            raw, size = _read_report(job_fd, name, owner)
            claim = self._check(raw, folder, name, owner)
            with self.store.transaction() as tx:
                outcome = self._apply(tx, claim, now)
        except Rejected as exc:
            self._reject(where, str(exc), size, claim, now)
        self._archive(job_fd, folder, name, "rejected" if outcome == "rejected" else "accepted")
        if outcome == "accepted":
            log.info("report %s accepted (uid %s)", where, claim.uid if claim else "?")
        return outcome

    def _owner(self, folder: str) -> int:
        uid = self.owner_of(folder)
        if uid is None:
            with self.store.transaction() as tx:
                job = tx.job_by_slurm_id(folder)
            uid = None if job is None else job.owner_uid
        if uid is None:
            raise Rejected(f"Slurm job {folder} is unknown to Slurm and to icefrog")
        return uid

    def _check(self, raw: bytes, folder: str, name: str, owner: int) -> _Claim:
        try:
            env = protocol.parse_envelope(raw)
        except IcefrogError as exc:
            raise Rejected(f"invalid report: {exc}") from None
        if env.slurm_job_id != folder:
            raise Rejected(f"report for Slurm job {env.slurm_job_id} in folder {folder}")
        if name != f"{env.seq}-{env.kind}.json":
            raise Rejected(f"file name {name!r} does not match seq {env.seq} and kind {env.kind}")
        try:
            cred = self.decode(env.credential)
        except security.MungeError as exc:
            raise Rejected(str(exc)) from None
        digest = protocol.body_digest(env.body())
        if cred.payload != digest:
            raise Rejected("munge credential signs other content (digest mismatch)")
        if cred.uid != owner:
            raise Rejected(
                f"credential made by uid {cred.uid}; Slurm job {folder} belongs to uid {owner}"
            )
        return _Claim(envelope=env, uid=cred.uid, digest=digest, munge_status=cred.status)

    def _apply(self, tx: StoreTx, claim: _Claim, now: float) -> str:
        env = claim.envelope
        seen = tx.accepted_digest(slurm_job_id=env.slurm_job_id, seq=env.seq)
        if seen == claim.digest:
            return "duplicate"
        if seen is not None:
            raise Rejected(
                f"seq {env.seq} of Slurm job {env.slurm_job_id} was used for other content"
            )
        payload = protocol.parse_payload(env.kind, env.payload)
        job = tx.job_by_slurm_id(env.slurm_job_id)
        if job is None:
            if env.kind != "register":
                raise Rejected(f"Slurm job {env.slurm_job_id} has no icefrog job: register first")
            job_id = tx.create_job(
                name=env.job_name,
                owner_uid=claim.uid,
                owner_user=_user_name(claim.uid),
                slurm_job_id=env.slurm_job_id,
                spec=payload,
                now=now,
            )
        else:
            if job.owner_uid != claim.uid or job.name != env.job_name:
                raise Rejected(
                    f"Slurm job {env.slurm_job_id} is bound to icefrog job {job.id} "
                    f"({job.name!r} of uid {job.owner_uid})"
                )
            job_id = job.id
            _apply_payload(tx, job_id, env, payload, now)
        tx.record_accepted(
            slurm_job_id=env.slurm_job_id,
            seq=env.seq,
            kind=env.kind,
            job_id=job_id,
            uid=claim.uid,
            digest=claim.digest,
            sent_time=env.time,
            now=now,
            munge_status=claim.munge_status,
        )
        return "accepted"

    def _reject(self, where: str, reason: str, size: int, claim: _Claim | None, now: float) -> None:
        log.warning("report %s rejected: %s", where, reason)
        env = None if claim is None else claim.envelope
        with self.store.transaction() as tx:
            tx.record_rejected(
                file=where,
                reason=reason,
                size=size,
                now=now,
                slurm_job_id=where.split("/", 1)[0],
                seq=None if env is None else env.seq,
                uid=None if claim is None else claim.uid,
            )

    def _archive(self, job_fd: int, folder: str, name: str, outcome: str) -> None:
        target = self.archive_dir / outcome / folder
        try:
            target.mkdir(parents=True, exist_ok=True)
            with _dir_fd(target, follow=True) as dst_fd:
                os.rename(name, f"{time.time_ns()}-{name}", src_dir_fd=job_fd, dst_dir_fd=dst_fd)
        except OSError as exc:
            log.error("inbox: cannot archive %s/%s (%s); deleting it", folder, name, exc)
            try:
                os.unlink(name, dir_fd=job_fd)
            except OSError as exc2:
                if exc2.errno != errno.ENOENT:
                    log.error("inbox: cannot delete %s/%s either: %s", folder, name, exc2)


def _apply_payload(
    tx: StoreTx, job_id: int, env: protocol.Envelope, payload: Any, now: float
) -> None:
    if isinstance(payload, protocol.JobSpec):
        tx.set_spec(job_id=job_id, spec=payload)
    elif isinstance(payload, list):
        tx.add_profile_samples(
            job_id=job_id, slurm_job_id=env.slurm_job_id, samples=payload, now=now
        )
    elif isinstance(payload, protocol.GradStats):
        tx.put_grad_stats(job_id=job_id, stats=payload, now=now)
    elif isinstance(payload, protocol.MetricReport):
        tx.put_metric(job_id=job_id, metric=payload, now=now)
    elif isinstance(payload, protocol.ProgressReport):
        tx.set_progress(job_id=job_id, progress=payload, sent_time=env.time)
    elif isinstance(payload, protocol.FinishedReport):
        tx.mark_finished(job_id=job_id, report=payload, now=now)
    else:  # pragma: no cover - parse_payload returns one of the above
        raise Rejected(f"report kind {env.kind}: nothing to apply")


def _read_report(dir_fd: int, name: str, owner: int) -> tuple[bytes, int]:
    """The file's bytes, after checking what it is and who owns it (before reading)."""
    if not _FILE_NAME.match(name):
        raise Rejected(f"file name {name!r} is not <seq>-<kind>.json")
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise Rejected(f"cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise Rejected("not a plain file with one link")
        if st.st_uid != owner:
            raise Rejected(f"file owned by uid {st.st_uid}, not by the job's owner uid {owner}")
        if st.st_size > protocol.MAX_REPORT_BYTES:
            raise Rejected(f"{st.st_size} bytes, more than the limit {protocol.MAX_REPORT_BYTES}")
        raw = os.read(fd, protocol.MAX_REPORT_BYTES + 1)
        return raw, len(raw)
    finally:
        os.close(fd)


@contextmanager
def _dir_fd(path: str | Path, *, dir_fd: int | None = None, follow: bool = False) -> Iterator[int]:
    flags = _DIR_FLAGS & ~os.O_NOFOLLOW if follow else _DIR_FLAGS
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _numeric_key(name: str) -> tuple[int, str]:
    head = name.split("-", 1)[0]
    return (int(head) if head.isdigit() and len(head) < 19 else -1, name)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
