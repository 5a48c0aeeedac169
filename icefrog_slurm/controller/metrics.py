"""The Prometheus endpoint (optional: only when ``metrics.port`` is set).

Gauges and counters, updated after every tick: round duration (the tick's own work), solve
time, jobs by state, GPUs allocated and shared, reallocations (resizes and moves done),
reconcile failures. Served by prometheus-client's own HTTP server from a private registry,
on ``metrics.address`` (127.0.0.1 unless the admin names another: the figures are the
cluster's and its users' business).
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from icefrog_slurm.controller.daemon import TickReport
from icefrog_slurm.domain.records import JOB_STATES


class ControllerMetrics:
    """Metrics of one controller; ``observe`` is the controller's ``on_tick`` callback."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.round_s = Gauge("icefrog_round_duration_seconds", "A tick's own work", registry=r)
        self.solve_s = Gauge("icefrog_solve_seconds", "The policy's solve time", registry=r)
        self.jobs = Gauge("icefrog_jobs", "Active icefrog jobs by state", ["state"], registry=r)
        self.gpus = Gauge("icefrog_gpus_allocated", "GPUs the last round gave jobs", registry=r)
        self.shared = Gauge("icefrog_gpus_shared", "Jobs on a shared GPU", registry=r)
        self.capacity = Gauge("icefrog_capacity_gpus", "GPUs icefrog may plan with", registry=r)
        self.reallocations = Counter(
            "icefrog_reallocations", "Running jobs resized or moved", registry=r
        )
        self.failures = Counter("icefrog_reconcile_failures", "Intents that failed", registry=r)
        self.rounds = Counter("icefrog_rounds", "Scheduling rounds decided", registry=r)
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

    def observe(self, report: TickReport) -> None:
        plan = report.plan
        self.round_s.set(report.tick_s)
        if plan.new_round:
            self.rounds.inc()
            if plan.solve_s is not None:
                self.solve_s.set(plan.solve_s)
        for state in JOB_STATES:
            self.jobs.labels(state=state).set(report.jobs_by_state.get(state, 0))
        exclusive = sum(j.allocation.gpus for j in plan.jobs if not j.allocation.shared)
        shared_jobs = [j for j in plan.jobs if j.allocation.shared and j.allocation.gpus]
        self.gpus.set(exclusive + len({j.allocation.nodes for j in shared_jobs}))
        self.shared.set(len(shared_jobs))
        self.capacity.set(plan.capacity_gpus)
        self.reallocations.inc(report.reconcile.reallocations)
        self.failures.inc(report.reconcile.failed)
