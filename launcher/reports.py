"""Reports from the job to the controller: protocol Envelopes written as JSON files into
``<inbox>/<slurm_job_id>/<seq>-<kind>.json`` (temp file + fsync + rename, so the
controller never reads half a report). Only rank 0 reports.

Sequence numbers: the controller moves every report it reads out of the folder and refuses
a (Slurm job, seq) it has seen with other content, so a number must never come back, not
after a requeue (same Slurm job id, an empty folder) and not after ``icefrog submit``'s
``register`` (seq 0). A report's seq is therefore the larger of the previous one + 1 and the
time in microseconds: increasing within a process and across restarts.

Credential: when the ``munge`` program exists, ``munge -s <body_digest>`` encodes the
digest of the report body (icefrog_slurm.protocol.body_digest) with the sender's uid;
otherwise the credential is empty and the controller will reject the report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from icefrog_slurm.protocol import PROTOCOL_VERSION, Envelope, body_digest


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def munge_credential(digest: str, munge: str | None = None) -> str:
    """``munge -s DIGEST`` output, or "" when munge is missing or fails."""
    exe = munge or shutil.which("munge")
    if exe is None:
        return ""
    try:
        done = subprocess.run(
            [exe, "-s", digest], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


class Reporter:
    """Numbered reports of one Slurm job. ``enabled=False`` (ranks > 0, no inbox) drops them."""

    def __init__(
        self, *, inbox: str, slurm_job_id: str, job_name: str, enabled: bool = True
    ) -> None:
        self.enabled = enabled and bool(inbox)
        self.folder = Path(inbox) / slurm_job_id if inbox else Path()
        self.slurm_job_id = slurm_job_id
        self.job_name = job_name
        self.seq = 1
        if self.enabled:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            # reports still waiting in the folder (the controller is slow or down)
            existing = [int(p.name.split("-")[0]) for p in self.folder.glob("*-*.json")]
            self.seq = max(existing, default=0) + 1

    def send(self, kind: str, payload: Mapping[str, Any] | Any) -> Path | None:
        if not self.enabled:
            return None
        self.seq = max(self.seq, time.time_ns() // 1000)
        if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
            payload = dataclasses.asdict(payload)
        envelope = Envelope(
            version=PROTOCOL_VERSION,
            kind=kind,
            slurm_job_id=self.slurm_job_id,
            job_name=self.job_name,
            seq=self.seq,
            time=time.time(),
            payload=json.loads(json.dumps(payload)),  # tuples -> lists, as parsed back
        )
        envelope = dataclasses.replace(
            envelope, credential=munge_credential(body_digest(envelope.body()))
        )
        path = self.folder / f"{self.seq:016d}-{kind}.json"
        write_atomic(path, envelope.to_json().encode())
        self.seq += 1
        return path
