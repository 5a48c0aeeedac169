"""Requeues: a time limit ends a managed job with a requeue, not a failure.

A job that ended on its own, with no intent moving it (the tick says ``failed``;
``record`` opens a ``requeue`` intent instead of recording that), is requeued held when its
checkpoint marker is newer than the controller's last release or requeue of that Slurm job
(it was signalled before its time limit, ``--signal=B:USR1@N``, and exited 75), and then
released by the plan like any held job; it is recorded ``failed`` otherwise (also when
Slurm has forgotten it): :func:`requeue_ended`, :func:`not_requeueable` says why.

:func:`requeue_hold` is every requeue of the reconcile pass: a ``requeue_hold`` Slurm
refuses because it already requeued the job itself (a site's ``RequeueExit=75``: pending,
held here with a user hold; ``RequeueExitHold=75``: pending held) is done, not failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from icefrog_slurm.controller.ports import Clock, JobFiles, StorePort
from icefrog_slurm.domain.cluster import SlurmJobState
from icefrog_slurm.slurm.port import ClusterPort, SlurmRejected

log = logging.getLogger(__name__)

REQUEUE = "requeue"  # a job that ended on its own: requeued if it checkpointed, else failed

RunDir = Callable[[int, str], tuple[str, int]]
"""(icefrog job id, Slurm job id) -> the job's folder and its owner's uid."""


def requeue_hold(cluster: ClusterPort, sid: str) -> str:
    """``requeue_hold``, done also when Slurm already requeued the job itself (a site's
    ``RequeueExit=75``: pending, held here with a user hold as ``requeuehold`` would
    have; ``RequeueExitHold=75``: pending held already). Returns the logged detail."""
    try:
        cluster.requeue_hold(job_id=sid)
    except SlurmRejected:
        state = cluster.poll(job_ids=[sid]).get(sid)
        if state is None or state.state != "PENDING" or state.admin_held:
            raise
        if state.held:
            return "already requeued held by Slurm"
        cluster.hold(job_id=sid)
        return "already requeued by Slurm (RequeueExit): held"
    return ""


@dataclass(frozen=True)
class EndedJobs:
    """What :func:`requeue_ended` reads: Slurm, the store's audit log, the job's folder."""

    cluster: ClusterPort
    store: StorePort
    files: JobFiles
    clock: Clock
    run_dir: RunDir


def requeue_ended(ports: EndedJobs, job_id: int, sid: str, *, requeue: Callable[[], None]) -> str:
    """A job that ended on its own, with no intent moving it (the tick would record it
    failed): requeued held (``requeue``: the reconcile pass's logged ``requeue_hold``) when
    it checkpointed to be requeued -- its checkpoint marker is newer than the controller's
    last release or requeue of this Slurm job (a time limit's ``--signal=B:USR1@N``: the
    launcher exits 75); the next round releases it like any held job. Otherwise it is
    recorded failed here. Returns the intent's detail."""
    state = ports.cluster.poll(job_ids=[sid]).get(sid)
    if state is not None:
        with ports.store.transaction() as tx:
            if state.user_id != tx.job(job_id).owner_uid:
                state = None  # the id given again to another user's job: this one is gone
    if state is not None and not state.finished:
        return f"Slurm job {sid} is {state.state} again (requeued by Slurm)"
    why = not_requeueable(ports, job_id, sid, state)
    if why:
        with ports.store.transaction() as tx:
            tx.set_state(job_id=job_id, state="failed", now=ports.clock.now())
        log.warning("job=%d slurm_job=%s: failed (%s)", job_id, sid, why)
        return f"recorded failed: {why}"
    requeue()
    log.info(
        "job=%d slurm_job=%s: ended %s after its checkpoint (time limit): requeued held",
        job_id, sid, state.state if state else "",
    )  # fmt: skip
    return f"ended {state.state if state else ''} after its checkpoint: requeued held"


def not_requeueable(ports: EndedJobs, job_id: int, sid: str, state: SlurmJobState | None) -> str:
    """Why an ended Slurm job is not requeued (module docstring); "" when it is."""
    if state is None:
        return f"Slurm job {sid} is gone from Slurm (its record outlived MinJobAge)"
    with ports.store.transaction() as tx:
        starts = [  # a command that timed out may have taken effect: it counts as a start
            a.time
            for a in tx.actions(job_id=job_id)
            if a.slurm_job_id == sid
            and a.outcome in ("ok", "timeout")
            and a.action in ("release", "requeue_hold")
        ]
    if not starts:
        return f"Slurm job {sid} ended {state.state}; the controller never released it"
    try:
        folder, owner = ports.run_dir(job_id, sid)
    except SlurmRejected as exc:
        return f"Slurm job {sid} ended {state.state}; its folder is unknown ({exc})"
    if not ports.files.checkpoint_marked(run_dir=folder, since=max(starts), owner_uid=owner):
        return f"Slurm job {sid} ended {state.state} with no checkpoint since its start"
    return ""
