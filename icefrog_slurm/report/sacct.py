"""``icefrog sacct``: one accounting row a job, its fields, and its JSON form. Pure.

Times print like sacct (``YYYY-MM-DDTHH:MM:SS``, ``Unknown`` when absent) and durations
as ``[D-]HH:MM:SS``; JSON carries the numbers (whole seconds since the epoch, whole
seconds, as Slurm prints them) inside Slurm's envelope (``report/envelope.py``). How each
figure is computed: ``report/jobs.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from icefrog_slurm.report import jobs
from icefrog_slurm.report.envelope import seconds
from icefrog_slurm.report.jobs import JobFacts
from icefrog_slurm.report.squeue import node_list
from icefrog_slurm.report.table import Column, Field
from icefrog_slurm.report.timefmt import format_duration, format_time

DEFAULT_FORMAT = (
    "JobID,JobName,User,State,Submit,Start,End,JCT,TTA,GPUHours,Restarts,Reallocations,"
    "FinalMetric,Reached"
)

NONE_ASSIGNED = "None assigned"


@dataclass(frozen=True)
class AcctRow:
    facts: JobFacts
    elapsed_s: float
    jct_s: float
    tta_s: float | None
    gpu_hours: float
    restarts: int
    reallocations: int
    final_metric: float | None
    reached: bool
    partition: str = ""

    @property
    def alloc_gpus(self) -> int:
        history = self.facts.history
        return history[-1].allocation.gpus if history else 0

    @property
    def node_list(self) -> str:
        """The nodes of the job's last decision that gave it GPUs, folded as Slurm prints
        them; sacct's ``None assigned`` when none did."""
        held = [d.allocation.nodes for d in self.facts.history if d.allocation.nodes]
        return node_list(held[-1]) if held else NONE_ASSIGNED


def acct_row(facts: JobFacts, *, now: float, partition: str = "") -> AcctRow:
    job = facts.job
    end = jobs.end_or_now(job, now)
    restarts, reallocations = jobs.restarts_and_reallocations(facts.history)
    return AcctRow(
        facts=facts,
        elapsed_s=0.0 if job.start_time is None else end - job.start_time,
        jct_s=end - job.submit_time,
        tta_s=jobs.tta_seconds(facts),
        gpu_hours=jobs.gpu_seconds(facts.history, start=job.start_time, end=end) / 3600.0,
        restarts=restarts,
        reallocations=reallocations,
        final_metric=jobs.final_metric(facts),
        reached=jobs.target_reached(facts),
        partition=partition,
    )


def number(value: float | None) -> str:
    """A metric as text: up to 6 significant digits; empty when absent."""
    return "" if value is None else f"{value:.6g}"


def _target(row: AcctRow) -> str:
    spec = row.facts.job.spec
    return f"{spec.target_metric}{spec.target_op}{spec.target_value:g}"


FIELDS: tuple[Field[AcctRow], ...] = (
    Field("JobID", 8, lambda r: str(r.facts.job.id), left=True, help="icefrog job id"),
    Field(
        "SlurmJobID",
        12,
        lambda r: r.facts.job.slurm_job_id,
        left=True,
        help="current Slurm job id",
    ),
    Field(
        "SlurmJobIDs",
        20,
        lambda r: ",".join(r.facts.job.slurm_job_ids),
        left=True,
        help="every Slurm job id the job has had, oldest first",
    ),
    Field("JobName", 10, lambda r: r.facts.job.name, help="job name"),
    Field("User", 9, lambda r: r.facts.job.owner_user, help="owner's user name"),
    Field("UID", 6, lambda r: str(r.facts.job.owner_uid), help="owner's uid"),
    Field("Partition", 10, lambda r: r.partition, help="the controller's partition"),
    Field("State", 10, lambda r: jobs.state_name(r.facts.job.state), help="job state"),
    Field("NodeList", 15, lambda r: r.node_list, help="nodes of the last decision with GPUs"),
    Field("Submit", 19, lambda r: format_time(r.facts.job.submit_time), help="submitted"),
    Field("Start", 19, lambda r: format_time(r.facts.job.start_time), help="first ran"),
    Field("End", 19, lambda r: format_time(r.facts.job.end_time), help="ended"),
    Field("Elapsed", 10, lambda r: format_duration(r.elapsed_s), help="start to end (or now)"),
    Field("JCT", 10, lambda r: format_duration(r.jct_s), help="submit to end (or now)"),
    Field("TTA", 10, lambda r: format_duration(r.tta_s), help="submit to target reached"),
    Field("GPUHours", 8, lambda r: f"{r.gpu_hours:.2f}", help="decided GPUs integrated"),
    Field("AllocGPUs", 9, lambda r: str(r.alloc_gpus), help="GPUs of the last decision"),
    Field("Restarts", 8, lambda r: str(r.restarts), help="restarts from a checkpoint"),
    Field("Reallocations", 13, lambda r: str(r.reallocations), help="resource changes"),
    Field("Epoch", 5, lambda r: str(r.facts.job.progress.epoch), help="latest epoch"),
    Field("Target", 14, _target, help="target metric, operator and value"),
    Field("FinalMetric", 11, lambda r: number(r.final_metric), help="final or latest value"),
    Field("Reached", 7, lambda r: "yes" if r.reached else "no", help="target reached"),
    Field("FinishReason", 19, lambda r: r.facts.job.finish_reason or "", help="why it ended"),
)


Cut = Literal["mark", "plain", "never"]

# How sacct 22.05 fits a value longer than its column (checked against it:
# tests/integration/accounting/): text is cut, its last kept character `+`; a time is cut
# plainly; a number or a duration is printed whole, past its column. Titles are cut plainly.
_CUTS: dict[str, Cut] = {
    **dict.fromkeys(("Submit", "Start", "End"), "plain"),
    **dict.fromkeys(
        (
            "UID",
            "Elapsed",
            "JCT",
            "TTA",
            "GPUHours",
            "AllocGPUs",
            "Restarts",
            "Reallocations",
            "Epoch",
            "FinalMetric",
        ),
        "never",
    ),
}


@dataclass(frozen=True)
class SacctColumn(Column[AcctRow]):
    """A column that fits its values as sacct does (``_CUTS``)."""

    cut: Cut = "mark"

    def fit(self, value: str, *, mark: bool = True) -> str:
        if not mark or self.cut == "mark":  # a title, or text
            return super().fit(value, mark=mark)
        if self.cut == "plain" or len(value) <= self.width:
            return super().fit(value, mark=False)
        return self.prefix + value + self.suffix


def sacct_columns(columns: Sequence[Column[AcctRow]]) -> list[Column[AcctRow]]:
    """``columns`` as sacct fits them."""
    return [
        SacctColumn(
            **{f.name: getattr(c, f.name) for f in fields(c)},
            cut=_CUTS.get(c.field.name, "mark"),
        )
        for c in columns
    ]


def acct_json(row: AcctRow) -> dict[str, Any]:
    job = row.facts.job
    return {
        "job_id": job.id,
        "slurm_job_ids": list(job.slurm_job_ids),
        "name": job.name,
        "user": job.owner_user,
        "uid": job.owner_uid,
        "partition": row.partition,
        "state": jobs.state_name(job.state),
        "nodes": row.node_list,
        "submit_time": seconds(job.submit_time),
        "start_time": seconds(job.start_time),
        "end_time": seconds(job.end_time),
        "elapsed_s": seconds(row.elapsed_s),
        "jct_s": seconds(row.jct_s),
        "tta_s": seconds(row.tta_s),
        "gpu_hours": row.gpu_hours,
        "alloc_gpus": row.alloc_gpus,
        "restarts": row.restarts,
        "reallocations": row.reallocations,
        "epoch": job.progress.epoch,
        "target": {
            "metric": job.spec.target_metric,
            "op": job.spec.target_op,
            "value": job.spec.target_value,
        },
        "final_metric": row.final_metric,
        "target_reached": row.reached,
        "finish_reason": job.finish_reason,
    }
