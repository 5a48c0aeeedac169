"""Who a Slurm job belongs to, and which job replaced which: the rules no user can bend.

A Slurm job's comment is user text: anyone can submit a job named like another user's, with
the comment ``icefrog:<key>;prev=<id>`` of a resubmission. So a job is taken as the
successor of another, or as an earlier try of the same submission, only when

- its owner (Slurm's numeric uid, from machine-readable output) is the expected one, and
- for a resubmission, its tag carries the controller's signature: an HMAC-SHA256, under a
  secret only root can read (``<state dir>/tag.key``), of the key, the replaced job id and
  the owner's uid. A user cannot make one for another job, nor predict one.

Pure but for :meth:`TagSigner.from_file`, which reads or creates the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from icefrog_slurm.domain.cluster import IcefrogTag, SlurmJobState
from icefrog_slurm.errors import IcefrogError

SECRET_BYTES = 32
TAG_SECRET = "tag.key"
"""The secret's file name in the controller's state folder."""
_SIG_HEX = 32  # 128 bits of the HMAC


class TagSigner:
    """Signs and checks the tags of jobs the controller resubmits."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a tag secret needs at least 16 bytes")
        self._secret = secret

    @classmethod
    def ephemeral(cls) -> TagSigner:
        """A signer whose secret lives as long as the process (tests, one-shot tools): its
        tags do not verify after a restart, so a restarted controller could not recover a
        resubmission it was killed in; the daemon uses :meth:`from_file`."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def from_file(cls, path: str | Path) -> TagSigner:
        """The secret in ``path`` (created, mode 0600, when absent). Refused when another
        user owns it or others may read or write it."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(SECRET_BYTES))
                fh.flush()
                os.fsync(fh.fileno())
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise IcefrogError(f"tag secret {path}: cannot open: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise IcefrogError(
                    f"tag secret {path}: must be owned by uid {os.geteuid()} with mode 0600"
                )
            secret = fh.read(4096)
        if len(secret) < 16:
            raise IcefrogError(f"tag secret {path}: shorter than 16 bytes")
        return cls(secret)

    def _sig(self, key: str, previous_id: str, owner_uid: int) -> str:
        msg = f"{key}\0{previous_id}\0{owner_uid}".encode("utf-8", "surrogateescape")
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()[:_SIG_HEX]

    def successor_tag(self, *, key: str, previous_id: str, owner_uid: int) -> IcefrogTag:
        """The tag of the job that replaces ``previous_id`` for ``owner_uid``."""
        return IcefrogTag(
            key=key, previous_id=previous_id, signature=self._sig(key, previous_id, owner_uid)
        )

    def signed(self, tag: IcefrogTag, *, owner_uid: int) -> bool:
        """Whether ``tag`` names a predecessor and carries this controller's signature."""
        if tag.previous_id is None or tag.signature is None:
            return False
        want = self._sig(tag.key, tag.previous_id, owner_uid)
        # bytes: compare_digest refuses str with non-ASCII characters (a user's comment may
        # hold any), and a TypeError here would end the reconcile pass for every job
        return hmac.compare_digest(want.encode(), tag.signature.encode("utf-8", "replace"))


def successor_of(
    jobs: Iterable[SlurmJobState], *, job_id: str, owner_uid: int, signer: TagSigner
) -> str | None:
    """The newest live job of ``owner_uid`` whose signed tag replaces ``job_id``."""
    found = [
        int(j.job_id)
        for j in jobs
        if j.user_id == owner_uid
        and not j.finished
        and j.tag is not None
        and j.tag.previous_id == job_id
        and signer.signed(j.tag, owner_uid=owner_uid)
    ]
    return str(max(found)) if found else None


def earlier_submission(
    jobs: Iterable[SlurmJobState], *, name: str, comment: str, owner_uid: int
) -> str | None:
    """The newest live job of ``owner_uid`` with this name and comment: an earlier try of a
    submission that timed out but reached slurmctld (so it is never made twice)."""
    found = [
        int(j.job_id)
        for j in jobs
        if j.user_id == owner_uid and not j.finished and j.comment == comment and j.name == name
    ]
    return str(max(found)) if found else None
