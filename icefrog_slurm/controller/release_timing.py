"""When a held job may be released, read from the audit log (``slurm_actions``).

- A release in the same second as the requeue's credential revocation is refused by
  slurmd: a job is released only ``release_gap_s`` after its last requeue.
- A job whose launch slurmd refused ("Job credential revoked": requeued and released at
  once on the same node) is released again only ``launch_retry_s`` after the refused
  release (the credential is still revoked until then).
- A requeued job found released but with no release logged (a controller stopped inside
  ``release_now`` released it without ``StartTime=now``, and Slurm would start it only ~2
  minutes after the requeue) is released again.
- A job held again since the controller's last release of it, with no requeue of the
  controller's since (Slurm requeued it on its own: a site's ``RequeueExitHold``, an
  administrator's ``scontrol requeuehold``), was requeued at a time the controller does not
  know: the first pass that sees it logs that requeue (action ``requeued``) and the release
  waits ``release_gap_s`` from then (released at once, such a job was killed by slurmd as
  "non-startable: Job credential revoked" and ended FAILED).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from icefrog_slurm.controller.ports import Clock, StorePort
from icefrog_slurm.controller.tick import launch_refused
from icefrog_slurm.domain.cluster import SlurmJobState
from icefrog_slurm.domain.records import SlurmAction
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import Settings

log = logging.getLogger(__name__)


class ReleaseTiming:
    """The release rules above, for the reconcile pass, from one read of the job's audit
    log."""

    def __init__(self, *, store: StorePort, clock: Clock, settings: Settings) -> None:
        self.store, self.clock, self.settings = store, clock, settings

    def release(self, job_id: int, sid: str, state: SlurmJobState) -> tuple[bool, bool]:
        """(whether the pending Slurm job is to be released, whether it may be now): it is
        when it is held or its release is unfinished (:func:`release_unfinished`); it may
        be once a refused launch's ``launch_retry_s`` (:meth:`launch_retry_due`) and the
        ``release_gap_s`` after its last requeue (:func:`after_requeue_gap`) have passed."""
        with self.store.transaction() as tx:
            audit = tx.actions(job_id=job_id)
            if state.held and last_move(audit, sid) == "release":  # requeued by someone else
                tx.log_action(
                    action=SEEN_REQUEUE, command=(SEEN_REQUEUE, sid), outcome="ok",
                    now=self.clock.now(), duration_s=0.0, slurm_job_id=sid, job_id=job_id,
                    detail="held again since its release, not by icefrog",
                )  # fmt: skip
                return True, False
        release = state.held or release_unfinished(audit, sid)
        if not release:
            return False, True
        now, c = self.clock.now(), self.settings.controller
        return True, (
            self.launch_retry_due(audit, job_id, state)
            and after_requeue_gap(audit, sid, now=now, gap_s=c.release_gap_s)
        )

    def launch_retry_due(
        self, actions: Sequence[SlurmAction], job_id: int, state: SlurmJobState
    ) -> bool:
        """False while a job whose launch slurmd refused is inside ``launch_retry_s`` of its
        refused release (the credential is still revoked; logged); True otherwise."""
        if not launch_refused(state):
            return True
        releases = [a.time for a in actions if a.action == "release" and a.outcome == "ok"]
        wait = retry_wait_s(
            last_release=max(releases, default=None),
            now=self.clock.now(),
            retry_s=self.settings.controller.launch_retry_s,
        )
        if wait > 0:
            log.info(
                "job=%d slurm_job=%s: launch refused (%s); released again in %.0f s",
                job_id, state.job_id, printable(state.reason, 200), wait,
            )  # fmt: skip
            return False
        return True


SEEN_REQUEUE = "requeued"
"""The audit log's action for a requeue the controller saw but did not make (module
docstring)."""
REQUEUES = ("requeue_hold", SEEN_REQUEUE)


def last_move(actions: Sequence[SlurmAction], sid: str) -> str | None:
    """The Slurm job's last release, hold or requeue in the job's audit log ``actions``
    (its action's name); None when there is none."""
    done = [
        a
        for a in actions
        if a.slurm_job_id == sid
        and a.outcome == "ok"
        and a.action in ("release", "hold", *REQUEUES)
    ]
    return max(done, key=lambda a: a.time).action if done else None


def release_unfinished(actions: Sequence[SlurmAction], sid: str) -> bool:
    """Whether the Slurm job was requeued and not released since, by the job's audit log
    ``actions``: a controller stopped inside ``release_now`` released it without
    ``StartTime=now``, and Slurm would start it only ~2 minutes after the requeue."""
    return last_move(actions, sid) in REQUEUES


def after_requeue_gap(
    actions: Sequence[SlurmAction], sid: str, *, now: float, gap_s: float
) -> bool:
    """Whether ``gap_s`` (``release_gap_s``) has passed since the Slurm job's last requeue
    in the job's audit log ``actions``: a release in the same second as the requeue's
    credential revocation is refused by slurmd."""
    requeues = [
        a.time
        for a in actions
        if a.action in REQUEUES and a.outcome == "ok" and a.slurm_job_id == sid
    ]
    return retry_wait_s(last_release=max(requeues, default=None), now=now, retry_s=gap_s) <= 0


def retry_wait_s(*, last_release: float | None, now: float, retry_s: float) -> float:
    """Seconds left before a job may be released again: ``retry_s`` after ``last_release``
    (its refused release, or its requeue), 0 when there was none or that has passed."""
    if last_release is None:
        return 0.0
    return max(0.0, last_release + retry_s - now)
