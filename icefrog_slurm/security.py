"""munge credentials: who wrote a report, proven by the munge daemon every Slurm node runs.

The job side (the launcher, ``icefrog submit``) signs a report with :func:`sign` (``munge -s
<digest of the report body>``) and writes it with :func:`drop_report`; the controller
decodes the credential with :func:`decode` (``unmunge``), which yields the uid of the
process that made it (munged learns it over a Unix socket: it cannot be claimed) and the
signed payload. The store's inbox decides what a decoded credential proves. Also the one
atomic file write (:func:`write_atomic`) the job side uses for reports, checkpoints and
markers. Stdlib only, so the job side can import it.

Two kinds of failure, kept apart: :class:`MungeUnavailable` (munged cannot be reached, does
not answer in time, or has an internal fault: nothing is known about the credential, ask
again later) and :class:`MungeError` (munged answered: the credential is not authentic).
:func:`munged_answers` tells which one a failure was, by a round trip of a fresh credential.

Claimed folders: the inbox is writable by everyone, so another user may create a job's
folder first. :func:`drop_report` then writes to ``<job id>.<random token>``, a folder it
creates itself (nobody can guess the name ahead of it); the controller reads both.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.protocol import Envelope, body_digest

# unmunge status codes (munge.h, munge_err_t) that still carry the uid and payload.
MUNGE_SUCCESS = 0
MUNGE_EXPIRED = 15
MUNGE_REWOUND = 16
MUNGE_REPLAYED = 17
_STATUS_WITH_DATA = frozenset({MUNGE_SUCCESS, MUNGE_EXPIRED, MUNGE_REWOUND, MUNGE_REPLAYED})
# munge.h: EMUNGE_SNAFU 1, EMUNGE_NO_MEMORY 5, EMUNGE_SOCKET 6, EMUNGE_TIMEOUT 7: the daemon
# is missing, slow or failing; they say nothing about the credential.
_STATUS_UNAVAILABLE = frozenset({1, 5, 6, 7})
_TIMEOUT_S = 10.0
_NUMBER = re.compile(r"[0-9]{1,10}")
_OWN_FOLDERS: dict[tuple[str, str], Path] = {}


class MungeError(IcefrogError):
    """munge answered and refused: the credential could not be made or is not authentic."""


class MungeUnavailable(MungeError):
    """munged could not be asked (not running, no answer in time, internal fault): retry."""


class MungeNotInstalled(MungeUnavailable):
    """The munge or unmunge program is missing: waiting will not bring it."""


@dataclass(frozen=True)
class DecodedCredential:
    """What ``unmunge`` proves: the credential's maker and its payload."""

    status: int  # 0 success, 15 expired, 16 rewound, 17 replayed (still authentic)
    uid: int
    gid: int
    payload: str


def encode(
    payload: str,
    *,
    ttl_s: int | None = None,
    run_as: str | None = None,
    socket: str | None = None,
) -> str:
    """A credential for ``payload`` made by the calling user (or ``run_as``, when root),
    by the munged of ``socket`` (munge's default socket when None)."""
    cmd = ["munge", *_socket_arg(socket), "-s", payload]
    if ttl_s is not None:
        cmd += ["-t", str(ttl_s)]
    if run_as is not None:
        cmd = ["runuser", "-u", run_as, "--", *cmd]
    proc = _run(cmd, stdin=b"")
    if proc.returncode != 0:
        error = MungeUnavailable if proc.returncode in _STATUS_UNAVAILABLE else MungeError
        raise error(f"munge failed ({proc.returncode}): {_text(proc.stderr)}")
    return proc.stdout.decode("ascii", "replace").strip()


def decode(credential: str, *, socket: str | None = None) -> DecodedCredential:
    """Decode a credential; raise :class:`MungeError` unless it is authentic, and
    :class:`MungeUnavailable` when munged could not tell.

    Expired, rewound and replayed credentials are authentic (munged made them for that uid
    and payload) and are returned with their status; the caller decides about freshness.
    A payload that is not UTF-8 is returned with its bad bytes replaced (U+FFFD): it can
    never equal the hex digest the inbox compares it with.
    """
    if "\n" in credential or not credential.startswith("MUNGE:"):
        raise MungeError("credential: not a munge credential")
    cmd = ["unmunge", *_socket_arg(socket), "--numeric", "--keys=STATUS,UID,GID"]
    proc = _run(cmd, stdin=credential.encode("utf-8", "replace"))
    meta, sep, payload = proc.stdout.partition(b"\n\n")
    lines = meta.decode("ascii", "replace").splitlines()
    fields = dict(_meta_line(line) for line in lines if ":" in line)
    text = fields.get("STATUS", "")
    status = int(text) if _NUMBER.fullmatch(text) else proc.returncode
    if proc.returncode in _STATUS_UNAVAILABLE:
        raise MungeUnavailable(f"unmunge: munged unavailable: {_text(proc.stderr)}")
    if not sep or status not in _STATUS_WITH_DATA or proc.returncode not in _STATUS_WITH_DATA:
        detail = _text(proc.stderr) or f"status {status}"
        raise MungeError(f"credential rejected by unmunge: {detail}")
    return DecodedCredential(
        status=status,
        uid=_int_field(fields, "UID"),
        gid=_int_field(fields, "GID"),
        payload=payload.decode("utf-8", "replace"),
    )


def munged_answers(*, socket: str | None = None) -> bool:
    """Whether munged encodes and decodes a fresh credential now: after a failed
    :func:`decode`, True means the credential was at fault, False that munged was."""
    try:
        decode(encode("", socket=socket), socket=socket)
    except MungeError:
        return False
    return True


def sign(
    envelope: Envelope,
    *,
    ttl_s: int | None = None,
    run_as: str | None = None,
    socket: str | None = None,
    attempts: int = 3,
) -> Envelope:
    """The envelope with a credential over ``body_digest(envelope.body())``. While munged is
    unavailable it is asked ``attempts`` times in all, 1 s, 2 s, ... apart (a restart of
    munged is a short blip); then :class:`MungeUnavailable` is raised."""
    digest = body_digest(envelope.body())
    for attempt in range(attempts):
        try:
            credential = encode(digest, ttl_s=ttl_s, run_as=run_as, socket=socket)
            return replace(envelope, credential=credential)
        except MungeUnavailable as exc:
            if attempt + 1 >= attempts or isinstance(exc, MungeNotInstalled):
                raise
            time.sleep(2.0**attempt)
    raise MungeUnavailable("munge: no attempt made")  # attempts < 1


def drop_report(inbox_dir: str | Path, envelope: Envelope) -> Path:
    """Write a signed report to ``<inbox>/<job folder>/<seq>-<kind>.json``, atomically.

    The job folder is ``<slurm_job_id>``, created mode 0700; when that name is taken by
    anything but this user's own folder, a folder ``<slurm_job_id>.<random token>`` made
    here (:func:`job_folder`). The file is written under a dot name, mode 0600, fsynced,
    then renamed (:func:`write_atomic`), so the controller never reads half of it."""
    folder = job_folder(inbox_dir, envelope.slurm_job_id)
    name = f"{envelope.seq}-{envelope.kind}.json"
    write_atomic(folder / name, envelope.to_json().encode())
    return folder / name


def job_folder(inbox_dir: str | Path, slurm_job_id: str) -> Path:
    """This process's folder for a job's reports: ``<job id>`` when this user owns it or can
    create it, else ``<job id>.<token>``, 128 random bits, created here and remembered for
    the next report of this process (the inbox cannot be listed by users)."""
    inbox = Path(inbox_dir)
    key = (str(inbox), slurm_job_id)
    known = _OWN_FOLDERS.get(key)
    if known is not None and _own_folder(known):
        return known
    for name in (slurm_job_id, f"{slurm_job_id}.{secrets.token_hex(16)}"):
        folder = inbox / name
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            if not _own_folder(folder):
                continue  # claimed by someone else: take a name nobody can have guessed
        _OWN_FOLDERS[key] = folder
        return folder
    raise IcefrogError(f"{inbox}: no folder for Slurm job {slurm_job_id} could be made")


def _own_folder(folder: Path) -> bool:
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def write_atomic(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically: a dot-named temp file (created exclusively, no
    symlink followed), fsync, rename, fsync the folder; a reader sees the old file or the
    whole new one, also after a crash. A failed write removes its temp file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # left by a crashed process with the same pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # e.g. the disk is full: leave no temp file behind
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _meta_line(line: str) -> tuple[str, str]:
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def _int_field(fields: dict[str, str], key: str) -> int:
    text = fields.get(key, "")
    if not _NUMBER.fullmatch(text):
        raise MungeError(f"unmunge: no {key} in its output")
    return int(text)


def _socket_arg(socket: str | None) -> list[str]:
    return [f"--socket={socket}"] if socket else []


def _text(raw: bytes, limit: int = 200) -> str:
    """munge's output fit for a message: it may hold a user's bytes (bad UTF-8 replaced,
    control characters escaped, cut to ``limit``)."""
    return printable(raw.decode("utf-8", "replace").strip(), limit)


def _run(cmd: list[str], *, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            cmd, input=stdin, capture_output=True, timeout=_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise MungeNotInstalled(f"{cmd[0]}: not installed") from None
    except subprocess.TimeoutExpired:
        raise MungeUnavailable(
            f"{cmd[0]}: no answer within {_TIMEOUT_S:g} s (is munged running?)"
        ) from None
