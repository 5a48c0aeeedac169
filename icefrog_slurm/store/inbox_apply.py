"""What an accepted report changes in the store (the inbox's last step, inside one transaction).

The inbox (``inbox.py``) has proven who sent which content for which Slurm job (a
:class:`Claim`); :func:`apply_report` checks it against the store's ledger and jobs and
applies it: a ``register`` creates the icefrog job (only for a Slurm job that carries the
icefrog tag and is pending held: the first register is ``icefrog submit``'s, sent before it
releases its job; a resubmission the controller made is linked to its job before it is
released, so its register is never a first one), every other kind updates the job it is
bound to, and the ledger records the report so a replay of its (Slurm job, seq) changes
nothing.
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass
from typing import Any

from icefrog_slurm import protocol
from icefrog_slurm.store.inbox_files import Rejected
from icefrog_slurm.store.tx import SqlStoreTx


@dataclass(frozen=True)
class Claim:
    """What a checked report proves: who sent what for which Slurm job."""

    envelope: protocol.Envelope
    uid: int
    digest: str
    munge_status: int


def apply_report(
    tx: SqlStoreTx, claim: Claim, *, icefrog: bool, held: bool, compound: bool, now: float
) -> tuple[str, int | None]:
    """Apply a checked report in ``tx``: ("accepted", the icefrog job's id), or
    ("duplicate", None) for a duplicate of an accepted one; raises Rejected when the store
    says no (seq reused, another job's, register refused)."""
    env = claim.envelope
    seen = tx.accepted_digest(slurm_job_id=env.slurm_job_id, seq=env.seq)
    if seen == claim.digest:
        return "duplicate", None
    if seen is not None:
        raise Rejected(f"seq {env.seq} of Slurm job {env.slurm_job_id} was used for other content")
    oldest_kept = tx.oldest_kept_seq(slurm_job_id=env.slurm_job_id)
    if oldest_kept is not None and env.seq < oldest_kept:
        raise Rejected(
            f"seq {env.seq} of Slurm job {env.slurm_job_id} is older than the reports of it "
            f"the ledger keeps (seq {oldest_kept} on): a replay, or one applied already"
        )
    if claim.uid > protocol.INT32_MAX:
        raise Rejected(f"uid {claim.uid} does not fit the store's 32-bit uid column")
    payload = protocol.parse_payload(env.kind, env.payload)
    job = tx.job_by_slurm_id(env.slurm_job_id)
    if job is None:
        job_id = _register(tx, claim, icefrog, held, payload, now, compound=compound)
    else:
        if job.owner_uid != claim.uid or job.name != env.job_name:
            raise Rejected(
                f"Slurm job {env.slurm_job_id} is bound to icefrog job {job.id} "
                f"({job.name!r} of uid {job.owner_uid})"
            )
        job_id = job.id
        _apply_payload(tx, job_id, env, payload, now)
    tx.record_accepted(
        slurm_job_id=env.slurm_job_id,
        seq=env.seq,
        kind=env.kind,
        job_id=job_id,
        uid=claim.uid,
        digest=claim.digest,
        sent_time=env.time,
        now=now,
        munge_status=claim.munge_status,
        oldest_kept=oldest_kept,
    )
    return "accepted", job_id


def _register(
    tx: SqlStoreTx,
    claim: Claim,
    icefrog: bool,
    held: bool,
    payload: Any,
    now: float,
    *,
    compound: bool,
) -> int:
    """A new icefrog job for a ``register`` report of an icefrog-tagged, pending-held Slurm
    job (``icefrog submit``'s); a job already running (or released) was started outside
    the plan, and runs unmanaged whatever its comment says."""
    env = claim.envelope
    if env.kind != "register":
        raise Rejected(f"Slurm job {env.slurm_job_id} has no icefrog job: register first")
    if not icefrog:
        raise Rejected(
            f"Slurm job {env.slurm_job_id} does not carry the icefrog tag (comment "
            "icefrog:...): only jobs submitted by icefrog are adopted"
        )
    if compound:
        raise Rejected(
            f"Slurm job {env.slurm_job_id} is an array or heterogeneous job: Slurm would "
            "release all its parts at once; only single jobs are adopted"
        )
    if not held:
        raise Rejected(
            f"Slurm job {env.slurm_job_id} is not pending held: only icefrog submit registers "
            "a job first (while it holds it); a job started outside the plan runs unmanaged"
        )
    return tx.create_job(
        name=env.job_name,
        owner_uid=claim.uid,
        owner_user=user_name(claim.uid)[:64],
        slurm_job_id=env.slurm_job_id,
        spec=payload,
        now=now,
    )


KEPT_A_JOB = {"profile": 8192, "metric": 20_000}
"""Rows the store keeps of one job's profile samples and metric values (a simulated job
sends about a hundred samples; a job of thousands of epochs stays far below): past them a
report of that kind is rejected, so one user's flood cannot grow what every round reads
without bound. Of its gradient statistics the store keeps the latest epochs alone
(``tx.KEPT_GRAD_EPOCHS``)."""


def _apply_payload(
    tx: SqlStoreTx, job_id: int, env: protocol.Envelope, payload: Any, now: float
) -> None:
    if env.kind in KEPT_A_JOB:
        adding = len(payload) if isinstance(payload, list) else 1
        kept = tx.kept_rows(job_id=job_id, kind=env.kind)
        if kept + adding > KEPT_A_JOB[env.kind]:
            raise Rejected(
                f"Slurm job {env.slurm_job_id}: {kept} {env.kind} rows kept and {adding} more "
                f"would pass the {KEPT_A_JOB[env.kind]} a job may keep"
            )
    if isinstance(payload, protocol.JobSpec):
        tx.set_spec(job_id=job_id, spec=payload)
    elif isinstance(payload, list):
        tx.add_profile_samples(
            job_id=job_id, slurm_job_id=env.slurm_job_id, samples=payload, now=now
        )
    elif isinstance(payload, protocol.GradStats):
        tx.put_grad_stats(job_id=job_id, stats=payload, now=now)
    elif isinstance(payload, protocol.MetricReport):
        tx.put_metric(job_id=job_id, metric=payload, now=now)
    elif isinstance(payload, protocol.ProgressReport):
        tx.set_progress(job_id=job_id, progress=payload, sent_time=env.time)
    elif isinstance(payload, protocol.FinishedReport):
        tx.mark_finished(job_id=job_id, report=payload, now=now)
    else:  # pragma: no cover - parse_payload returns one of the above
        raise Rejected(f"report kind {env.kind}: nothing to apply")


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)
