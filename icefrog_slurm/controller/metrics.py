"""The Prometheus endpoint (optional: only when ``metrics.port`` is set).

Owns the controller's metrics, named and typed as Prometheus recommends (base units,
``_total`` counters, histograms for durations), updated by the daemon's callbacks:
:meth:`ControllerMetrics.observe` after every tick and :meth:`ControllerMetrics.lead` when
the controller takes or loses the lead. Served by prometheus-client's own HTTP server from a
private registry, on ``metrics.address`` (127.0.0.1 unless the admin names another: the
figures are the cluster's and its users' business). docs/reference.md lists the series;
``slurm_conf/icefrog-alerts.rules.yml`` alerts on them.
"""

from __future__ import annotations

from collections import Counter as Tally
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from icefrog_slurm import __version__
from icefrog_slurm.controller.daemon import TickReport
from icefrog_slurm.domain.plan import Plan
from icefrog_slurm.domain.records import JOB_STATES

DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                    300.0)  # fmt: skip
"""Seconds: from a tick between rounds (milliseconds) to a MIP solve at its time limit."""
REPORT_OUTCOMES = ("accepted", "rejected", "duplicate", "deferred")
"""What an inbox drain does with a report (``DrainCounts``); ``deferred``: left for a later
drain by a transient fault (counted at each drain that leaves it)."""


class ControllerMetrics:
    """Metrics of one controller: ``observe`` is the daemon's ``on_tick`` callback, ``lead``
    its ``on_lead``. ``jobs_per_gpu`` is ``sharing.max_jobs_per_gpu`` (how many shared jobs
    Slurm packs on one GPU's shards)."""

    def __init__(self, *, jobs_per_gpu: int = 2, version: str = __version__) -> None:
        self.jobs_per_gpu = max(jobs_per_gpu, 1)
        self.registry = CollectorRegistry()
        r, b = self.registry, DURATION_BUCKETS
        Info("icefrog_build", "The running icefrog", registry=r).info({"version": version})
        self.leader = Gauge(
            "icefrog_leader", "1 while this controller leads, 0 while it waits", registry=r
        )
        self.round_s = Histogram(
            "icefrog_round_duration_seconds",
            "A round's own work: snapshot, Slurm polls, policy, record",
            registry=r,
            buckets=b,
        )
        self.solve_s = Histogram(
            "icefrog_solve_duration_seconds",
            "The policy's solve time a round",
            registry=r,
            buckets=b,
        )
        self.reconcile_s = Histogram(
            "icefrog_reconcile_duration_seconds",
            "A tick's reconcile pass: Slurm commands and decision files",
            registry=r,
            buckets=b,
        )
        self.last_round = Gauge(
            "icefrog_last_round_timestamp_seconds",
            "Unix time of the last round decided",
            registry=r,
        )
        self.last_tick = Gauge(
            "icefrog_last_tick_timestamp_seconds", "Unix time of the last tick done", registry=r
        )
        self.jobs = Gauge("icefrog_jobs", "Active icefrog jobs by state", ["state"], registry=r)
        self.gpus = Gauge("icefrog_gpus_allocated", "GPUs the last round gave jobs", registry=r)
        self.shared = Gauge(
            "icefrog_gpus_shared", "GPUs the last round gave out in shards (shared)", registry=r
        )
        self.sharing = Gauge(
            "icefrog_jobs_sharing", "Jobs the last round put on a shared GPU", registry=r
        )
        self.capacity = Gauge("icefrog_capacity_gpus", "GPUs icefrog may plan with", registry=r)
        self.reallocations = Counter(
            "icefrog_reallocations", "Running jobs resized or moved", registry=r
        )
        self.failures = Counter("icefrog_reconcile_failures", "Intents that failed", registry=r)
        self.rounds = Counter("icefrog_rounds", "Scheduling rounds decided", registry=r)
        self.reports = Counter(
            "icefrog_reports", "Job reports the inbox drained, by outcome", ["outcome"], registry=r
        )
        for outcome in REPORT_OUTCOMES:  # every series exists from the start, at 0
            self.reports.labels(outcome=outcome)
        self._server: WSGIServer | None = None

    def serve(self, *, port: int, address: str) -> tuple[str, int]:
        """Start the endpoint; returns the address and port it listens on."""
        self._server, _thread = start_http_server(port, addr=address, registry=self.registry)
        host, bound = self._server.server_address[:2]
        return str(host), int(bound)

    def close(self) -> None:
        """Stop the endpoint (when it was started)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def lead(self, leading: bool) -> None:
        """The daemon took (True) or lost or gave up (False) the lead."""
        self.leader.set(1 if leading else 0)

    def observe(self, report: TickReport) -> None:
        """Record one tick."""
        plan = report.plan
        self.last_tick.set(plan.time)
        if plan.new_round:
            self.rounds.inc()
            self.round_s.observe(report.tick_s)
            if plan.solve_s is not None:
                self.solve_s.observe(plan.solve_s)
        if report.last_round_time is not None:
            self.last_round.set(report.last_round_time)
        self.reconcile_s.observe(report.reconcile_s)
        for state in JOB_STATES:
            self.jobs.labels(state=state).set(report.jobs_by_state.get(state, 0))
        allocated, shared, sharing = gpu_counts(plan, self.jobs_per_gpu)
        self.gpus.set(allocated)
        self.shared.set(shared)
        self.sharing.set(sharing)
        self.capacity.set(plan.capacity_gpus)
        self.reallocations.inc(report.reconcile.reallocations)
        self.failures.inc(report.reconcile.failed)
        if report.drain is not None:
            d = report.drain
            counts = (d.accepted, d.rejected, d.duplicates, d.deferred)
            for outcome, n in zip(REPORT_OUTCOMES, counts, strict=True):
                self.reports.labels(outcome=outcome).inc(n)


def gpu_counts(plan: Plan, jobs_per_gpu: int) -> tuple[int, int, int]:
    """(GPUs allocated, GPUs shared, jobs on a shared GPU) of a plan's decision. A shared
    job holds shards of one GPU on its node, and Slurm fills one GPU's shards before the
    next, so a node's ``n`` shared jobs are on ``ceil(n / jobs_per_gpu)`` GPUs."""
    exclusive = sum(j.allocation.gpus for j in plan.jobs if not j.allocation.shared)
    on_node = Tally(
        j.allocation.nodes[:1] for j in plan.jobs if j.allocation.shared and j.allocation.gpus > 0
    )
    shared = sum(-(-n // jobs_per_gpu) for n in on_node.values())
    return max(exclusive, 0) + shared, shared, sum(on_node.values())
