"""Rounds, reconcile intents, the Slurm audit log and the report ledger.

The part of a store transaction (:class:`~icefrog_slurm.store.tx.SqlStoreTx` inherits it) that
records what the controller decided and did, and which reports it accepted or rejected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cache
from operator import attrgetter
from typing import Any, TypeVar

from sqlalchemy import Table, bindparam, delete, func, insert, select, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from icefrog_slurm.domain.records import (
    ACTIVE_STATES,
    GRANTING_ACTIONS,
    INTENT_END_STATES,
    OPEN_INTENT_STATES,
    Allocation,
    Intent,
    NewIntent,
    RoundRecord,
    SlurmAction,
)
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.store.models import (
    AcceptedReportRow,
    AllocationRow,
    IntentRow,
    JobRow,
    RejectedReportRow,
    RoundRow,
    SlurmActionRow,
)

_T = TypeVar("_T")
MAX_DETAIL = 4000
"""The most of an intent's or a Slurm command's detail kept, made printable first
(``jsonio.printable``): Slurm's words may quote a job's name, its owner's text."""
KEPT_REPORTS = 1024
"""Accepted reports of one Slurm job the ledger keeps, its latest by seq (a job's reports
come in seq order; more than a drain's per-owner share, so the reports a drain applied
before a kill are still known when the next drain meets them again)."""


@dataclass(frozen=True)
class RejectedReport:
    """A report the inbox refused, and why (``icefrog`` reports list them)."""

    id: int
    received_at: float
    file: str
    slurm_job_id: str | None
    seq: int | None
    uid: int | None
    size: int
    reason: str


class StoreError(IcefrogError):
    """A store call that breaks an invariant (unknown job, a Slurm id already taken...)."""


@dataclass
class RoundMemo:
    """The last round a transaction read that it had not written itself, kept between the
    store's transactions: a recorded round is never changed, and one read from committed
    rows stays true (a transaction's own round could still be rolled back, so it is not
    kept). Every tick reads the last round; between rounds it is this one."""

    last: RoundRecord | None = None


class LedgerTx:
    """Decisions, intents, actions and the report ledger, inside one transaction."""

    def __init__(self, session: Session, rounds: RoundMemo | None = None) -> None:
        self._s = session
        self._rounds = RoundMemo() if rounds is None else rounds
        self._written_rounds: set[int] = set()  # rounds this transaction recorded

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
        reasons: Mapping[int, str] | None = None,
    ) -> None:
        """Record a round's decision: one row for the round, one a job, with the reason the
        policy gave for a job (why it waits) when it gave one."""
        self._written_rounds.add(round_no)
        self._s.execute(
            insert(table(RoundRow)),
            dict(
                round_no=round_no,
                time=now,
                policy=policy,
                capacity_gpus=capacity_gpus,
                solve_s=solve_s,
                min_share=min_share,
            ),
        )
        if allocations:  # one bulk INSERT of plain rows, not one ORM object a job
            why = reasons or {}
            names = field_names(Allocation)  # asdict would deep-copy every field
            values = attrgetter(*names)
            rows = [
                dict(
                    zip(names, values(a), strict=True),
                    round_no=round_no,
                    nodes=list(a.nodes),
                    reason=why.get(a.job_id, ""),
                )
                for a in allocations
            ]
            self._s.execute(insert(table(AllocationRow)), rows)

    def round(self, round_no: int | None = None) -> RoundRecord | None:
        """A round's decision (the last one when ``round_no`` is None)."""
        if round_no is None:
            round_no = self._s.scalar(select(func.max(RoundRow.round_no)))
        if round_no is None:
            return None
        committed = round_no not in self._written_rounds
        kept = self._rounds.last
        if committed and kept is not None and kept.round_no == round_no:
            return kept
        row = self._s.get(RoundRow, round_no)
        if row is None:
            return None
        allocs = self._s.execute(
            select(*columns(AllocationRow))
            .where(AllocationRow.round_no == row.round_no)
            .order_by(AllocationRow.job_id)
        )
        out = record(RoundRecord, row, allocations=tuple(_allocation(a) for a in allocs))
        if committed:
            self._rounds.last = out
        return out

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
            self._s.execute(_SUPERSEDE, dict(p_job=job_id, p_now=now))
        row = _intent_row(job_id, action, params, now, round_no)
        return int(self._s.execute(_ADD_INTENT, row).scalar_one())

    def add_intents(
        self, *, intents: Sequence[NewIntent], now: float, round_no: int | None = None
    ) -> None:
        """:meth:`add_intent` for several jobs at once, none superseding: one statement
        (a round's new intents; the round closes the ones it replaces first)."""
        if intents:
            rows = [
                _intent_row(job, action, params, now, round_no) for job, action, params in intents
            ]
            self._s.execute(_ADD_INTENTS, rows)

    def start_intent(self, *, intent_id: int, now: float) -> Intent:
        """Mark an intent as being acted on (counts the attempt); commit before acting."""
        before = self.intent(intent_id)
        if before.status not in OPEN_INTENT_STATES:
            raise StoreError(f"intent {intent_id} is {before.status}, not open")
        self._s.execute(_START_INTENT, dict(p_id=intent_id, p_now=now))
        return replace(before, status="acting", attempts=before.attempts + 1, updated_at=now)

    def finish_intent(self, *, intent_id: int, status: str, now: float, detail: str = "") -> None:
        if status not in INTENT_END_STATES:
            raise StoreError(
                f"intent status {status!r}: must be one of {', '.join(INTENT_END_STATES)}"
            )
        kept = printable(detail, MAX_DETAIL - 3)  # (3: the '...' of a cut)
        done = self._s.execute(
            _FINISH_INTENT, dict(p_id=intent_id, p_status=status, p_now=now, p_detail=kept)
        )
        if not done.rowcount:  # type: ignore[attr-defined]
            raise StoreError(f"no intent {intent_id}")

    def open_intents(self) -> list[Intent]:
        """Intents written but not finished: what a restarted reconcile must check."""
        return [_intent(r) for r in self._s.execute(_OPEN_INTENTS)]

    def granted(self) -> dict[int, dict[str, Any]]:
        """Each active job's target (``SlurmRequest.params``) as its last done ``start``,
        ``change`` or ``stop`` intent left it: what the controller released it with, or
        held it at (a job the store still records pending may have started since). A job
        no such intent has ended yet is absent."""
        rows = self._s.execute(_LAST_GRANTS)
        return {r.job_id: dict(r.params) for r in rows if r.params is not None}

    def intent(self, intent_id: int) -> Intent:
        row = self._s.execute(_INTENT, dict(p_id=intent_id)).first()
        if row is None:
            raise StoreError(f"no intent {intent_id}")
        return _intent(row)

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
        values = dict(
            time=now,
            intent_id=intent_id,
            job_id=job_id,
            slurm_job_id=slurm_job_id,
            action=action,
            command=list(command),
            outcome=outcome,
            rc=rc,
            detail=printable(detail, MAX_DETAIL - 3),
            duration_s=duration_s,
        )
        return int(self._s.execute(_LOG_ACTION, values).scalar_one())

    def actions(
        self, *, job_id: int | None = None, intent_id: int | None = None
    ) -> list[SlurmAction]:
        """The audit log (of a job, of an intent), oldest first, as plain rows."""
        query = _ACTIONS[job_id is not None, intent_id is not None]
        rows = self._s.execute(query, dict(p_job=job_id, p_intent=intent_id))
        return [_action(r) for r in rows]

    # ----- the inbox's ledger ------------------------------------------------------------
    def accepted_digest(self, *, slurm_job_id: str, seq: int) -> str | None:
        """The digest of the accepted report (Slurm job, seq), or None if there is none."""
        return self._s.scalar(
            select(AcceptedReportRow.digest).where(
                AcceptedReportRow.slurm_job_id == slurm_job_id, AcceptedReportRow.seq == seq
            )
        )

    def oldest_kept_seq(self, *, slurm_job_id: str) -> int | None:
        """The oldest of the :data:`KEPT_REPORTS` latest accepted seqs of a Slurm job, None
        while it has fewer: a report older than it can no longer be told from a replay."""
        return self._s.scalar(
            select(AcceptedReportRow.seq)
            .where(AcceptedReportRow.slurm_job_id == slurm_job_id)
            .order_by(AcceptedReportRow.seq.desc())
            .offset(KEPT_REPORTS - 1)
            .limit(1)
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
        oldest_kept: int | None,
    ) -> None:
        """Record an accepted report; with ``oldest_kept`` (:meth:`oldest_kept_seq` before
        it, which ``seq`` passes) the job's rows up to that seq go, so that it keeps
        :data:`KEPT_REPORTS` of them however long it reports."""
        if oldest_kept is not None:
            self._s.execute(
                delete(AcceptedReportRow).where(
                    AcceptedReportRow.slurm_job_id == slurm_job_id,
                    AcceptedReportRow.seq <= oldest_kept,
                )
            )
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
                reason=reason[:MAX_DETAIL],
            )
        )

    def rejected_reports(self) -> list[RejectedReport]:
        rows = self._s.scalars(select(RejectedReportRow).order_by(RejectedReportRow.id))
        return [record(RejectedReport, r) for r in rows]

    def prune_reports(self, *, before: float) -> int:
        """Delete ledger rows received before ``before``: every rejected report, and the
        accepted reports of jobs that have ended (an active job's rows keep refusing a
        replay of its sequence numbers). Returns the number of rows deleted."""
        ended = select(JobRow.id).where(JobRow.state.not_in(ACTIVE_STATES))
        done = self._s.execute(
            delete(AcceptedReportRow).where(
                AcceptedReportRow.received_at < before, AcceptedReportRow.job_id.in_(ended)
            )
        )
        gone = self._s.execute(
            delete(RejectedReportRow).where(RejectedReportRow.received_at < before)
        )
        return int(done.rowcount or 0) + int(gone.rowcount or 0)  # type: ignore[attr-defined]


def table(model: Any) -> Table:
    """A model's table: statements on it are plain, without the ORM's bulk and
    synchronisation work (an ORM-enabled INSERT costs several times the plain one)."""
    out: Table = model.__table__
    return out


def columns(model: type[Any]) -> list[Any]:
    """Every column of a model, to select plain rows instead of ORM objects."""
    return [getattr(model, attr.key) for attr in sa_inspect(model).column_attrs]


def record(cls: type[_T], row: Any, **override: Any) -> _T:
    """An immutable record from an ORM row: same-named fields copied, some converted."""
    values = {name: getattr(row, name) for name in field_names(cls) if name not in override}  # type: ignore[arg-type]
    return cls(**values, **override)


@cache
def field_names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _allocation(r: Any) -> Allocation:
    return record(Allocation, r, nodes=tuple(r.nodes))


def _intent(r: Any) -> Intent:
    return record(Intent, r, params=dict(r.params))


def _action(r: Any) -> SlurmAction:
    return record(SlurmAction, r, command=tuple(r.command))


def _intent_row(
    job_id: int | None, action: str, params: Mapping[str, Any], now: float, round_no: int | None
) -> dict[str, Any]:
    """A new intent's row: pending, not yet attempted."""
    return dict(
        round_no=round_no, job_id=job_id, action=action, params=dict(params), status="pending",
        attempts=0, created_at=now, updated_at=now, detail="",
    )  # fmt: skip


# Statements built once, on the tables (plain statements: no ORM object, no ORM compile or
# bulk step), read as plain rows: reconcile runs several of these a step, and a statement
# built once skips SQLAlchemy's per-call construction.
_I, _A = table(IntentRow).c, table(SlurmActionRow).c
_INTENT_COLUMNS = select(*(_I[n] for n in field_names(Intent)))
_OPEN_INTENTS = _INTENT_COLUMNS.where(_I.status.in_(OPEN_INTENT_STATES)).order_by(_I.id)
_LAST_GRANT = (
    select(_I.params["target"])
    .where(
        _I.job_id == JobRow.id,
        _I.status == "done",
        _I.action.in_(GRANTING_ACTIONS),
    )
    .order_by(_I.id.desc())
    .limit(1)
    .correlate(JobRow)
    .scalar_subquery()
)
_LAST_GRANTS = select(JobRow.id.label("job_id"), _LAST_GRANT.label("params")).where(
    JobRow.state.in_(ACTIVE_STATES)
)
_INTENT = _INTENT_COLUMNS.where(_I.id == bindparam("p_id"))
_ADD_INTENTS = insert(table(IntentRow))
_ADD_INTENT = _ADD_INTENTS.returning(_I.id)
_SUPERSEDE = (
    update(table(IntentRow))
    .where(_I.job_id == bindparam("p_job"), _I.status.in_(OPEN_INTENT_STATES))
    .values(status="superseded", updated_at=bindparam("p_now"))
)
_START_INTENT = (
    update(table(IntentRow))
    .where(_I.id == bindparam("p_id"))
    .values(status="acting", attempts=_I.attempts + 1, updated_at=bindparam("p_now"))
)
_FINISH_INTENT = (
    update(table(IntentRow))
    .where(_I.id == bindparam("p_id"))
    .values(status=bindparam("p_status"), updated_at=bindparam("p_now"),
            detail=bindparam("p_detail"))
)  # fmt: skip
_LOG_ACTION = insert(table(SlurmActionRow)).returning(_A.id)
_ACTION_COLUMNS = select(*(_A[n] for n in field_names(SlurmAction)))
_ACTIONS = {
    (by_job, by_intent): _ACTION_COLUMNS.where(
        *([_A.job_id == bindparam("p_job")] if by_job else []),
        *([_A.intent_id == bindparam("p_intent")] if by_intent else []),
    ).order_by(_A.id)
    for by_job in (False, True)
    for by_intent in (False, True)
}
