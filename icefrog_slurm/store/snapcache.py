"""What a tick's snapshot read last time, kept by the store so the next snapshot reads and
decodes again only what changed.

Measurements. A round needs every active job's profile samples, metrics and latest gradient
statistics: tens of thousands of rows at 2400 jobs, most unchanged since the last round.
:class:`SnapshotCache` keeps what it read, by job, with each job's *mark* per table: one
aggregate query a table (``count``, ``max(id)``, ``max(time)``, and for metrics the sum of
the values; for gradient statistics the latest epoch), computed by the database. Only the
jobs whose mark differs are read again, and a job whose rows are gone is dropped. Samples
are only inserted; metrics and gradient statistics are inserted or replaced with a new
``time`` (``tx.put_metric``, ``tx.put_grad_stats``), so any change moves a mark. The marks
and the rows come from the same transaction, so they agree.

Specs. A job's spec holds its per-layer table as JSON; the jobs query reads those columns
as text, and a job's :class:`JobSpec` is decoded again only when its columns differ from
the text it was decoded from (``set_spec`` changes them).

The last round. Every tick reads it (between rounds, the decision that stands); a
recorded round never changes, so it is decoded once (``RoundMemo``, store/ledger.py).

Rows are read as plain tuples straight into the records, field by field in order: no ORM
object, no per-row dictionary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.protocol import GradStats, JobSpec, MetricReport
from icefrog_slurm.store.ledger import RoundMemo
from icefrog_slurm.store.models import GradStatsRow, MetricRow, ProfileSampleRow

CHUNK = 5000  # job ids per IN (...) list: well under SQLite's and Postgres' parameter limits

Mark = tuple[Any, ...]
Read = tuple[
    dict[int, tuple[ProfileSample, ...]], dict[int, tuple[MetricReport, ...]], dict[int, GradStats]
]


@dataclass
class _Kept:
    marks: dict[int, Mark] = field(default_factory=dict)
    values: dict[int, Any] = field(default_factory=dict)

    def refresh(
        self, marks: dict[int, Mark], read: Callable[[Sequence[int]], dict[int, Any]]
    ) -> dict[int, Any]:
        """Take ``marks`` (job id -> mark, this read's), read the jobs whose mark moved."""
        changed = [j for j, m in marks.items() if self.marks.get(j) != m]
        for gone in set(self.values) - set(marks):
            del self.values[gone]
        for ids in _chunks(changed):
            fresh = read(ids)
            for j in ids:
                self.values[j] = fresh.get(j)
        self.marks = marks
        return self.values


class SnapshotCache:
    """Each job's measurements and decoded spec, kept between snapshots (module
    docstring). One instance a store, used inside its transactions."""

    def __init__(self) -> None:
        self._samples = _Kept()
        self._metrics = _Kept()
        self._grads = _Kept()
        self._specs: dict[int, tuple[Mark, JobSpec]] = {}
        self.rounds = RoundMemo()  # the last round read (store/ledger.py)

    def spec(self, job_id: int, text: Mark, decode: Callable[[], JobSpec]) -> JobSpec:
        """The job's spec: decoded again only when its columns' ``text`` changed."""
        known = self._specs.get(job_id)
        if known is not None and known[0] == text:
            return known[1]
        spec = decode()
        self._specs[job_id] = (text, spec)
        return spec

    def forget_specs(self, keep: Iterable[int]) -> None:
        """Drop the specs of jobs no longer read (ended jobs)."""
        kept = set(keep)
        for job_id in [j for j in self._specs if j not in kept]:
            del self._specs[job_id]

    def measurements(self, session: Session, job_ids: Select[Any]) -> Read:
        """(samples, metrics, latest gradient statistics) by job id, for the jobs that
        ``job_ids`` (a subquery of job ids) selects."""
        s_marks = _marks(session, ProfileSampleRow, job_ids)
        m_marks = _marks(session, MetricRow, job_ids, func.sum(MetricRow.value))
        g_marks = _marks(session, GradStatsRow, job_ids, func.max(GradStatsRow.epoch))
        samples = self._samples.refresh(s_marks, lambda ids: _samples(session, ids))
        metrics = self._metrics.refresh(m_marks, lambda ids: _metrics(session, ids))
        grads = self._grads.refresh(g_marks, lambda ids: _grads(session, ids))
        return samples, metrics, grads


def _marks(session: Session, model: Any, job_ids: Select[Any], *extra: Any) -> dict[int, Mark]:
    query = (
        select(model.job_id, func.count(), func.max(model.id), func.max(model.time), *extra)
        .where(model.job_id.in_(job_ids))
        .group_by(model.job_id)
    )
    return {row[0]: tuple(row[1:]) for row in session.execute(query)}


_SAMPLE_FIELDS = tuple(f.name for f in fields(ProfileSample))
_METRIC_FIELDS = tuple(f.name for f in fields(MetricReport))


def _samples(session: Session, ids: Sequence[int]) -> dict[int, tuple[ProfileSample, ...]]:
    cols = [getattr(ProfileSampleRow, f) for f in _SAMPLE_FIELDS]
    rows = session.execute(
        select(ProfileSampleRow.job_id, *cols)
        .where(ProfileSampleRow.job_id.in_(ids))
        .order_by(ProfileSampleRow.id)
    )
    return _grouped((r[0], ProfileSample(*r[1:])) for r in rows)


def _metrics(session: Session, ids: Sequence[int]) -> dict[int, tuple[MetricReport, ...]]:
    cols = [getattr(MetricRow, f) for f in _METRIC_FIELDS]
    rows = session.execute(
        select(MetricRow.job_id, *cols)
        .where(MetricRow.job_id.in_(ids))
        .order_by(MetricRow.epoch, MetricRow.id)
    )
    return _grouped((r[0], MetricReport(*r[1:])) for r in rows)


def _grads(session: Session, ids: Sequence[int]) -> dict[int, GradStats]:
    latest = (
        select(GradStatsRow.job_id, func.max(GradStatsRow.epoch).label("epoch"))
        .where(GradStatsRow.job_id.in_(ids))
        .group_by(GradStatsRow.job_id)
        .subquery()
    )
    g = GradStatsRow
    rows = session.execute(
        select(g.job_id, g.epoch, g.frozen, g.grad_var, g.grad_sqr).join(
            latest, (g.job_id == latest.c.job_id) & (g.epoch == latest.c.epoch)
        )
    )
    return {
        job: GradStats(epoch=epoch, frozen=frozen, grad_var=tuple(var), grad_sqr=tuple(sqr))
        for job, epoch, frozen, var, sqr in rows
    }


def _grouped(pairs: Iterable[tuple[int, Any]]) -> dict[int, tuple[Any, ...]]:
    out: dict[int, list[Any]] = {}
    for job, value in pairs:
        out.setdefault(job, []).append(value)
    return {job: tuple(values) for job, values in out.items()}


def _chunks(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]
