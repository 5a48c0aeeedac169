"""``StoreTx``: every read and write of the store, inside one transaction of ``SqlStore``.

Methods take keyword arguments and return immutable records (``records.py``); a caller never
sees an ORM object or commits. Writes that may be repeated (a requeued job re-sends an
epoch's gradient statistics or metric) replace the earlier row, so they are idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, selectinload

from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.protocol import (
    FinishedReport,
    GradStats,
    JobSpec,
    MetricReport,
    ProfileSample,
    ProgressReport,
)
from icefrog_slurm.store.models import (
    AcceptedReportRow,
    AllocationRow,
    GradStatsRow,
    IntentRow,
    Job,
    MetricRow,
    ProfileSampleRow,
    RejectedReportRow,
    RoundRow,
    SlurmActionRow,
    SlurmJob,
)
from icefrog_slurm.store.records import (
    ACTIVE_STATES,
    INTENT_END_STATES,
    JOB_STATES,
    OPEN_INTENT_STATES,
    Allocation,
    Intent,
    JobRecord,
    JobView,
    Progress,
    RejectedReport,
    RoundRecord,
    SlurmAction,
    StoreSnapshot,
)

_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec))
_SAMPLE_FIELDS = tuple(f.name for f in fields(ProfileSample))
_MAX_DETAIL = 4000


class StoreError(IcefrogError):
    """A store call that breaks an invariant (unknown job, a Slurm id already taken...)."""


class StoreTx:
    """The operations of one transaction (see :class:`SqlStore.transaction`)."""

    def __init__(self, session: Session) -> None:
        self._s = session

    # ----- jobs and their Slurm chain -------------------------------------------------
    def create_job(
        self,
        *,
        name: str,
        owner_uid: int,
        owner_user: str,
        slurm_job_id: str,
        spec: JobSpec,
        now: float,
    ) -> int:
        """A new icefrog job whose first Slurm job is ``slurm_job_id``; returns its id."""
        self._require_free_slurm_id(slurm_job_id)
        row = Job(
            name=name,
            owner_uid=owner_uid,
            owner_user=owner_user,
            state="pending",
            submit_time=now,
            **_spec_columns(spec),
        )
        self._s.add(row)
        self._s.flush()
        self._s.add(
            SlurmJob(
                slurm_job_id=slurm_job_id,
                job_id=row.id,
                position=0,
                reason="submitted",
                created_at=now,
            )
        )
        return row.id

    def set_spec(self, *, job_id: int, spec: JobSpec) -> None:
        self._s.execute(update(Job).where(Job.id == job_id).values(**_spec_columns(spec)))

    def link_slurm_job(self, *, job_id: int, slurm_job_id: str, reason: str, now: float) -> None:
        """Append a Slurm job (a resubmission) to the chain; the job keeps its identity."""
        job = self._job_row(job_id)
        self._require_free_slurm_id(slurm_job_id)
        self._s.add(
            SlurmJob(
                slurm_job_id=slurm_job_id,
                job_id=job_id,
                position=len(job.slurm_jobs),
                reason=reason,
                created_at=now,
            )
        )
        self._s.flush()
        self._s.expire(job, ["slurm_jobs"])

    def set_state(self, *, job_id: int, state: str, now: float) -> None:
        """Move a job to ``state``; stamps start (first ``running``) and end times."""
        if state not in JOB_STATES:
            raise StoreError(f"job state {state!r}: must be one of {', '.join(JOB_STATES)}")
        job = self._job_row(job_id)
        job.state = state
        if state == "running" and job.start_time is None:
            job.start_time = now
        if state not in ACTIVE_STATES and job.end_time is None:
            job.end_time = now

    def job(self, job_id: int) -> JobRecord:
        return _job_record(self._job_row(job_id))

    def job_by_slurm_id(self, slurm_job_id: str) -> JobRecord | None:
        """The icefrog job whose chain holds this Slurm job id, if any."""
        link = self._s.get(SlurmJob, slurm_job_id)
        return None if link is None else _job_record(link.job)

    def jobs(self, *, states: Iterable[str] | None = None) -> list[JobRecord]:
        query = select(Job).options(selectinload(Job.slurm_jobs)).order_by(Job.id)
        if states is not None:
            query = query.where(Job.state.in_(tuple(states)))
        return [_job_record(row) for row in self._s.scalars(query)]

    # ----- what jobs measured -----------------------------------------------------------
    def add_profile_samples(
        self, *, job_id: int, slurm_job_id: str, samples: Sequence[ProfileSample], now: float
    ) -> None:
        for sample in samples:
            self._s.add(
                ProfileSampleRow(
                    job_id=job_id, slurm_job_id=slurm_job_id, time=now, **asdict(sample)
                )
            )

    def put_grad_stats(self, *, job_id: int, stats: GradStats, now: float) -> None:
        """Store one epoch's per-layer statistics, replacing a re-sent epoch."""
        row = self._s.scalar(
            select(GradStatsRow).where(
                GradStatsRow.job_id == job_id, GradStatsRow.epoch == stats.epoch
            )
        )
        if row is None:
            row = GradStatsRow(job_id=job_id, epoch=stats.epoch)
            self._s.add(row)
        row.frozen = stats.frozen
        row.grad_var = list(stats.grad_var)
        row.grad_sqr = list(stats.grad_sqr)
        row.time = now

    def put_metric(self, *, job_id: int, metric: MetricReport, now: float) -> None:
        """Store one epoch's validation metric, replacing a re-sent one."""
        row = self._s.scalar(
            select(MetricRow).where(
                MetricRow.job_id == job_id,
                MetricRow.epoch == metric.epoch,
                MetricRow.name == metric.name,
            )
        )
        if row is None:
            row = MetricRow(job_id=job_id, epoch=metric.epoch, name=metric.name)
            self._s.add(row)
        row.value = metric.value
        row.time = now

    def set_progress(self, *, job_id: int, progress: ProgressReport, sent_time: float) -> None:
        """Keep the newest progress: an older report arriving late changes nothing."""
        job = self._job_row(job_id)
        if job.progress_time is not None and sent_time < job.progress_time:
            return
        job.epoch = progress.epoch
        job.samples_done = progress.samples_done
        job.effective_samples_done = progress.effective_samples_done
        job.checkpoint_path = progress.checkpoint_path
        job.progress_time = sent_time

    def mark_finished(self, *, job_id: int, report: FinishedReport, now: float) -> None:
        job = self._job_row(job_id)
        job.finish_reason = report.reason
        job.final_metric = report.final_metric
        self.set_state(
            job_id=job_id, state="failed" if report.reason == "failed" else "finished", now=now
        )

    # ----- rounds ------------------------------------------------------------------------
    def next_round_no(self) -> int:
        last = self._s.scalar(select(func.max(RoundRow.round_no)))
        return 1 if last is None else last + 1

    def record_round(
        self,
        *,
        round_no: int,
        now: float,
        policy: str,
        capacity_gpus: int,
        allocations: Sequence[Allocation],
        solve_s: float | None = None,
        min_share: float | None = None,
    ) -> None:
        """Record a round's decision: one row for the round, one a job."""
        self._s.add(
            RoundRow(
                round_no=round_no,
                time=now,
                policy=policy,
                capacity_gpus=capacity_gpus,
                solve_s=solve_s,
                min_share=min_share,
            )
        )
        self._s.flush()
        for a in allocations:
            self._s.add(AllocationRow(round_no=round_no, **{**asdict(a), "nodes": list(a.nodes)}))

    def round(self, round_no: int | None = None) -> RoundRecord | None:
        """A round's decision (the last one when ``round_no`` is None)."""
        if round_no is None:
            round_no = self._s.scalar(select(func.max(RoundRow.round_no)))
        row = None if round_no is None else self._s.get(RoundRow, round_no)
        if row is None:
            return None
        allocs = self._s.scalars(
            select(AllocationRow)
            .where(AllocationRow.round_no == row.round_no)
            .order_by(AllocationRow.job_id)
        )
        return RoundRecord(
            round_no=row.round_no,
            time=row.time,
            policy=row.policy,
            capacity_gpus=row.capacity_gpus,
            solve_s=row.solve_s,
            min_share=row.min_share,
            allocations=tuple(_allocation(a) for a in allocs),
        )

    def job_allocations(self, job_id: int) -> list[tuple[int, Allocation]]:
        """A job's trajectory: (round_no, allocation) for every round that decided it."""
        rows = self._s.scalars(
            select(AllocationRow)
            .where(AllocationRow.job_id == job_id)
            .order_by(AllocationRow.round_no)
        )
        return [(r.round_no, _allocation(r)) for r in rows]

    # ----- reconcile: intents and the audit log -----------------------------------------
    def add_intent(
        self,
        *,
        action: str,
        params: Mapping[str, Any],
        now: float,
        job_id: int | None = None,
        round_no: int | None = None,
        supersede: bool = True,
    ) -> int:
        """Write what reconcile is about to do, before doing it. With ``supersede``, the
        job's earlier open intents are closed as ``superseded`` (a newer plan wins)."""
        if supersede and job_id is not None:
            self._s.execute(
                update(IntentRow)
                .where(IntentRow.job_id == job_id, IntentRow.status.in_(OPEN_INTENT_STATES))
                .values(status="superseded", updated_at=now)
            )
        row = IntentRow(
            round_no=round_no,
            job_id=job_id,
            action=action,
            params=dict(params),
            status="pending",
            attempts=0,
            created_at=now,
            updated_at=now,
            detail="",
        )
        self._s.add(row)
        self._s.flush()
        return row.id

    def start_intent(self, *, intent_id: int, now: float) -> Intent:
        """Mark an intent as being acted on (counts the attempt); commit before acting."""
        row = self._intent_row(intent_id)
        if row.status not in OPEN_INTENT_STATES:
            raise StoreError(f"intent {intent_id} is {row.status}, not open")
        row.status, row.attempts, row.updated_at = "acting", row.attempts + 1, now
        return _intent(row)

    def finish_intent(self, *, intent_id: int, status: str, now: float, detail: str = "") -> None:
        if status not in INTENT_END_STATES:
            raise StoreError(
                f"intent status {status!r}: must be one of {', '.join(INTENT_END_STATES)}"
            )
        row = self._intent_row(intent_id)
        row.status, row.updated_at, row.detail = status, now, detail[:_MAX_DETAIL]

    def open_intents(self) -> list[Intent]:
        """Intents written but not finished: what a restarted reconcile must check."""
        rows = self._s.scalars(
            select(IntentRow).where(IntentRow.status.in_(OPEN_INTENT_STATES)).order_by(IntentRow.id)
        )
        return [_intent(r) for r in rows]

    def intent(self, intent_id: int) -> Intent:
        return _intent(self._intent_row(intent_id))

    def log_action(
        self,
        *,
        action: str,
        command: Sequence[str],
        outcome: str,
        now: float,
        duration_s: float,
        rc: int | None = None,
        detail: str = "",
        slurm_job_id: str | None = None,
        job_id: int | None = None,
        intent_id: int | None = None,
    ) -> int:
        """Append one Slurm command and its outcome to the audit log."""
        row = SlurmActionRow(
            time=now,
            intent_id=intent_id,
            job_id=job_id,
            slurm_job_id=slurm_job_id,
            action=action,
            command=list(command),
            outcome=outcome,
            rc=rc,
            detail=detail[:_MAX_DETAIL],
            duration_s=duration_s,
        )
        self._s.add(row)
        self._s.flush()
        return row.id

    def actions(
        self, *, job_id: int | None = None, intent_id: int | None = None
    ) -> list[SlurmAction]:
        query = select(SlurmActionRow).order_by(SlurmActionRow.id)
        if job_id is not None:
            query = query.where(SlurmActionRow.job_id == job_id)
        if intent_id is not None:
            query = query.where(SlurmActionRow.intent_id == intent_id)
        return [_action(r) for r in self._s.scalars(query)]

    # ----- the inbox's ledger ------------------------------------------------------------
    def accepted_digest(self, *, slurm_job_id: str, seq: int) -> str | None:
        """The digest of the accepted report (Slurm job, seq), or None if there is none."""
        return self._s.scalar(
            select(AcceptedReportRow.digest).where(
                AcceptedReportRow.slurm_job_id == slurm_job_id, AcceptedReportRow.seq == seq
            )
        )

    def record_accepted(
        self,
        *,
        slurm_job_id: str,
        seq: int,
        kind: str,
        job_id: int,
        uid: int,
        digest: str,
        sent_time: float,
        now: float,
        munge_status: int,
    ) -> None:
        self._s.add(
            AcceptedReportRow(
                slurm_job_id=slurm_job_id,
                seq=seq,
                kind=kind,
                job_id=job_id,
                uid=uid,
                digest=digest,
                sent_time=sent_time,
                received_at=now,
                munge_status=munge_status,
            )
        )

    def accepted_count(self, *, job_id: int | None = None) -> int:
        query = select(func.count()).select_from(AcceptedReportRow)
        if job_id is not None:
            query = query.where(AcceptedReportRow.job_id == job_id)
        return int(self._s.scalar(query) or 0)

    def record_rejected(
        self,
        *,
        file: str,
        reason: str,
        size: int,
        now: float,
        slurm_job_id: str | None = None,
        seq: int | None = None,
        uid: int | None = None,
    ) -> None:
        self._s.add(
            RejectedReportRow(
                received_at=now,
                file=file[:1024],
                slurm_job_id=slurm_job_id,
                seq=seq,
                uid=uid,
                size=size,
                reason=reason[:_MAX_DETAIL],
            )
        )

    def rejected_reports(self) -> list[RejectedReport]:
        rows = self._s.scalars(select(RejectedReportRow).order_by(RejectedReportRow.id))
        return [
            RejectedReport(
                id=r.id,
                received_at=r.received_at,
                file=r.file,
                slurm_job_id=r.slurm_job_id,
                seq=r.seq,
                uid=r.uid,
                size=r.size,
                reason=r.reason,
            )
            for r in rows
        ]

    # ----- the tick's read ---------------------------------------------------------------
    def snapshot(self, *, include_finished: bool = False) -> StoreSnapshot:
        """Every (active) job with its measurements, the last round and open intents; a
        fixed number of queries whatever the number of jobs."""
        jobs = self.jobs(states=None if include_finished else ACTIVE_STATES)
        ids = [j.id for j in jobs]
        samples = _group(
            self._s.scalars(
                select(ProfileSampleRow)
                .where(ProfileSampleRow.job_id.in_(ids))
                .order_by(ProfileSampleRow.id)
            ),
            lambda r: ProfileSample(**{k: getattr(r, k) for k in _SAMPLE_FIELDS}),
        )
        metrics = _group(
            self._s.scalars(
                select(MetricRow)
                .where(MetricRow.job_id.in_(ids))
                .order_by(MetricRow.epoch, MetricRow.id)
            ),
            lambda r: MetricReport(epoch=r.epoch, name=r.name, value=r.value),
        )
        latest = (
            select(GradStatsRow.job_id, func.max(GradStatsRow.epoch).label("epoch"))
            .where(GradStatsRow.job_id.in_(ids))
            .group_by(GradStatsRow.job_id)
            .subquery()
        )
        grads = {
            r.job_id: GradStats(
                epoch=r.epoch,
                frozen=r.frozen,
                grad_var=tuple(r.grad_var),
                grad_sqr=tuple(r.grad_sqr),
            )
            for r in self._s.scalars(
                select(GradStatsRow).join(
                    latest,
                    (GradStatsRow.job_id == latest.c.job_id)
                    & (GradStatsRow.epoch == latest.c.epoch),
                )
            )
        }
        views = tuple(
            JobView(
                job=j,
                samples=tuple(samples.get(j.id, ())),
                grad_stats=grads.get(j.id),
                metrics=tuple(metrics.get(j.id, ())),
            )
            for j in jobs
        )
        return StoreSnapshot(
            jobs=views, last_round=self.round(), open_intents=tuple(self.open_intents())
        )

    # ----- helpers -----------------------------------------------------------------------
    def _job_row(self, job_id: int) -> Job:
        row = self._s.get(Job, job_id)
        if row is None:
            raise StoreError(f"no icefrog job {job_id}")
        return row

    def _intent_row(self, intent_id: int) -> IntentRow:
        row = self._s.get(IntentRow, intent_id)
        if row is None:
            raise StoreError(f"no intent {intent_id}")
        return row

    def _require_free_slurm_id(self, slurm_job_id: str) -> None:
        link = self._s.get(SlurmJob, slurm_job_id)
        if link is not None:
            raise StoreError(
                f"Slurm job {slurm_job_id} already belongs to icefrog job {link.job_id}"
            )


def _group(rows: Iterable[Any], convert: Any) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for row in rows:
        out.setdefault(row.job_id, []).append(convert(row))
    return out


def _spec_columns(spec: JobSpec) -> dict[str, Any]:
    values = asdict(spec)
    for name in ("layer_flops", "layer_param_bytes", "layer_boundaries"):
        values[name] = list(values[name])
    return values


def _job_record(row: Job) -> JobRecord:
    spec_values = {name: getattr(row, name) for name in _SPEC_FIELDS}
    for name in ("layer_flops", "layer_param_bytes", "layer_boundaries"):
        spec_values[name] = tuple(spec_values[name])
    return JobRecord(
        id=row.id,
        name=row.name,
        owner_uid=row.owner_uid,
        owner_user=row.owner_user,
        state=row.state,
        submit_time=row.submit_time,
        start_time=row.start_time,
        end_time=row.end_time,
        spec=JobSpec(**spec_values),
        slurm_job_ids=tuple(link.slurm_job_id for link in row.slurm_jobs),
        progress=Progress(
            epoch=row.epoch,
            samples_done=row.samples_done,
            effective_samples_done=row.effective_samples_done,
            checkpoint_path=row.checkpoint_path,
            time=row.progress_time,
        ),
        finish_reason=row.finish_reason,
        final_metric=row.final_metric,
    )


def _allocation(r: AllocationRow) -> Allocation:
    return Allocation(
        job_id=r.job_id,
        gpus=r.gpus,
        batch=r.batch,
        frozen=r.frozen,
        shared=r.shared,
        nodes=tuple(r.nodes),
        psi=r.psi,
        predicted_tta_s=r.predicted_tta_s,
        share=r.share,
    )


def _intent(r: IntentRow) -> Intent:
    return Intent(
        id=r.id,
        round_no=r.round_no,
        job_id=r.job_id,
        action=r.action,
        params=dict(r.params),
        status=r.status,
        attempts=r.attempts,
        created_at=r.created_at,
        updated_at=r.updated_at,
        detail=r.detail,
    )


def _action(r: SlurmActionRow) -> SlurmAction:
    return SlurmAction(
        id=r.id,
        time=r.time,
        intent_id=r.intent_id,
        job_id=r.job_id,
        slurm_job_id=r.slurm_job_id,
        action=r.action,
        command=tuple(r.command),
        outcome=r.outcome,
        rc=r.rc,
        detail=r.detail,
        duration_s=r.duration_s,
    )
