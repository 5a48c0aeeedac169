"""munge credentials: who wrote a report, proven by the munge daemon every Slurm node runs.

The job side (the launcher, ``icefrog submit``) signs a report with :func:`sign` (``munge -s
<digest of the report body>``) and writes it with :func:`drop_report`; the controller
decodes the credential with :func:`decode` (``unmunge``), which yields the uid of the
process that made it (munged learns it over a Unix socket: it cannot be claimed) and the
signed payload. The store's inbox decides what a decoded credential proves. Also the one
atomic file write (:func:`write_atomic`) the job side uses for reports, checkpoints and
markers. Stdlib only, so the job side can import it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.protocol import Envelope, body_digest

# unmunge status codes (munge.h, munge_err_t) that still carry the uid and payload.
MUNGE_SUCCESS = 0
MUNGE_EXPIRED = 15
MUNGE_REWOUND = 16
MUNGE_REPLAYED = 17
_STATUS_WITH_DATA = frozenset({MUNGE_SUCCESS, MUNGE_EXPIRED, MUNGE_REWOUND, MUNGE_REPLAYED})
_TIMEOUT_S = 10.0


class MungeError(IcefrogError):
    """A credential could not be made or decoded."""


@dataclass(frozen=True)
class DecodedCredential:
    """What ``unmunge`` proves: the credential's maker and its payload."""

    status: int  # 0 success, 15 expired, 16 rewound, 17 replayed (still authentic)
    uid: int
    gid: int
    payload: str


def encode(payload: str, *, ttl_s: int | None = None, run_as: str | None = None) -> str:
    """A credential for ``payload`` made by the calling user (or ``run_as``, when root)."""
    cmd = ["munge", "-s", payload]
    if ttl_s is not None:
        cmd += ["-t", str(ttl_s)]
    if run_as is not None:
        cmd = ["runuser", "-u", run_as, "--", *cmd]
    proc = _run(cmd, stdin="")
    if proc.returncode != 0:
        raise MungeError(f"munge failed ({proc.returncode}): {proc.stderr.strip()[:200]}")
    return proc.stdout.strip()


def decode(credential: str) -> DecodedCredential:
    """Decode a credential; raise :class:`MungeError` unless it is authentic.

    Expired, rewound and replayed credentials are authentic (munged made them for that uid
    and payload) and are returned with their status; the caller decides about freshness.
    """
    if "\n" in credential or not credential.startswith("MUNGE:"):
        raise MungeError("credential: not a munge credential")
    proc = _run(["unmunge", "--numeric", "--keys=STATUS,UID,GID"], stdin=credential)
    meta, sep, payload = proc.stdout.partition("\n\n")
    fields = dict(_meta_line(line) for line in meta.splitlines() if ":" in line)
    text = fields.get("STATUS", "")
    status = int(text) if text.isdigit() else proc.returncode
    if not sep or status not in _STATUS_WITH_DATA or proc.returncode not in _STATUS_WITH_DATA:
        detail = proc.stderr.strip()[:200] or f"status {status}"
        raise MungeError(f"credential rejected by unmunge: {detail}")
    return DecodedCredential(
        status=status,
        uid=_int_field(fields, "UID"),
        gid=_int_field(fields, "GID"),
        payload=payload,
    )


def sign(envelope: Envelope, *, ttl_s: int | None = None, run_as: str | None = None) -> Envelope:
    """The envelope with a credential over ``body_digest(envelope.body())``."""
    digest = body_digest(envelope.body())
    return replace(envelope, credential=encode(digest, ttl_s=ttl_s, run_as=run_as))


def drop_report(inbox_dir: str | Path, envelope: Envelope) -> Path:
    """Write a signed report to ``<inbox>/<slurm_job_id>/<seq>-<kind>.json``, atomically.

    The job's folder is created mode 0700 (refused if someone else owns it); the file is
    written under a dot name, mode 0600, fsynced, then renamed (:func:`write_atomic`), so the
    controller never reads half of it."""
    folder = Path(inbox_dir) / envelope.slurm_job_id
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        owner = folder.lstat().st_uid
        if owner != os.geteuid() or folder.is_symlink():
            raise IcefrogError(f"{folder}: owned by uid {owner}, not by this user") from None
    name = f"{envelope.seq}-{envelope.kind}.json"
    write_atomic(folder / name, envelope.to_json().encode())
    return folder / name


def write_atomic(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically: a dot-named temp file (created exclusively, no
    symlink followed), fsync, rename, fsync the folder; a reader sees the old file or the
    whole new one, also after a crash."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # left by a crashed process with the same pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
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
    if not text.isdigit():
        raise MungeError(f"unmunge: no {key} in its output")
    return int(text)


def _run(cmd: list[str], *, stdin: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise MungeError(f"{cmd[0]}: not installed") from None
    except subprocess.TimeoutExpired:
        raise MungeError(
            f"{cmd[0]}: no answer within {_TIMEOUT_S:g} s (is munged running?)"
        ) from None
