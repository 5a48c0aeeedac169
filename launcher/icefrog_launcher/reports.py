"""Reports from the job to the controller: protocol Envelopes written as JSON files into
``<inbox>/<slurm_job_id>/<seq>-<kind>.json`` by icefrog_slurm.security.drop_report (temp
file + fsync + rename, so the controller never reads half a report). Only rank 0 reports.

Sequence numbers: the controller moves every report it reads out of the folder and refuses
a (Slurm job, seq) it has seen with other content, so a number must never come back, not
after a requeue (same Slurm job id, an empty folder) and not after ``icefrog submit``'s
``register`` (seq 0). A report's seq is therefore the larger of the previous one + 1 and the
time in microseconds: increasing within a process and across restarts.

Credential: icefrog_slurm.security.sign (``munge -s <body_digest>``, the digest of the
report body, encoded with the sender's uid). When munged cannot be asked (stopped,
restarting, slow) a report is kept, in order, and signed and written at the next report;
the ``finished`` report, the last one, waits for munged up to ``FINAL_WAIT_S``. A report
that munge refuses, or that cannot be signed because munge is not installed, is written
with no credential (the controller rejects it and says why).

Reports are advisory to the training, so a report that cannot be written (the inbox is
full, read-only, stale, missing or not this user's to write: any OSError) never fails the
job: it is kept in order like one waiting for munged and written, after the ones before it,
at the next report once the inbox takes writes again (the ``finished`` report waits for
that up to ``FINAL_WAIT_S`` too). One warning on stderr when such an outage starts, one
when it ends. At most ``MAX_WAITING`` reports are kept; beyond that the oldest is dropped
(the controller's ledger takes a later seq after a gap; ``icefrog submit`` registered the
job already).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefrog_slurm import security
from icefrog_slurm.protocol import PROTOCOL_VERSION, Envelope

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

FINAL_WAIT_S = 120.0
"""How long the last report of a job waits for munged to answer."""
MAX_WAITING = 10000
"""Reports kept while munged is away (beyond that the oldest are written unsigned) or the
inbox cannot be written (beyond that the oldest are dropped)."""


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
        # made while munged could not be asked or the inbox could not be written
        self.waiting: list[Envelope] = []
        self.write_error = ""  # why the inbox took no report, while it takes none
        self.dropped = 0  # reports dropped in this outage (MAX_WAITING)
        if self.enabled:
            try:
                Path(inbox).mkdir(parents=True, exist_ok=True)
                # <job id>, or a token folder of this process when another user took that name
                self.folder = security.job_folder(inbox, slurm_job_id)
                # reports still waiting in the folder (the controller is slow or down)
                existing = [int(p.name.split("-")[0]) for p in self.folder.glob("*-*.json")]
                self.seq = max(existing, default=0) + 1
            except OSError as exc:  # the time-based seq of send() keeps numbers unique
                self._write_failed(exc)

    def send(self, kind: str, payload: Mapping[str, Any] | DataclassInstance) -> Path | None:
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
        self.waiting.append(envelope)
        self.seq += 1
        deadline = time.monotonic() + (FINAL_WAIT_S if kind == "finished" else 0.0)
        while True:
            path = self._drop_waiting()
            if not self.waiting or time.monotonic() >= deadline:
                if self.waiting and kind == "finished":
                    print(
                        f"icefrog trainer: warning: {len(self.waiting)} reports of this job "
                        f"were not written (munged or the inbox did not come back)",
                        file=sys.stderr,
                    )
                return path
            time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))

    def _write_failed(self, exc: BaseException) -> None:
        """Say once per outage that the inbox takes no reports (and that they are kept)."""
        if not self.write_error:
            self.write_error = str(exc) or type(exc).__name__
            print(
                f"icefrog trainer: warning: reports cannot be written to "
                f"{self.folder.parent} ({self.write_error}); they are kept, in order, and "
                f"written when it takes writes again; the training goes on",
                file=sys.stderr,
            )

    def _write_resumed(self) -> None:
        if self.write_error:
            dropped = f" ({self.dropped} oldest reports dropped)" if self.dropped else ""
            print(
                f"icefrog trainer: reports are written to {self.folder.parent} again{dropped}",
                file=sys.stderr,
            )
        self.write_error, self.dropped = "", 0

    def _drop_waiting(self) -> Path | None:
        """Sign and write the kept reports, oldest first; stop at the first that munged
        cannot sign yet. The path of the last report written, or None."""
        path = None
        while self.waiting:
            envelope = self.waiting[0]
            try:
                envelope = security.sign(envelope)
            except security.MungeNotInstalled:
                pass  # no munge at all: unsigned, and the controller says why it rejects it
            except security.MungeUnavailable:
                if len(self.waiting) <= MAX_WAITING:
                    return path
            except security.MungeError:
                pass  # munge refused to sign it: unsigned as well
            try:
                path = security.drop_report(self.folder.parent, envelope)
            except OSError as exc:  # full, read-only, stale, missing: kept for later
                self._write_failed(exc)
                while len(self.waiting) > MAX_WAITING:
                    self.waiting.pop(0)
                    self.dropped += 1
                return path
            self._write_resumed()
            self.folder = path.parent  # known now if the inbox was away at the start
            self.waiting.pop(0)
        return path
