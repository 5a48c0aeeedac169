"""Thin reads for the reports: one read-only transaction each, records out.

Each function opens ``SqlStore.reading()`` (a consistent read that never takes the
controller's write lock), selects the jobs with a :class:`~icefrog_slurm.report.select.JobFilter`
and reads what the report needs in a fixed number of queries.
"""

from __future__ import annotations

from dataclasses import dataclass

from icefrog_slurm.domain.records import JobRecord, SlurmAction
from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.report.jobs import JobFacts
from icefrog_slurm.report.select import JobFilter
from icefrog_slurm.store.ledger import StoreError
from icefrog_slurm.store.sql import SqlStore
from icefrog_slurm.store.views import Decided, ReportTx


@dataclass(frozen=True)
class QueuedJob:
    """An active job and its most recent decision (None before any round decided it)."""

    job: JobRecord
    latest: Decided | None


@dataclass(frozen=True)
class ShownJob:
    """Everything ``icefrog show job`` prints."""

    facts: JobFacts
    actions: tuple[SlurmAction, ...]


def read_queue(store: SqlStore, flt: JobFilter, *, now: float) -> list[QueuedJob]:
    """The selected jobs and their latest decisions."""
    with store.reading() as session:
        tx = ReportTx(session)
        jobs = [j for j in tx.jobs(states=flt.states) if flt.matches(j, now=now)]
        latest = tx.latest_decisions([j.id for j in jobs])
    return [QueuedJob(job=j, latest=latest.get(j.id)) for j in jobs]


def read_accounting(store: SqlStore, flt: JobFilter, *, now: float) -> list[JobFacts]:
    """The selected jobs with their whole decision and metric histories."""
    with store.reading() as session:
        tx = ReportTx(session)
        jobs = [j for j in tx.jobs(states=flt.states) if flt.matches(j, now=now)]
        ids = [j.id for j in jobs]
        history, metrics = tx.decision_history(ids), tx.metric_history(ids)
    return [
        JobFacts(job=j, history=tuple(history[j.id]), metrics=tuple(metrics[j.id])) for j in jobs
    ]


def read_job(
    store: SqlStore, ident: str, *, slurm_id: bool, owner_uid: int | None = None
) -> ShownJob:
    """One job by icefrog id, or by any Slurm job id of its chain.

    Without ``slurm_id`` the icefrog id is tried first; when ``ident`` is also the Slurm
    job id of a different job the answer is ambiguous and an InputError says so. With
    ``owner_uid`` (``[reports] private``) another owner's job is as if it did not exist.
    """
    with store.reading() as session:
        tx = ReportTx(session)
        by_slurm = _owned(tx.job_by_slurm_id(ident), owner_uid)
        by_own = None if slurm_id or not ident.isdigit() else _job_or_none(tx, int(ident))
        by_own = _owned(by_own, owner_uid)
        job = by_slurm if slurm_id else (by_own or by_slurm)
        if job is None:
            kind = "Slurm job id" if slurm_id else "icefrog job id or Slurm job id"
            raise IcefrogError(f"no icefrog job with {kind} {ident}")
        if by_own is not None and by_slurm is not None and by_own.id != by_slurm.id:
            raise InputError(
                f"{ident} is icefrog job {by_own.id} and also Slurm job {ident} of icefrog "
                f"job {by_slurm.id}: add --slurm to mean the Slurm job"
            )
        history = tx.decision_history([job.id])[job.id]
        metrics = tx.metric_history([job.id])[job.id]
        actions = tx.actions(job_id=job.id)
    facts = JobFacts(job=job, history=tuple(history), metrics=tuple(metrics))
    return ShownJob(facts=facts, actions=tuple(actions))


def _owned(job: JobRecord | None, owner_uid: int | None) -> JobRecord | None:
    return job if job is None or owner_uid is None or job.owner_uid == owner_uid else None


def _job_or_none(tx: ReportTx, job_id: int) -> JobRecord | None:
    try:
        return tx.job(job_id)
    except StoreError:
        return None
