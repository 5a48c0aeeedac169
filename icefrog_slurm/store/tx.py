"""``SqlStoreTx``: every read and write of the store, inside one transaction of ``SqlStore``.

Methods take keyword arguments and return the domain's immutable records
(icefrog_slurm.domain.records); a caller never sees an ORM object or commits. Writes that
may be repeated (a requeued job re-sends an epoch's gradient statistics or metric) replace
the earlier row, so they are idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from functools import cache
from operator import itemgetter
from typing import Any

from sqlalchemy import Text, bindparam, cast, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from icefrog_slurm.core.parallelism import Parallelism
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.records import (
    ACTIVE_STATES,
    JOB_STATES,
    JobRecord,
    JobView,
    Progress,
    RoundRecord,
    StoreSnapshot,
)
from icefrog_slurm.protocol import FinishedReport, GradStats, JobSpec, MetricReport, ProgressReport
from icefrog_slurm.store.ledger import LedgerTx, StoreError, field_names, record, table
from icefrog_slurm.store.models import (
    GradStatsRow,
    JobRow,
    MetricRow,
    ProfileSampleRow,
    SlurmJobRow,
)
from icefrog_slurm.store.snapcache import SnapshotCache


class SqlStoreTx(LedgerTx):
    """The operations of one transaction (see :class:`SqlStore.transaction`).

    ``cache``: what earlier snapshots read (the store's, kept between its transactions;
    store/snapcache.py); none: everything is read and decoded afresh."""

    def __init__(self, session: Session, cache: SnapshotCache | None = None) -> None:
        self._cache = SnapshotCache() if cache is None else cache
        super().__init__(session, self._cache.rounds)

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
        row = JobRow(
            name=name,
            owner_uid=owner_uid,
            owner_user=owner_user,
            state="pending",
            submit_time=now,
            **_speccolumns(spec),
        )
        self._s.add(row)
        self._s.flush()
        self._s.add(
            SlurmJobRow(
                slurm_job_id=slurm_job_id,
                job_id=row.id,
                position=0,
                reason="submitted",
                created_at=now,
            )
        )
        return row.id

    def set_spec(self, *, job_id: int, spec: JobSpec) -> None:
        self._s.execute(update(JobRow).where(JobRow.id == job_id).values(**_speccolumns(spec)))

    def link_slurm_job(self, *, job_id: int, slurm_job_id: str, reason: str, now: float) -> None:
        """Append a Slurm job (a resubmission) to the chain; the job keeps its identity."""
        job = self._job_row(job_id)
        self._require_free_slurm_id(slurm_job_id)
        self._s.add(
            SlurmJobRow(
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
        # one UPDATE, no ORM load and flush: a round that starts 960 jobs sets 960 states
        statement = _SET_STATE[state == "running", state not in ACTIVE_STATES]
        done = self._s.execute(statement, dict(p_id=job_id, p_state=state, p_now=now))
        if not done.rowcount:  # type: ignore[attr-defined]
            raise StoreError(f"no icefrog job {job_id}")
        loaded = self._s.identity_map.get(identity_key(JobRow, job_id))
        if loaded is not None:  # a job row this transaction already read: reload it
            self._s.expire(loaded)

    def job(self, job_id: int) -> JobRecord:
        """One job, read as a plain row (its spec decoded only when it changed)."""
        row = self._s.execute(_JOB, dict(p_id=job_id)).first()
        if row is None:
            raise StoreError(f"no icefrog job {job_id}")
        return self._job_record(row, self._s.scalars(_CHAIN, dict(p_id=job_id)).all())

    def job_by_slurm_id(self, slurm_job_id: str) -> JobRecord | None:
        """The icefrog job whose chain holds this Slurm job id, if any."""
        link = self._s.get(SlurmJobRow, slurm_job_id)
        return None if link is None else self.job(link.job_id)

    def jobs(self, *, states: Iterable[str] | None = None) -> list[JobRecord]:
        """Jobs (in ``states``), read as plain rows: no ORM object per job; a job's spec is
        decoded only when its columns changed since the cache last decoded it."""
        query, chains = _JOBS_ALL, _CHAINS_ALL
        if states is not None:
            query = query.where(_JOBS.state.in_(tuple(states)))
            chains = chains.where(_JOBS.state.in_(tuple(states)))
        chain = _group(self._s.execute(chains), lambda r: r.slurm_job_id)
        out = [self._job_record(row, chain.get(row.id, ())) for row in self._s.execute(query)]
        if states is not None and set(states) >= set(ACTIVE_STATES):
            self._cache.forget_specs(j.id for j in out)
        return out

    def _job_record(self, row: Any, chain: Sequence[str]) -> JobRecord:
        text = tuple(row[i] for i in _SPEC_AT)
        spec = self._cache.spec(row.id, text, lambda: _spec(row))
        return _job_record(row, chain, spec)

    # ----- what jobs measured -----------------------------------------------------------
    def add_profile_samples(
        self, *, job_id: int, slurm_job_id: str, samples: Sequence[ProfileSample], now: float
    ) -> None:
        if samples:
            self._s.execute(
                insert(table(ProfileSampleRow)),
                [
                    dict(job_id=job_id, slurm_job_id=slurm_job_id, time=now, **asdict(sample))
                    for sample in samples
                ],
            )

    def put_grad_stats(self, *, job_id: int, stats: GradStats, now: float) -> None:
        """Store one epoch's per-layer statistics, replacing a re-sent epoch, and keep only
        the job's :data:`KEPT_GRAD_EPOCHS` latest epochs (a round reads the latest alone;
        one epoch of 4096 layers is about 190 KB)."""
        self._s.execute(
            _upsert(self._s, GradStatsRow, ("job_id", "epoch")),
            dict(
                job_id=job_id,
                epoch=stats.epoch,
                frozen=stats.frozen,
                grad_var=list(stats.grad_var),
                grad_sqr=list(stats.grad_sqr),
                time=now,
            ),
        )
        self._s.execute(_OLD_GRAD_STATS, dict(p_job=job_id, p_keep=KEPT_GRAD_EPOCHS))

    def kept_rows(self, *, job_id: int, kind: str) -> int:
        """Rows of one job's ``profile`` samples, ``grad_stats`` epochs or ``metric`` values
        the store holds (what :data:`~icefrog_slurm.store.inbox_apply.KEPT_A_JOB` bounds)."""
        column = {
            "profile": ProfileSampleRow.job_id,
            "grad_stats": GradStatsRow.job_id,
            "metric": MetricRow.job_id,
        }[kind]
        return int(self._s.execute(select(func.count()).where(column == job_id)).scalar_one())

    def put_metric(self, *, job_id: int, metric: MetricReport, now: float) -> None:
        """Store one epoch's validation metric, replacing a re-sent one."""
        self._s.execute(
            _upsert(self._s, MetricRow, ("job_id", "epoch", "name")),
            dict(job_id=job_id, epoch=metric.epoch, name=metric.name, value=metric.value, time=now),
        )

    def set_progress(self, *, job_id: int, progress: ProgressReport, sent_time: float) -> None:
        """Keep the newest progress: an older report arriving late changes nothing."""
        self._s.execute(_SET_PROGRESS, dict(job_id=job_id, sent=sent_time, **asdict(progress)))
        loaded = self._s.identity_map.get(identity_key(JobRow, job_id))
        if loaded is not None:  # a job row this transaction already read: reload it
            self._s.expire(loaded)

    def mark_finished(self, *, job_id: int, report: FinishedReport, now: float) -> None:
        values = dict(p_id=job_id, p_reason=report.reason, p_metric=report.final_metric)
        self._s.execute(_FINISHED, values)
        self.set_state(
            job_id=job_id, state="failed" if report.reason == "failed" else "finished", now=now
        )

    # ----- the tick's read ---------------------------------------------------------------
    def snapshot(
        self,
        *,
        include_finished: bool = False,
        measurements: bool | Callable[[RoundRecord | None], bool] = True,
    ) -> StoreSnapshot:
        """Every (active) job, the last round and open intents, and unless ``measurements``
        is false each job's samples, metrics and latest gradient statistics (a tick between
        rounds needs none of them). ``measurements`` may be a test of the last round (the
        controller's: whether a round is due), so that round is read once. A fixed number
        of queries whatever the number of jobs."""
        states = None if include_finished else ACTIVE_STATES
        jobs = self.jobs(states=states)
        last_round, intents, granted = self.round(), tuple(self.open_intents()), self.granted()
        if callable(measurements):
            measurements = measurements(last_round)
        if not measurements:
            views = tuple(JobView(job=j, samples=(), grad_stats=None, metrics=()) for j in jobs)
            return StoreSnapshot(views, last_round, intents, measured=False, granted=granted)
        ids = select(JobRow.id)  # a subquery, not a list: no bound-parameter limit
        if states is not None:
            ids = ids.where(JobRow.state.in_(states))
        samples, metrics, grads = self._cache.measurements(self._s, ids)
        views = tuple(
            JobView(
                job=j,
                samples=samples.get(j.id) or (),
                grad_stats=grads.get(j.id),
                metrics=metrics.get(j.id) or (),
            )
            for j in jobs
        )
        return StoreSnapshot(
            jobs=views, last_round=last_round, open_intents=intents, granted=granted
        )

    # ----- helpers -----------------------------------------------------------------------
    def _job_row(self, job_id: int) -> JobRow:
        row = self._s.get(JobRow, job_id)
        if row is None:
            raise StoreError(f"no icefrog job {job_id}")
        return row

    def _require_free_slurm_id(self, slurm_job_id: str) -> None:
        link = self._s.get(SlurmJobRow, slurm_job_id)
        if link is not None:
            raise StoreError(
                f"Slurm job {slurm_job_id} already belongs to icefrog job {link.job_id}"
            )

    # ----- the inbox's batched lookups ----------------------------------------------------
    def slurm_job_owners(self, *, slurm_job_ids: Iterable[str]) -> dict[str, tuple[int, str]]:
        """(owner uid, job state) of the icefrog job of each Slurm job id the store knows."""
        ids, out = sorted(set(slurm_job_ids)), {}
        for start in range(0, len(ids), 500):  # bounded IN lists
            rows = self._s.execute(
                select(SlurmJobRow.slurm_job_id, JobRow.owner_uid, JobRow.state)
                .join(JobRow, JobRow.id == SlurmJobRow.job_id)
                .where(SlurmJobRow.slurm_job_id.in_(ids[start : start + 500]))
            )
            out.update({r.slurm_job_id: (r.owner_uid, r.state) for r in rows})
        return out


# Statements built once: executing a cached statement with parameters skips SQLAlchemy's
# per-call construction and cache-key work (most of the cost of a report at 500+ jobs).
_JOBS = table(JobRow).c
_SET_PROGRESS = (
    update(table(JobRow))
    .where(
        _JOBS.id == bindparam("job_id"),
        _JOBS.progress_time.is_(None) | (_JOBS.progress_time <= bindparam("sent")),
    )
    .values(
        epoch=bindparam("epoch"),
        samples_done=bindparam("samples_done"),
        effective_samples_done=bindparam("effective_samples_done"),
        checkpoint_path=bindparam("checkpoint_path"),
        progress_time=bindparam("sent"),
    )
)
KEPT_GRAD_EPOCHS = 8
"""Gradient-statistics epochs the store keeps of a job: those within this many of its
latest (which every round reads); older ones are deleted as new ones arrive."""

_LATEST_GRAD_EPOCH = (
    select(func.max(GradStatsRow.epoch))
    .where(GradStatsRow.job_id == bindparam("p_job"))
    .scalar_subquery()
)
_OLD_GRAD_STATS = delete(GradStatsRow).where(
    GradStatsRow.job_id == bindparam("p_job"),
    GradStatsRow.epoch <= _LATEST_GRAD_EPOCH - bindparam("p_keep"),
)

_FINISHED = (
    update(table(JobRow))
    .where(_JOBS.id == bindparam("p_id"))
    .values(finish_reason=bindparam("p_reason"), final_metric=bindparam("p_metric"))
)


@cache
def _upsert_for(dialect_name: str, model: Any, key: tuple[str, ...]) -> Any:
    """INSERT ... ON CONFLICT (key) DO UPDATE of every other column (SQLite and Postgres)."""
    stmt = (postgresql if dialect_name == "postgresql" else sqlite).insert(table(model))
    others = [c.name for c in model.__table__.columns if c.name not in key and c.name != "id"]
    return stmt.on_conflict_do_update(
        index_elements=list(key), set_={c: stmt.excluded[c] for c in others}
    )


def _upsert(session: Session, model: Any, key: tuple[str, ...]) -> Any:
    return _upsert_for(session.get_bind().dialect.name, model, key)


def _group(rows: Iterable[Any], convert: Any) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for row in rows:
        out.setdefault(row.job_id, []).append(convert(row))
    return out


def _speccolumns(spec: JobSpec) -> dict[str, Any]:
    values = asdict(spec)
    for name in ("layer_flops", "layer_param_bytes", "layer_boundaries"):
        values[name] = list(values[name])
    values["parallelism"] = spec.parallelism.to_json()
    return values


_LAYERS = ("layer_flops", "layer_param_bytes", "layer_boundaries")
_JSON_SPEC = (*_LAYERS, "parallelism")
# the jobs query: every column, the spec's JSON ones as their text (decoded only on change)
_JOB_COLUMNS = [cast(c, Text).label(c.key) if c.key in _JSON_SPEC else c for c in _JOBS]
_SPEC_AT = [i for i, c in enumerate(_JOB_COLUMNS) if c.key in field_names(JobSpec)]
_AT = {c.key: i for i, c in enumerate(_JOB_COLUMNS)}
# JobRecord's fields read straight from the row, and Progress's (``time`` is progress_time)
_RECORD_NAMES = tuple(
    n for n in field_names(JobRecord) if n not in ("spec", "slurm_job_ids", "progress")
)
_RECORD_VALUES = itemgetter(*(_AT[n] for n in _RECORD_NAMES))
_PROGRESS_VALUES = itemgetter(
    *(_AT["progress_time" if n == "time" else n] for n in field_names(Progress))
)
_JOBS_ALL = select(*_JOB_COLUMNS).order_by(_JOBS.id)
_JOB = select(*_JOB_COLUMNS).where(_JOBS.id == bindparam("p_id"))
_CHAINS = table(SlurmJobRow).c
_CHAINS_ALL = (
    select(_CHAINS.job_id, _CHAINS.slurm_job_id)
    .join_from(table(SlurmJobRow), table(JobRow), _JOBS.id == _CHAINS.job_id)
    .order_by(_CHAINS.job_id, _CHAINS.position)
)
_CHAIN = (
    select(_CHAINS.slurm_job_id)
    .where(_CHAINS.job_id == bindparam("p_id"))
    .order_by(_CHAINS.position)
)
_SET_STATE = {
    (running, ended): update(table(JobRow))
    .where(_JOBS.id == bindparam("p_id"))
    .values(
        state=bindparam("p_state"),
        **({"start_time": func.coalesce(_JOBS.start_time, bindparam("p_now"))} if running else {}),
        **({"end_time": func.coalesce(_JOBS.end_time, bindparam("p_now"))} if ended else {}),
    )
    for running in (False, True)
    for ended in (False, True)
}


def _spec(row: Any) -> JobSpec:
    """A row's spec; the JSON columns either decoded (an ORM row) or as text (jobs())."""

    def value(name: str) -> Any:
        v = getattr(row, name)
        return json.loads(v) if isinstance(v, str) else v

    layers = {n: tuple(value(n)) for n in _LAYERS}
    parallelism = Parallelism.from_json(value("parallelism"))
    return record(JobSpec, row, parallelism=parallelism, **layers)


def _job_record(row: Any, chain: Sequence[str], spec: JobSpec) -> JobRecord:
    """A job's record from a row of ``_JOB_COLUMNS``, field by field in order (no per-row
    dictionary of names: 2400 jobs a tick)."""
    return JobRecord(
        **dict(zip(_RECORD_NAMES, _RECORD_VALUES(row), strict=True)),
        spec=spec,
        slurm_job_ids=tuple(chain),
        progress=Progress(*_PROGRESS_VALUES(row)),
    )
