"""Record: write a plan into the store, inside the tick's transaction, before anything
happens on Slurm (the :class:`~icefrog_slurm.controller.reconcile.Reconciler` enacts it).

``record(plan, tx)`` writes the round's decision, the jobs' new store states, and one
*intent* per job action (its target resources). An open intent whose target equals the new
plan's is kept (its progress, e.g. "already asked to checkpoint", lives in the audit log); a
different one is superseded; one whose job a round finds converged ends ``done`` when that
was its own target, or the job runs as that target asks (the controller stopped between
enacting it and recording so), so that
the last done intent says what the job was released with (``tick.overreaches``). A move
whose job was already asked to checkpoint is never superseded as "converged": the job is
exiting (or has exited, status 75) to be requeued, so a new round turns it into a move to
the new target that inherits the signal time (no second signal), and the job is requeued
and restarted, never recorded as failed. A move whose gpu<->shard resubmission was begun
and not linked (the controller stopped between the sbatch and the link) is never superseded
as "converged" either: the intent that replaces it looks for the job made then
(``resubmitted_from``). A job the tick says ``failed`` gets a ``requeue`` intent instead
(``requeue.py``: it may have checkpointed before its time limit).
"""

from __future__ import annotations

import math
from typing import Any

from icefrog_slurm.controller.ports import StoreTx
from icefrog_slurm.controller.release_timing import REQUEUES
from icefrog_slurm.controller.requeue import REQUEUE
from icefrog_slurm.domain.plan import Plan
from icefrog_slurm.domain.records import GRANTING_ACTIONS, Intent, NewIntent


def record(plan: Plan, tx: StoreTx) -> int:
    """Write the plan's round, state changes and intents (the tick's transaction); returns
    the number of new intents. A job the tick says ``failed`` gets a ``requeue`` intent
    instead: reconcile requeues it if it checkpointed first, else records it failed."""
    added = 0
    if plan.round_no is not None:  # first: the intents below name it
        tx.record_round(
            round_no=plan.round_no,
            now=plan.time,
            policy=plan.policy,
            capacity_gpus=plan.capacity_gpus,
            allocations=[j.allocation for j in plan.jobs],
            solve_s=plan.solve_s,
            min_share=plan.min_share,
            reasons={j.job_id: j.reason for j in plan.jobs if j.reason},
        )
    for job_id, state in plan.state_changes:
        if state == "failed":
            # it may have checkpointed and exited to be requeued (a time limit's signal):
            # the reconcile pass looks first (requeue.requeue_ended)
            sid = tx.job(job_id).slurm_job_id
            tx.add_intent(
                action=REQUEUE,
                params={"target": {}, "slurm_job_id": sid, "round": plan.round_no},
                now=plan.time,
                job_id=job_id,
                round_no=plan.round_no,
                supersede=False,  # the tick ends only jobs no intent moves
            )
            added += 1
            continue
        tx.set_state(job_id=job_id, state=state, now=plan.time)
    open_by_job = {i.job_id: i for i in tx.open_intents() if i.job_id is not None}
    new: list[NewIntent] = []
    for job in plan.jobs:
        current = open_by_job.get(job.job_id)
        target = job.target.params()
        current_target = None if current is None else current.params.get("target")
        carry = {} if current is None else carried(tx, current)
        if carry.get(RESUBMITTED_FROM) != job.slurm_job_id:
            carry.pop(RESUBMITTED_FROM, None)  # linked: its successor is the job's now
        action: str = job.action
        if action == "none" and carry:
            # Asked to checkpoint, it is exiting (or has exited) to be requeued; or a job
            # made in its place is not linked yet, or the one it replaced not cancelled:
            # the move must go on to the new target, never end as "converged" (the job
            # would then be recorded as failed once it exits, or a held job be left).
            action = "stop" if job.target.gres is None else "change"
        if action == "none":
            if current is not None and plan.round_no is not None:
                # done when the job is where this intent was to bring it (the controller
                # stopped before it recorded so): what the job was released with
                reached = current.action in GRANTING_ACTIONS and (
                    current_target == target or job.at_open_target
                )
                status = "done" if reached else "superseded"
                tx.finish_intent(
                    intent_id=current.id, status=status, now=plan.time, detail="converged"
                )
            continue
        if current is not None and current_target == target:
            continue  # the same goal is already in flight: keep its progress
        if current is not None:
            tx.finish_intent(
                intent_id=current.id, status="superseded", now=plan.time, detail="new target"
            )
        params: dict[str, Any] = {
            "target": target,
            "slurm_job_id": job.slurm_job_id,
            "round": plan.round_no,
        }
        params.update(carry)  # not signalled twice; the job made in its place is found
        if job.overreach:
            params["overreach"] = True  # requeued at once (reconcile)
        new.append((job.job_id, action, params))  # superseding done above, job by job
    tx.add_intents(intents=new, now=plan.time, round_no=plan.round_no)
    return added + len(new)


SIGNALLED_AT = "signalled_at"
RESUBMITTED_FROM = "resubmitted_from"
STARTED = "started"  # the outcome of a resubmission logged before its sbatch runs
REPLACED = "replaced"


def carried(tx: StoreTx, intent: Intent) -> dict[str, Any]:
    """What an intent hands on to the one that supersedes it, from its own audit log or
    what it was handed itself: ``signalled_at``, when the job was asked to checkpoint for
    this move (``change`` or ``stop``) and has not been requeued since;
    ``resubmitted_from``, the Slurm job a resubmission was begun from (logged ``resubmit``
    / ``started`` before its sbatch); and ``replaced``, the Slurm job this intent's own
    resubmission replaced and did not cancel (the controller stopped in between), which
    the intent after it cancels while it lives."""
    actions = tx.actions(intent_id=intent.id)
    out: dict[str, Any] = {}
    times = [a.time for a in actions if a.action == "signal" and a.outcome == "ok"]
    inherited = intent.params.get(SIGNALLED_AT)
    if isinstance(inherited, (int, float)):
        times.append(float(inherited))
    requeued = [a.time for a in actions if a.action in REQUEUES and a.outcome == "ok"]
    if times and max(requeued, default=-math.inf) >= max(times):
        times = []  # answered: the job was requeued since, and what runs now is a restart
    if times and intent.action in ("change", "stop"):
        out[SIGNALLED_AT] = max(times)
    begun = [a.slurm_job_id for a in actions if a.action == "resubmit" and a.outcome == STARTED]
    source = begun[-1] if begun else intent.params.get(RESUBMITTED_FROM)
    if isinstance(source, str):
        out[RESUBMITTED_FROM] = source
    made = [a.slurm_job_id for a in actions if a.action == "resubmit" and a.outcome == "ok"]
    cancelled = {a.slurm_job_id for a in actions if a.action == "cancel" and a.outcome == "ok"}
    if made and made[-1] not in cancelled:
        out[REPLACED] = made[-1]  # the next intent cancels it if it lives (reconcile)
    return out


def signalled_at(tx: StoreTx, intent: Intent) -> float | None:
    """When the job was asked to checkpoint for this move (its own ``signal`` action, or
    the one inherited from the intent it superseded); None when it was not."""
    value = carried(tx, intent).get(SIGNALLED_AT)
    return None if value is None else float(value)
