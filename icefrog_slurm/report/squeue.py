"""``icefrog squeue``: one row an active job with the controller's latest decision. Pure.

The decision fields (GPUs, shared, nodes, batch, frozen layers, ψ, predicted TTA,
IceShare) are those of the most recent round that decided the job; ``N/A`` before any
round did. ``NodeList(Reason)`` shows the nodes of a running job and ``(reason)`` for a
waiting one, as squeue's ``NODELIST(REASON)`` does. Node lists print compressed as Slurm
prints them (``node[1-2,4]``), in text and in JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.report import jobs
from icefrog_slurm.report.envelope import seconds
from icefrog_slurm.report.queries import QueuedJob
from icefrog_slurm.report.table import Field
from icefrog_slurm.report.timefmt import format_duration
from icefrog_slurm.slurm.parse import ParseError, compress_hostlist

DEFAULT_FORMAT = (
    "JobID,SlurmJobID,Name,User,ST,Time,GPUs,Shared,Batch,Frozen,Psi,PredTTA,IceShare,"
    "NodeList(Reason)"
)
NA = "N/A"


@dataclass(frozen=True)
class QueueRow:
    queued: QueuedJob
    now: float
    partition: str = ""

    @property
    def allocation(self) -> Allocation | None:
        latest = self.queued.latest
        return None if latest is None else latest.allocation

    @property
    def time_s(self) -> float:
        job = self.queued.job
        if job.start_time is None or job.state != "running":
            return 0.0
        return self.now - job.start_time

    @property
    def reason(self) -> str:
        return jobs.wait_reason(self.queued.job, self.queued.latest)


def _decided(text: Callable[[Allocation], str]) -> Callable[[QueueRow], str]:
    """A field of the latest decision; N/A before any round decided the job."""

    def get(row: QueueRow) -> str:
        a = row.allocation
        return NA if a is None else text(a)

    return get


def node_list(nodes: tuple[str, ...]) -> str:
    """Nodes as a Slurm hostlist (``node[1-2]``); a name Slurm would not print, joined."""
    try:
        return compress_hostlist(nodes)
    except ParseError:
        return ",".join(nodes)


def _fixed(value: float | None, digits: int = 3) -> str:
    return NA if value is None else f"{value:.{digits}f}"


def _node_list_reason(row: QueueRow) -> str:
    if row.reason:
        return f"({row.reason})"
    a = row.allocation
    return node_list(a.nodes) if a is not None else ""


FIELDS: tuple[Field[QueueRow], ...] = (
    Field("JobID", 8, lambda r: str(r.queued.job.id), help="icefrog job id"),
    Field("SlurmJobID", 12, lambda r: r.queued.job.slurm_job_id, help="current Slurm job id"),
    Field("Name", 10, lambda r: r.queued.job.name, help="job name"),
    Field("User", 9, lambda r: r.queued.job.owner_user, help="owner's user name"),
    Field("Partition", 9, lambda r: r.partition, help="the controller's partition"),
    Field("ST", 2, lambda r: jobs.state_code(r.queued.job.state), help="state, compact"),
    Field("State", 9, lambda r: jobs.state_name(r.queued.job.state), help="state"),
    Field("Time", 10, lambda r: format_duration(r.time_s), help="time running"),
    Field("Round", 5, lambda r: NA if r.queued.latest is None else str(r.queued.latest.round_no)),
    Field("GPUs", 4, _decided(lambda a: str(a.gpus)), help="GPUs decided (0: wait)"),
    Field("Shared", 6, _decided(lambda a: "yes" if a.shared else "no"), help="on a shared GPU"),
    Field("Nodes", 5, _decided(lambda a: str(len(a.nodes))), help="number of nodes"),
    Field("NodeList", 15, _decided(lambda a: node_list(a.nodes)), left=True, help="nodes"),
    Field("Batch", 5, _decided(lambda a: str(a.batch)), help="per-GPU batch"),
    Field("Frozen", 6, _decided(lambda a: str(a.frozen)), help="frozen layers"),
    Field("Psi", 5, _decided(lambda a: _fixed(a.psi)), help="frozen penalty ψ (eq 3)"),
    Field(
        "PredTTA",
        10,
        _decided(lambda a: NA if a.predicted_tta_s is None else format_duration(a.predicted_tta_s)),
        help="predicted time to accuracy",
    ),
    Field("IceShare", 8, _decided(lambda a: _fixed(a.share)), help="IceShare (eq 17)"),
    Field("Reason", 10, lambda r: r.reason, left=True, help="why a pending job waits"),
    Field("NodeList(Reason)", 16, _node_list_reason, left=True, help="nodes, or (reason)"),
)


def queue_json(row: QueueRow) -> dict[str, Any]:
    job, latest, a = row.queued.job, row.queued.latest, row.allocation
    return {
        "job_id": job.id,
        "slurm_job_id": job.slurm_job_id,
        "name": job.name,
        "user": job.owner_user,
        "state": jobs.state_name(job.state),
        "partition": row.partition,
        "time_s": seconds(row.time_s),
        "round": None if latest is None else latest.round_no,
        "gpus": None if a is None else a.gpus,
        "shared": None if a is None else a.shared,
        "nodes": None if a is None else node_list(a.nodes),
        "batch": None if a is None else a.batch,
        "frozen": None if a is None else a.frozen,
        "psi": None if a is None else a.psi,
        "predicted_tta_s": None if a is None else seconds(a.predicted_tta_s),
        "ice_share": None if a is None else a.share,
        "reason": row.reason or None,
    }


# squeue's -o letters with an icefrog field of the same meaning (``man squeue``).
LETTERS: dict[str, str] = {
    "i": "JobID",
    "A": "JobID",
    "j": "Name",
    "u": "User",
    "P": "Partition",
    "t": "ST",
    "T": "State",
    "M": "Time",
    "D": "Nodes",
    "N": "NodeList",
    "R": "NodeList(Reason)",
    "r": "Reason",
}
