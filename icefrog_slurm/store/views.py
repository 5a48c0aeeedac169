"""Read-only queries for the reports (``icefrog squeue``, ``sacct``, ``show job``).

``ReportTx`` adds to the store's transaction the bulk reads the reports need: every
decision of many jobs with its round's time, the latest decision of each job, and metric
histories with the time each value arrived. Each is one query (per chunk of job ids) however
many jobs are asked for. Open one with ``SqlStore.reading()``::

    with store.reading() as session:
        tx = ReportTx(session)
        jobs = tx.jobs()
        history = tx.decision_history([j.id for j in jobs])

Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.store.ledger import columns
from icefrog_slurm.store.models import AllocationRow, MetricRow, RoundRow
from icefrog_slurm.store.tx import SqlStoreTx

CHUNK = 5000  # job ids per IN (...) list: well under SQLite's and Postgres' parameter limits


@dataclass(frozen=True)
class Decided:
    """One round's decision for one job, with the time the round was decided."""

    round_no: int
    time: float
    allocation: Allocation
    reason: str = ""  # the policy's "Word: detail" for a job it left waiting


@dataclass(frozen=True)
class TimedMetric:
    """One epoch's validation metric and when the store received it."""

    epoch: int
    name: str
    value: float
    time: float


class ReportTx(SqlStoreTx):
    """The store's transaction plus the reports' bulk reads."""

    def decision_history(self, job_ids: Collection[int]) -> dict[int, list[Decided]]:
        """Every round's decision for each job, oldest round first."""
        out: dict[int, list[Decided]] = {j: [] for j in job_ids}
        for ids in _chunks(job_ids):
            rows = self._s.execute(
                select(*_DECIDED)
                .join(RoundRow, RoundRow.round_no == AllocationRow.round_no)
                .where(AllocationRow.job_id.in_(ids))
                .order_by(AllocationRow.job_id, AllocationRow.round_no)
            )
            for row in rows:
                out[row[0]].append(_decided(row))
        return out

    def latest_decisions(self, job_ids: Collection[int]) -> dict[int, Decided]:
        """Each job's most recent decision (jobs no round has decided yet are absent)."""
        out: dict[int, Decided] = {}
        for ids in _chunks(job_ids):
            last = (
                select(AllocationRow.job_id, func.max(AllocationRow.round_no).label("round_no"))
                .where(AllocationRow.job_id.in_(ids))
                .group_by(AllocationRow.job_id)
                .subquery()
            )
            rows = self._s.execute(
                select(*_DECIDED)
                .join(RoundRow, RoundRow.round_no == AllocationRow.round_no)
                .join(
                    last,
                    (AllocationRow.job_id == last.c.job_id)
                    & (AllocationRow.round_no == last.c.round_no),
                )
            )
            out.update((row[0], _decided(row)) for row in rows)
        return out

    def metric_history(self, job_ids: Collection[int]) -> dict[int, list[TimedMetric]]:
        """Every validation metric of each job, by epoch then arrival."""
        out: dict[int, list[TimedMetric]] = {j: [] for j in job_ids}
        for ids in _chunks(job_ids):
            rows = self._s.execute(
                select(*columns(MetricRow))
                .where(MetricRow.job_id.in_(ids))
                .order_by(MetricRow.job_id, MetricRow.epoch, MetricRow.id)
            )
            for r in rows:
                out[r.job_id].append(TimedMetric(r.epoch, r.name, r.value, r.time))
        return out


_DECIDED = (
    AllocationRow.job_id,
    AllocationRow.gpus,
    AllocationRow.batch,
    AllocationRow.frozen,
    AllocationRow.shared,
    AllocationRow.nodes,
    AllocationRow.psi,
    AllocationRow.predicted_tta_s,
    AllocationRow.share,
    AllocationRow.round_no,
    RoundRow.time,
    AllocationRow.reason,
)


def _decided(row: Any) -> Decided:
    # Unpacked by position: by-name access and ``ledger.record``'s dataclass introspection
    # cost more than the query when sacct reads every decision of thousands of jobs.
    job_id, gpus, batch, frozen, shared, nodes, psi, tta, share, round_no, t, reason = row
    allocation = Allocation(job_id, gpus, batch, frozen, shared, tuple(nodes), psi, tta, share)
    return Decided(round_no=round_no, time=t, allocation=allocation, reason=reason or "")


def _chunks(ids: Collection[int]) -> Iterator[Sequence[int]]:
    ordered = sorted(ids)
    for i in range(0, len(ordered), CHUNK):
        yield ordered[i : i + CHUNK]
