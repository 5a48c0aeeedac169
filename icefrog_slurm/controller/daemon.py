"""``Controller``: the daemon loop (spec section 9, step 5; Airflow-style scheduler loop).

``run(max_ticks=None)``: take the lead (one active controller: a Postgres advisory lock,
or ``flock`` beside SQLite, plus a lease whose epoch, the fencing token, each new leader
increases; a second controller waits), then tick until told to stop. The lead is proved, not
assumed: every tick runs inside ``Lease.hold()`` (the lock still held, the epoch still
ours; on Postgres the lease row stays locked until the tick ends, so a standby cannot take
over in the middle of one), and once the daemon leads, every write transaction of the store
checks the epoch again (the store is fenced), so a reconcile step of a controller that lost
the lead is refused before its Slurm command. A controller that lost the lead logs it
loudly, abandons the tick and waits for the lock again (store/leader.py). A tick:

1. drains the report inbox when ``inbox.poll_s`` has passed (``drain``, optional);
2. in ONE store transaction: reads the snapshot, polls Slurm for the jobs' state and the
   partition's capacity (one ``squeue`` for all jobs), runs the pure
   :func:`~icefrog_slurm.controller.tick.tick`, and records the round, the state changes
   and the intents (nothing at all with ``dry_run``);
3. advances the open intents on Slurm (:class:`~.reconcile.Reconciler`).

Step 2 runs with Python's cyclic garbage collector paused (:func:`collector_paused`): the
first round after a start builds every job's models and tables, and the full collections
that growth set off (each one walks every object the daemon holds) would lengthen the
round; the collector runs again once the tick's transaction ends.

Callbacks: ``on_tick`` gets each tick's :class:`TickReport` (what the round decided, the
reconcile pass and the inbox drain did, how long each took), ``on_lead`` True when the
controller takes the lead and False when it loses or gives it up (the metrics). Every log
line about one job starts ``job=<icefrog id> slurm_job=<Slurm id>:``.

The loop sleeps only when a tick left nothing to do: until the next round or inbox pass;
while a job is checkpointing it comes back every ``reconcile_poll_s``. When slurmctld is
down or slow (``SlurmUnavailable``) or the database fails, the tick is abandoned (its
transaction rolled back: the decision is recorded only together with its intents), the
error logged, and the loop backs off exponentially up to the round period. It never exits
on such errors; a database it cannot reach while taking the lead is retried too. Only a
database no lock can guard (``sqlite://`` in memory: InputError) stops it at the start.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from icefrog_slurm.controller.ports import Clock, DrainCounts, JobFiles, Lease, StorePort
from icefrog_slurm.controller.reconcile import Reconciler, ReconcileResult, StepHook
from icefrog_slurm.controller.record import record
from icefrog_slurm.controller.snapshot import build_snapshot
from icefrog_slurm.controller.tick import round_due, tick
from icefrog_slurm.domain.plan import Plan, Policy
from icefrog_slurm.domain.records import StoreSnapshot
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.errors import IcefrogError, InputError, LostLead
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import Settings
from icefrog_slurm.slurm.port import ClusterPort, SlurmUnavailable

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 2.0


@dataclass(frozen=True)
class TickReport:
    """What one tick did (for logs, metrics and tests)."""

    plan: Plan
    reconcile: ReconcileResult
    tick_s: float  # the tick's own work: snapshot, policy, record (Slurm polls included)
    jobs_by_state: dict[str, int]
    reconcile_s: float = 0.0  # the reconcile pass after it
    last_round_time: float | None = None  # when the last round was decided (this one's too)
    drain: DrainCounts | None = None  # what this tick's inbox drain did (None: no drain)
    tick_cpu_s: float = 0.0  # the process CPU time of the tick's own work (as tick_s)


class Controller:
    """The daemon: wires the ports, the policy and the settings into the loop."""

    def __init__(
        self,
        *,
        settings: Settings,
        policy: Policy,
        cluster: ClusterPort,
        store: StorePort,
        clock: Clock,
        files: JobFiles,
        drain: Callable[[], object] | None = None,
        dry_run: bool = False,
        after_step: StepHook | None = None,
        on_tick: Callable[[TickReport], None] | None = None,
        on_lead: Callable[[bool], None] | None = None,
    ) -> None:
        self.settings, self.policy, self.cluster = settings, policy, cluster
        self.store, self.clock, self.drain = store, clock, drain
        self.dry_run, self.on_tick = dry_run, on_tick
        self.on_lead = on_lead or (lambda _leading: None)  # took the lead (True), lost it
        self.reconciler = Reconciler(
            cluster=cluster,
            store=store,
            clock=clock,
            files=files,
            settings=settings,
            after_step=after_step,
        )
        self._last_drain: float | None = None
        self.last: TickReport | None = None

    def run(self, max_ticks: int | None = None) -> int:
        """Lead, then tick until ``max_ticks`` ticks were made (forever when None); a lost
        lead sends it back to waiting for the lock."""
        ticks = 0
        while max_ticks is None or ticks < max_ticks:
            lease = self._lead()
            self.on_lead(True)
            try:
                ticks = self._tick_while_leading(lease, ticks, max_ticks)
            finally:
                self.on_lead(False)
                lease.release()
        return ticks

    def _tick_while_leading(self, lease: Lease, ticks: int, max_ticks: int | None) -> int:
        """Tick under ``lease`` until ``max_ticks`` or until the lead is lost; the count."""
        failures = 0
        while max_ticks is None or ticks < max_ticks:
            ticks += 1
            pause = 0.0
            try:
                with lease.hold():
                    report = self.tick_once()
                    pause = self._pause(report)
                failures = 0
            except LostLead as exc:
                log.critical(
                    "NOT THE ACTIVE CONTROLLER ANY MORE (led as epoch %d): %s; tick abandoned, "
                    "nothing more is enacted until this controller leads again",
                    lease.epoch,
                    exc,
                )
                return ticks
            except (SlurmUnavailable, IcefrogError, OSError) as exc:
                failures += 1
                log.error("tick abandoned (%s): %s", type(exc).__name__, exc)
            except Exception as exc:  # a bug or a database error: log it, keep running
                failures += 1
                log.exception("tick failed: %s", exc)
            if max_ticks is not None and ticks >= max_ticks:
                break
            self.clock.sleep(self._backoff(failures) if failures else pause)
        return ticks

    def _lead(self) -> Lease:
        """Wait for the lead; a database that cannot be reached yet is retried."""
        waited = False
        while True:
            try:
                lease = self.store.try_lead()
            except InputError:
                raise  # no lock can guard this database: refuse to run at all
            except Exception as exc:
                log.error("cannot take the lead yet (%s): %s", type(exc).__name__, exc)
                lease = None
            if lease is not None:
                if waited:
                    log.info("now the active controller (epoch %d)", lease.epoch)
                return lease
            if not waited:
                log.warning("another controller is active; waiting for its lock")
                waited = True
            self.clock.sleep(min(self.settings.controller.round_period_s, 10.0))

    def _backoff(self, failures: int) -> float:
        c = self.settings.controller
        return float(min(BACKOFF_FIRST_S * 2 ** (failures - 1), c.round_period_s))

    def _pause(self, report: TickReport) -> float:
        c = self.settings.controller
        if report.reconcile.busy and not self.dry_run:
            return c.reconcile_poll_s
        now = self.clock.now()
        due = [self.settings.inbox.poll_s if self.drain else c.round_period_s]
        last = report.plan.time if report.plan.new_round else None
        with self.store.transaction() as tx:
            last_round = tx.round()
        if last_round is not None:
            last = last_round.time
        if last is not None:
            due.append(last + c.round_period_s - now)
        return max(min(due), 0.0)

    def tick_once(self) -> TickReport:
        """One tick (module docstring)."""
        now = self.clock.now()
        drained = None
        if (
            self.drain is not None
            and not self.dry_run
            and (self._last_drain is None or now - self._last_drain >= self.settings.inbox.poll_s)
        ):
            try:
                drained = self.drain()
            except LostLead:
                raise
            except Exception as exc:  # the inbox's filesystem gone or hung: plan without it
                log.error("inbox drain failed, the tick goes on without it: %s",
                          printable(f"{type(exc).__name__}: {exc}", 300))  # fmt: skip
            self._last_drain = now
        started, cpu = time.perf_counter(), time.process_time()
        with collector_paused(), self.store.transaction(consistent=True) as tx:
            store_snapshot = tx.snapshot(  # between rounds: the jobs alone
                measurements=lambda last: round_due(last, now, self.settings)
            )
            snapshot = self.snapshot(store_snapshot, now)
            plan = tick(snapshot, self.policy, self.settings)
            if not self.dry_run:
                record(plan, tx)
        tick_s, tick_cpu_s = time.perf_counter() - started, time.process_time() - cpu
        self._log_round(plan, snapshot, tick_s)  # what was decided, before it is enacted
        result = ReconcileResult() if self.dry_run else self.reconciler.enact(plan)
        reconcile_s = time.perf_counter() - started - tick_s
        counts: dict[str, int] = {}
        for j in snapshot.jobs:
            counts[j.job.state] = counts.get(j.job.state, 0) + 1
        last = store_snapshot.last_round
        report = TickReport(
            plan=plan,
            reconcile=result,
            tick_s=tick_s,
            jobs_by_state=counts,
            reconcile_s=reconcile_s,
            last_round_time=plan.time if plan.new_round else None if last is None else last.time,
            drain=drained if isinstance(drained, DrainCounts) else None,
            tick_cpu_s=tick_cpu_s,
        )
        self._log_reconcile(result)
        self.last = report
        if self.on_tick is not None:
            self.on_tick(report)
        return report

    def snapshot(self, store_snapshot: StoreSnapshot, now: float) -> Snapshot:
        """Join the store's snapshot with one batched Slurm poll and the capacity. Every
        Slurm job but the store's own (by id and owner, whatever its comment says now) is
        foreign to the capacity: a managed job whose owner rewrote its comment is still
        planned by its Slurm id and counted once, and a job that carries a tag the store
        never adopted holds foreign GPUs. A job whose Slurm job was cancelled or is gone
        but has a signed successor (a gpu<->shard resubmission made but not linked: the
        controller stopped in between, longer than a round) is planned by its successor's
        state, never ended as cancelled; the reconcile pass links it (``_after_end``)."""
        ids = [v.job.slurm_job_id for v in store_snapshot.jobs]
        states = dict(self.cluster.poll(job_ids=ids))
        for v in store_snapshot.jobs:  # a resubmission the controller made but never linked
            sid = v.job.slurm_job_id
            state = states.get(sid)
            if state is None or state.state == "CANCELLED":
                new = self.cluster.find_successor(job_id=sid, owner_uid=v.job.owner_uid)
                successor = None if new is None else self.cluster.poll(job_ids=[new]).get(new)
                if successor is not None:  # planned as the job it replaces; reconcile links it
                    states[sid] = successor
        managed = {v.job.slurm_job_id: v.job.owner_uid for v in store_snapshot.jobs}
        capacity = self.cluster.partition_capacity(
            partition=self.settings.slurm.partition, managed=managed
        )
        return build_snapshot(store=store_snapshot, states=states, capacity=capacity, now=now)

    def _log_round(self, plan: Plan, snapshot: Snapshot, tick_s: float) -> None:
        if plan.new_round:
            running = sum(1 for j in plan.jobs if j.allocation.gpus > 0)
            log.info(
                "round %s (%s): %d jobs, %d given GPUs, capacity %d, %d actions, tick %.3f s",
                plan.round_no,
                plan.policy,
                len(plan.jobs),
                running,
                plan.capacity_gpus,
                len(plan.actions()),
                tick_s,
            )
            moved = plan.actions() if log.isEnabledFor(logging.INFO) else ()
            for j in moved:  # one line a job the round moves: grep -w job=<id>
                a = j.allocation
                log.info(
                    "job=%d slurm_job=%s: round %s: %s to %d GPU(s)%s, batch %d, %d frozen%s",
                    j.job_id,
                    j.slurm_job_id,
                    plan.round_no,
                    j.action,
                    a.gpus,
                    " shared" if a.shared else "",
                    a.batch,
                    a.frozen,
                    f" ({printable(j.reason, 300)})" if j.reason else "",
                )
        if plan.state_changes and log.isEnabledFor(logging.INFO):
            slurm_ids = {j.id: j.job.slurm_job_id for j in snapshot.jobs}
            for job_id, state in plan.state_changes:
                log.info("job=%d slurm_job=%s: now %s", job_id, slurm_ids.get(job_id), state)

    def _log_reconcile(self, r: ReconcileResult) -> None:
        if r.commands or r.failed:
            log.info(
                "reconcile: %d done, %d waiting, %d failed, %d Slurm commands",
                r.done,
                r.waiting,
                r.failed,
                r.commands,
            )


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside, back on (as it was) after: garbage
    made meanwhile is collected by the next automatic collection. Reference counting,
    which frees almost everything a tick discards, goes on."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
