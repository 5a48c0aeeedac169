"""Reconcile: enact a plan on Slurm, idempotently and safely killable at any instant.

The tick's transaction has recorded the plan (``record.py``: one *intent* per job action,
its target resources, written before anything happens on Slurm). ``Reconciler.enact(plan)``
then advances every open intent (also those a killed controller left behind) through one
state machine that reads the job's real Slurm state before each step, so repeating a step
never does harm:

- running with the target resources: done;
- running otherwise: ask it to checkpoint (``scancel --batch --signal=USR1``, logged as
  ``signal``), then wait (the loop comes back every ``reconcile_poll_s``) for its
  checkpoint marker, its exit, or ``checkpoint_timeout_s``; then requeue it held;
- finished while an intent moves it (it checkpointed and exited): requeue it held;
- ended on its own, with no intent moving it (a ``requeue`` intent): requeued held if it
  checkpointed before its time limit, recorded ``failed`` otherwise (``requeue.py``); a
  requeue Slurm already did itself (``RequeueExit`` / ``RequeueExitHold``) is done;
- cancelled or gone: look for the job resubmitted in its place (a resubmission the
  controller was killed in) and link it to the icefrog job; with none, the intent fails (a
  job its owner cancelled is never brought back);
- pending and held after slurmd refused its launch ("Job credential revoked": requeued
  and released at once on the same node), or ended so: requeued held if it ended, and
  released again only ``launch_retry_s`` after the refused release; never failed
  (``release_timing.py``);
- pending and held: gpu<->shard needs a resubmission as the job's owner (Slurm 22.05 cannot
  change a pending job's GRES type), linked into the icefrog job's chain, then the old job
  cancelled (at every later step of the job's intents too, while it lives: a cancel that
  failed is tried again; a job released but not started yet is held first: ``scontrol
  uhold``, a user hold); otherwise update
  GRES / NumNodes=N-N / ReqNodeList; then release with StartTime=now, ``release_gap_s``
  after its last requeue (also a requeued job found released but with no release logged:
  the controller stopped inside that step);
- pending and told to wait: done (it stays held; a job released but not started yet is
  held again first).

Every Slurm command is logged with its outcome in the audit log (``slurm_actions``). A
``SlurmUnavailable`` or a ``StoreUnavailable`` (the database did not answer, also when it
was to log a command that took effect) stops the pass and leaves the intents open for the
next tick, which reads the job's state again; any
other error in one intent's work (a bug, a user's text no check foresaw) fails that intent,
logged with its traceback, and the pass goes on (a lost lead still ends it). An
intent whose job is no nearer its target after ``_MAX_PASSES`` steps (its owner undid each
one: ``scontrol release`` after every hold) fails for this round, as one Slurm refused
does, and the pass goes on with the others.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from icefrog_slurm.controller.decisions import DecisionWriter
from icefrog_slurm.controller.ports import Clock, JobFiles, StorePort, StoreTx
from icefrog_slurm.controller.record import RESUBMITTED_FROM, STARTED, carried, signalled_at
from icefrog_slurm.controller.release_timing import REQUEUES, ReleaseTiming, last_move
from icefrog_slurm.controller.requeue import REQUEUE, EndedJobs, requeue_ended, requeue_hold
from icefrog_slurm.controller.tick import launch_refused, matches, run_dir_of
from icefrog_slurm.domain.cluster import SlurmJobState
from icefrog_slurm.domain.plan import Plan, SlurmRequest
from icefrog_slurm.domain.records import ACTIVE_STATES, Intent, JobRecord
from icefrog_slurm.errors import LostLead, StoreUnavailable
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import Settings
from icefrog_slurm.slurm.port import ClusterPort, SlurmRejected, SlurmUnavailable

log = logging.getLogger(__name__)

StepHook = Callable[[str], None]
_ORDER = {"stop": 0, "change": 1, "start": 2}  # free GPUs before taking them
_SETTLING = frozenset(
    {
        "COMPLETING",
        "CONFIGURING",
        "SIGNALING",
        "STAGE_OUT",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
    }
)
_MAX_PASSES = 8  # state-machine steps per intent per pass (each reads Slurm first)


def _kind_changes(state: SlurmJobState, target: SlurmRequest) -> bool:
    """gpu <-> shard: a pending job must be resubmitted (22.05 cannot update the kind)."""
    return (
        state.gres is not None and target.gres is not None and state.gres.kind != target.gres.kind
    )


@dataclass
class ReconcileResult:
    """What one pass did: intents done, still waiting, failed; Slurm commands run."""

    done: int = 0
    waiting: int = 0
    failed: int = 0
    commands: int = 0
    reallocations: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        return self.waiting > 0 or self.commands > 0


class _Waiting(Exception):
    """The intent cannot advance now (a job is checkpointing)."""


class _NoProgress(Exception):
    """The job's Slurm state came back after each of a pass's steps (its owner undoing every
    hold, say): the intent fails for this round instead of ending the pass for every job."""


class Reconciler:
    """Advances open intents on Slurm and writes decision files (module docstring)."""

    def __init__(
        self,
        *,
        cluster: ClusterPort,
        store: StorePort,
        clock: Clock,
        files: JobFiles,
        settings: Settings,
        after_step: StepHook | None = None,
    ) -> None:
        self.cluster, self.store, self.clock = cluster, store, clock
        self.files, self.settings = files, settings
        self.after_step = after_step or (lambda _what: None)
        self._workdirs: dict[str, str] = {}  # Slurm job id -> WorkDir
        self.timing = ReleaseTiming(store=store, clock=clock, settings=settings)
        self.ended = EndedJobs(cluster, store, files, clock, self._run_dir)
        self.decisions = DecisionWriter(
            files=files, store=store, clock=clock, job_dir=self._job_dir, sharing=settings.sharing
        )

    # ----- one pass --------------------------------------------------------------------
    def enact(self, plan: Plan) -> ReconcileResult:
        result = ReconcileResult()
        with self.store.transaction() as tx:
            intents = sorted(tx.open_intents(), key=lambda i: (_ORDER.get(i.action, 3), i.id))
        for intent in intents:
            try:
                outcome = self._advance(intent, result)
            except (SlurmUnavailable, StoreUnavailable) as exc:  # the intents stay open
                what = "slurm" if isinstance(exc, SlurmUnavailable) else "the store"
                log.warning("%s unavailable, reconcile resumes next tick: %s", what, exc)
                result.errors.append(str(exc))
                result.waiting += 1
                break
            except LostLead:
                raise
            except Exception as exc:  # one job's intent must not end the pass for the others
                log.exception("job=%s: intent %d (%s) failed", intent.job_id, intent.id,
                              intent.action)  # fmt: skip
                result.errors.append(f"{type(exc).__name__}: {exc}")
                outcome = self._abandon(intent, exc)
            if outcome == "done":
                result.done += 1
                result.reallocations += intent.action == "change"
            elif outcome == "waiting":
                result.waiting += 1
            else:
                result.failed += 1
        self._write_decisions(plan)
        return result

    def _abandon(self, intent: Intent, exc: Exception) -> str:
        """Fail an intent an unexpected error stopped (the next round plans its job again);
        when even that cannot be recorded, it stays open for the next pass."""
        try:
            with self.store.transaction() as tx:
                self._finish(tx, intent, "failed", printable(f"{type(exc).__name__}: {exc}", 500))
        except LostLead:
            raise
        except Exception as again:
            log.error("intent %d: left open: %s", intent.id, printable(str(again), 300))
            return "waiting"
        return "failed"

    def _advance(self, intent: Intent, result: ReconcileResult) -> str:
        target = SlurmRequest.from_params(intent.params.get("target", {}))
        with self.store.transaction() as tx:
            job = tx.job(intent.job_id) if intent.job_id is not None else None
            begun = carried(tx, intent).get(RESUBMITTED_FROM)
        if job is None or job.state not in ACTIVE_STATES:
            if job is not None:
                self._cancel_left_held(intent, job, result, begun=begun)
            with self.store.transaction() as tx:
                self._finish(tx, intent, "done", "the job has ended")
            return "done"
        with self.store.transaction() as tx:
            tx.start_intent(intent_id=intent.id, now=self.clock.now())
        try:
            if begun == job.slurm_job_id:
                job = self._link_successor(intent, job)
            if intent.action == REQUEUE:
                detail = self._requeue_ended(intent, job.id, job.slurm_job_id, result)
            else:
                replaced = job.slurm_job_ids[-2] if len(job.slurm_job_ids) > 1 else None
                detail = self._converge(intent, job.id, job.slurm_job_id, target, result,
                                        owner=job.owner_uid, replaced=replaced)  # fmt: skip
        except _Waiting:
            return "waiting"
        except (SlurmRejected, _NoProgress) as exc:
            log.error(
                "job=%d slurm_job=%s: intent %d (%s) failed: %s",
                job.id, job.slurm_job_id, intent.id, intent.action, printable(str(exc), 500),
            )  # fmt: skip
            with self.store.transaction() as tx:
                self._finish(tx, intent, "failed", str(exc))
            return "failed"
        with self.store.transaction() as tx:
            self._finish(tx, intent, "done", detail)
            sid = tx.job(job.id).slurm_job_id  # a resubmission made it another Slurm job
        log.info("job=%d slurm_job=%s: %s done (%s)", job.id, sid, intent.action, detail)
        return "done"

    def _cancel_left_held(
        self, intent: Intent, job: JobRecord, r: ReconcileResult, *, begun: str | None
    ) -> None:
        """The job ended in the store (its ``finished`` report, say) while this intent was
        moving it: a Slurm job of its owner that this move left pending with a user hold
        (it requeued the job, which had in fact finished; or a resubmission ``begun`` from
        it made one and the controller stopped before linking it) would never be released;
        cancel it. A running one is left alone, and so is one an administrator holds."""
        sids = [job.slurm_job_id]
        if begun == job.slurm_job_id:
            new = self.cluster.find_successor(job_id=begun, owner_uid=job.owner_uid)
            sids += [] if new is None else [new]
        polled = self.cluster.poll(job_ids=sids)
        for sid in sids:
            state = polled.get(sid)
            if (
                state is not None
                and state.user_id == job.owner_uid
                and state.state == "PENDING"
                and state.held
                and not state.admin_held
            ):
                cancel = partial(self.cluster.cancel, job_id=sid)
                self._do(intent, job.id, sid, "cancel", r, cancel)

    def _released_unlogged(self, intent: Intent, job_id: int, sid: str) -> None:
        """A job found running as its intent asks with no release of it in the audit log
        since its last requeue or hold (the controller stopped between ``scontrol release``
        and its entry): the release is logged as found, so that a time limit's requeue
        (``requeue.not_requeueable``) and the release rules know it was started."""
        with self.store.transaction() as tx:
            if last_move(tx.actions(job_id=job_id), sid) == "release":
                return
            tx.log_action(
                action="release", command=("release", sid), outcome="ok", now=self.clock.now(),
                duration_s=0.0, detail="found running: its release was not logged",
                slurm_job_id=sid, job_id=job_id, intent_id=intent.id,
            )  # fmt: skip

    def _link_successor(self, intent: Intent, job: JobRecord) -> JobRecord:
        """A resubmission of the job's Slurm job was begun and not linked (the controller
        stopped between its sbatch and the link, and a new round may since have changed the
        target): link the job made then, found by its signed tag, so that it is planned and
        its predecessor cancelled, never left held for ever."""
        new = self.cluster.find_successor(job_id=job.slurm_job_id, owner_uid=job.owner_uid)
        if new is None:  # the sbatch never took effect
            return job
        self._link(intent, job.id, new, "resubmitted (recovered)")
        with self.store.transaction() as tx:
            return tx.job(job.id)

    def _converge(
        self,
        intent: Intent,
        job_id: int,
        sid: str,
        target: SlurmRequest,
        result: ReconcileResult,
        *,
        owner: int,
        replaced: str | None = None,
    ) -> str:
        """Step the job towards ``target`` until done; raises _Waiting (module docstring).
        A Slurm job of that id owned by another uid is not the job's (an id given again):
        it is taken as gone, never acted on. ``replaced``: the Slurm job the current one
        was resubmitted in place of, cancelled first when it still lives (its cancel
        failed, or the controller stopped in between)."""
        for _ in range(_MAX_PASSES):
            ids = [sid] if replaced is None else [sid, replaced]
            polled = self.cluster.poll(job_ids=ids)
            state = polled.get(sid)
            if state is not None and state.user_id != owner:
                state = None
            if replaced is not None:
                self._cancel_replaced(intent, job_id, replaced, polled.get(replaced), state, result)
                replaced = None
            if state is None or state.finished:
                sid = self._after_end(intent, job_id, sid, state, result)
            elif state.admin_held:  # an administrator's hold is never lifted, nor worked around
                raise SlurmRejected(f"Slurm job {sid} is held by an administrator: left alone")
            elif state.state in _SETTLING:
                raise _Waiting  # between two states: look again next pass
            elif state.holds_resources:
                since = self._unanswered_signal(intent, state)
                if (
                    target.gres is not None
                    and matches(state, target)
                    and since is None
                    and not intent.params.get("overreach")
                ):
                    self._released_unlogged(intent, job_id, sid)
                    return f"running as {target.gres} on {state.num_nodes} node(s)"
                # (a signalled job is checkpointing to exit: see it through the requeue)
                self._checkpoint_then_requeue(intent, job_id, sid, since, result)
            elif not state.held and (target.gres is None or _kind_changes(state, target)):
                # released, not started yet: it must not start now (told to wait), and
                # Slurm cannot change a pending job's GRES kind; held, the next pass goes on
                hold = partial(self.cluster.hold, job_id=sid)
                self._do(intent, job_id, sid, "hold", result, hold)
            elif target.gres is None:
                return "waits (held)"
            elif _kind_changes(state, target):
                sid, replaced = self._resubmit(intent, job_id, sid, target, result), sid
            else:
                return self._update_and_release(intent, job_id, sid, state, target, result)
        raise _NoProgress(f"no progress after {_MAX_PASSES} steps: Slurm job {sid} changed back")

    # ----- steps -------------------------------------------------------------------------
    def _after_end(
        self, intent: Intent, job_id: int, sid: str, state: SlurmJobState | None, r: ReconcileResult
    ) -> str:
        """The Slurm job ended or is gone: find its successor, or requeue it (it exited
        after checkpointing); a job that was only to start has simply ended."""
        if state is None or state.state == "CANCELLED":
            new = self.cluster.find_successor(job_id=sid, owner_uid=self._owner(job_id))
            if new is not None:
                self._link(intent, job_id, new, "resubmitted (recovered)")
                return new
        refused = launch_refused(state)  # slurmd refused its launch: restart it later
        if not refused and (
            intent.action == "start" or state is None or state.state == "CANCELLED"
        ):
            # not ours to bring back: it ended on its own, or its owner cancelled it
            raise SlurmRejected(f"Slurm job {sid} ended ({state.state if state else 'gone'})")
        self._do(intent, job_id, sid, "requeue_hold", r, partial(self._requeue_hold, sid))
        return sid

    def _cancel_replaced(
        self,
        intent: Intent,
        job_id: int,
        old_sid: str,
        old: SlurmJobState | None,
        state: SlurmJobState | None,
        r: ReconcileResult,
    ) -> None:
        """Cancel the job's previous Slurm job when it still lives and is the one the
        current job's tag names as replaced (same owner, same key): a resubmission is
        linked before its old job is cancelled, so a cancel that failed leaves a held
        job nothing plans, never a job the store lost."""
        if (
            old is None
            or old.finished
            or state is None
            or old.user_id != state.user_id
            or state.tag is None
            or old.tag is None
            or state.tag.previous_id != old_sid
            or old.tag.key != state.tag.key
        ):
            return
        self._do(intent, job_id, old_sid, "cancel", r, partial(self.cluster.cancel, job_id=old_sid))

    def _checkpoint_then_requeue(
        self, intent: Intent, job_id: int, sid: str, since: float | None, r: ReconcileResult
    ) -> None:
        """Requeue the running job held, once it has checkpointed: signal it first
        (``since``: when it was signalled for this move, :meth:`_unanswered_signal`), then
        wait for its checkpoint mark or ``checkpoint_timeout_s``."""
        if intent.params.get("overreach"):  # its owner took more than the plan gave
            msg = "job=%d slurm_job=%s: holds more than it was released with; requeued at once"
            log.warning(msg, job_id, sid)
            self._do(intent, job_id, sid, "requeue_hold", r, partial(self._requeue_hold, sid))
            return
        if self._restarted_since_requeue(intent, sid):  # its owner released it: ours again
            msg = "job=%d slurm_job=%s: runs again though this move holds it; requeued at once"
            log.warning(msg, job_id, sid)
            self._do(intent, job_id, sid, "requeue_hold", r, partial(self._requeue_hold, sid))
            return
        if since is None:
            self._do(
                intent, job_id, sid, "signal", r, lambda: self.cluster.signal_batch(job_id=sid)
            )
            raise _Waiting
        waited = self.clock.now() - since
        run_dir, owner = self._run_dir(job_id, sid)
        marked = self.files.checkpoint_marked(run_dir=run_dir, since=since, owner_uid=owner)
        if not marked and waited < self.settings.controller.checkpoint_timeout_s:
            raise _Waiting
        if not marked:
            msg = "job=%d slurm_job=%s: no checkpoint after %.0f s; requeued anyway"
            log.warning(msg, job_id, sid, waited)
        self._do(intent, job_id, sid, "requeue_hold", r, partial(self._requeue_hold, sid))

    def _restarted_since_requeue(self, intent: Intent, sid: str) -> bool:
        """Whether this move requeued the Slurm job and has not released it since, yet the
        job runs: its owner released it (``scontrol release``) before the move's update,
        so it runs on what it held. It checkpointed for that requeue: requeued again at
        once, with no second signal and no checkpoint wait."""
        with self.store.transaction() as tx:
            done = [a for a in tx.actions(intent_id=intent.id)
                    if a.slurm_job_id == sid and a.outcome == "ok"]  # fmt: skip
        requeued = [a.time for a in done if a.action in REQUEUES]
        released = [a.time for a in done if a.action == "release"]
        return bool(requeued) and max(requeued) > max(released, default=-math.inf)

    def _requeue_hold(self, sid: str) -> str:
        """:func:`~icefrog_slurm.controller.requeue.requeue_hold` on this cluster."""
        return requeue_hold(self.cluster, sid)

    def _requeue_ended(self, intent: Intent, job_id: int, sid: str, r: ReconcileResult) -> str:
        """A job that ended on its own, with no intent moving it (``requeue.py``)."""
        requeue = partial(self._do, intent, job_id, sid, "requeue_hold", r)
        return requeue_ended(
            self.ended, job_id, sid, requeue=lambda: requeue(partial(self._requeue_hold, sid))
        )

    def _resubmit(
        self, intent: Intent, job_id: int, sid: str, target: SlurmRequest, r: ReconcileResult
    ) -> str:
        assert target.gres is not None
        gres, nodes, owner = target.gres, target.nodes or None, self._owner(job_id)
        box: list[str] = []
        with self.store.transaction() as tx:  # a kill from here to the link: _link_successor
            tx.log_action(
                action="resubmit", command=("resubmit", sid), outcome=STARTED,
                now=self.clock.now(), duration_s=0.0, slurm_job_id=sid, job_id=job_id,
                intent_id=intent.id,
            )  # fmt: skip

        def go() -> None:
            box.append(
                self.cluster.resubmit(
                    job_id=sid, owner_uid=owner, gres=gres, num_nodes=target.num_nodes, nodes=nodes
                )
            )

        self._do(intent, job_id, sid, "resubmit", r, go)
        self._link(intent, job_id, box[0], "resubmitted")
        return box[0]

    def _update_and_release(
        self,
        intent: Intent,
        job_id: int,
        sid: str,
        state: SlurmJobState,
        target: SlurmRequest,
        r: ReconcileResult,
    ) -> str:
        release, may = self.timing.release(job_id, sid, state)
        if not may:
            raise _Waiting  # look again next pass, before any update
        if state.held or target.nodes or not matches(state, target):
            # (an unheld pending job is moved to the round's nodes: see tick.action_for)
            nodes = target.nodes or None
            self._do(
                intent,
                job_id,
                sid,
                "update",
                r,
                lambda: self.cluster.update_pending(
                    job_id=sid, gres=target.gres, num_nodes=target.num_nodes, nodes=nodes
                ),
            )
        if release:
            self._do(
                intent, job_id, sid, "release", r, lambda: self.cluster.release_now(job_id=sid)
            )
        return f"released as {target.gres} on {','.join(target.nodes) or 'any node'}"

    # ----- bookkeeping -------------------------------------------------------------------
    def _do(
        self,
        intent: Intent,
        job_id: int,
        sid: str,
        action: str,
        r: ReconcileResult,
        fn: Callable[[], Any],
    ) -> None:
        """Run one Slurm command and log it with its outcome (also when it fails); a text
        ``fn`` returns is the logged detail."""
        start = self.clock.now()
        outcome, detail = "ok", ""
        try:
            said = fn()
            detail = said if isinstance(said, str) else ""
        except SlurmUnavailable as exc:
            outcome, detail = "timeout", str(exc)
            raise
        except SlurmRejected as exc:
            outcome, detail = "error", str(exc)
            raise
        except Exception as exc:  # output that could not be read, a bug: not done, not "ok"
            outcome, detail = "error", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            r.commands += 1
            self.after_step(f"{action}:done")
            with self.store.transaction() as tx:
                tx.log_action(
                    action=action,
                    command=(action, sid),
                    outcome=outcome,
                    now=start,
                    duration_s=self.clock.now() - start,
                    detail=detail,
                    slurm_job_id=sid,
                    job_id=job_id,
                    intent_id=intent.id,
                )
            self.after_step(f"{action}:logged")

    def _link(self, intent: Intent, job_id: int, new: str, reason: str) -> None:
        with self.store.transaction() as tx:
            old = tx.job(job_id).slurm_job_id
            if old != new:
                tx.link_slurm_job(
                    job_id=job_id, slurm_job_id=new, reason=reason, now=self.clock.now()
                )
        if old != new:
            log.info("job=%d slurm_job=%s: %s, was Slurm job %s", job_id, new, reason, old)
        self.after_step("link:logged")

    def _unanswered_signal(self, intent: Intent, state: SlurmJobState) -> float | None:
        """When the running job was asked to checkpoint for this move (``signalled_at``),
        while that is still to be answered; None when it was not asked, or when Slurm dates
        its current run after the signal: it was requeued since (by a step killed before
        its log, or by its owner), and what runs now is a restart, not a job checkpointing
        to exit."""
        with self.store.transaction() as tx:
            since = signalled_at(tx, intent)
        if since is not None and state.started_at is not None and state.started_at > since:
            return None
        return since

    def _finish(self, tx: StoreTx, intent: Intent, status: str, detail: str) -> None:
        tx.finish_intent(intent_id=intent.id, status=status, now=self.clock.now(), detail=detail)

    def _run_dir(self, job_id: int, sid: str) -> tuple[str, int]:
        """The job's folder (:meth:`_job_dir`) and its owner's uid."""
        with self.store.transaction() as tx:
            job = tx.job(job_id)
        return self._job_dir(sid, run_dir_of(job.progress.checkpoint_path)), job.owner_uid

    def _owner(self, job_id: int) -> int:
        """The uid icefrog recorded from the job's munge-signed registration."""
        with self.store.transaction() as tx:
            return tx.job(job_id).owner_uid

    def _job_dir(self, sid: str, reported: str) -> str:
        """The folder the owner gave the Slurm job when submitting it (its WorkDir, asked
        once a Slurm job); the one its checkpoint reports name only when Slurm has none.
        Either is checked before use (FsJobFiles): the owner's own folders only."""
        if sid not in self._workdirs:
            self._workdirs[sid] = self.cluster.job_detail(job_id=sid).work_dir
        return self._workdirs[sid] or reported

    # ----- decision files ----------------------------------------------------------------
    def _write_decisions(self, plan: Plan) -> None:
        self.decisions.write(plan)
        live = {j.slurm_job_id for j in plan.jobs}
        self._workdirs = {s: d for s, d in self._workdirs.items() if s in live}
