"""munge credentials: who wrote a report, proven by the munge daemon every Slurm node runs.

A job (or ``icefrog submit``) signs a report with ``munge -s <digest>``; the controller
decodes the credential with ``unmunge``, which yields the uid of the process that made it
(munged checks it over a Unix socket, it cannot be claimed) and the signed payload. This
module only wraps the two commands; the inbox decides what a decoded credential proves.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from icefrog_slurm.errors import IcefrogError

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
