"""Reports from the job to the controller: protocol Envelopes written as JSON files into
``<inbox>/<slurm_job_id>/<seq>-<kind>.json`` by icefrog_slurm.security.drop_report (temp
file + fsync + rename, so the controller never reads half a report). Only rank 0 reports.

Sequence numbers: the controller moves every report it reads out of the folder and refuses
a (Slurm job, seq) it has seen with other content, so a number must never come back, not
after a requeue (same Slurm job id, an empty folder) and not after ``icefrog submit``'s
``register`` (seq 0). A report's seq is therefore the larger of the previous one + 1 and the
time in microseconds: increasing within a process and across restarts.

Credential: icefrog_slurm.security.sign (``munge -s <body_digest>``, the digest of the
report body, encoded with the sender's uid); when munge is missing or fails the credential
stays empty and the controller will reject the report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from icefrog_slurm import security
from icefrog_slurm.protocol import PROTOCOL_VERSION, Envelope


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
            Path(inbox).mkdir(parents=True, exist_ok=True)
            # <job id>, or a token folder of this process when another user took that name
            self.folder = security.job_folder(inbox, slurm_job_id)
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
        with contextlib.suppress(security.MungeError):  # unsigned: the controller rejects it
            envelope = security.sign(envelope)
        path = security.drop_report(self.folder.parent, envelope)
        self.seq += 1
        return path
