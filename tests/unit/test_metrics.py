"""The Prometheus metrics: what each series says after real ticks, and where it listens."""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import generate_latest

from icefrog_slurm import __version__
from icefrog_slurm.controller.daemon import Controller, TickReport
from icefrog_slurm.controller.metrics import DURATION_BUCKETS, REPORT_OUTCOMES, ControllerMetrics
from icefrog_slurm.controller.reconcile import ReconcileResult
from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.domain.plan import JobPlan, Plan, SlurmRequest
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.errors import LostLead
from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import TraceJob
from icefrog_slurm.store.inbox import DrainResult


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _text(metrics: ControllerMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def _value(text: str, series: str) -> float:
    """The value of one series line (``name`` or ``name{labels}``) of an exposition."""
    [match] = re.findall(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match)


def _plan(round_no: int | None, allocations: list[Allocation], time: float = 1000.0) -> Plan:
    jobs = tuple(
        JobPlan(a.job_id, str(100 + a.job_id), 0, a, SlurmRequest(Gres("gpu", 1)), "none")
        for a in allocations
    )
    return Plan(time=time, round_no=round_no, policy="p", capacity_gpus=16, jobs=jobs, solve_s=0.25)


def test_the_endpoint_binds_the_loopback_address_by_default() -> None:
    assert Settings().metrics.address == "127.0.0.1"
    port = _free_port()
    settings = settings_from_mapping({"metrics": {"port": port}})
    assert settings.metrics.port is not None
    metrics = ControllerMetrics()
    try:
        bound = metrics.serve(port=settings.metrics.port, address=settings.metrics.address)
        assert bound == ("127.0.0.1", port)  # not 0.0.0.0: no other host reaches it
        url = f"http://127.0.0.1:{port}/metrics"
        served = urllib.request.urlopen(url, timeout=5).read().decode()
        assert f'icefrog_build_info{{version="{__version__}"}} 1.0' in served
    finally:
        metrics.close()


def test_shared_gpus_are_gpus_and_the_jobs_on_them_are_counted_apart() -> None:
    """Three shared jobs on node2 fill two GPUs (two jobs a GPU), one on node3 a third; the
    exclusive job holds two: 5 GPUs allocated, 3 of them shared, 4 jobs sharing."""
    allocations = [
        Allocation(1, 2, 32, 0, nodes=("node1",)),
        Allocation(2, 1, 32, 0, shared=True, nodes=("node2",)),
        Allocation(3, 1, 32, 0, shared=True, nodes=("node2",)),
        Allocation(4, 1, 32, 0, shared=True, nodes=("node2",)),
        Allocation(5, 1, 32, 0, shared=True, nodes=("node3",)),
        Allocation(6, 0, 0, 0),  # waits: no GPU
    ]
    metrics = ControllerMetrics(jobs_per_gpu=2)
    metrics.observe(TickReport(_plan(4, allocations), ReconcileResult(), 0.1, {"running": 5}))
    text = _text(metrics)
    assert _value(text, "icefrog_gpus_allocated") == 5
    assert _value(text, "icefrog_gpus_shared") == 3
    assert _value(text, "icefrog_jobs_sharing") == 4
    assert _value(text, 'icefrog_jobs{state="running"}') == 5
    assert _value(text, 'icefrog_jobs{state="pending"}') == 0
    assert _value(text, "icefrog_capacity_gpus") == 16


def test_durations_are_histograms_with_buckets_from_10_ms_to_5_minutes() -> None:
    metrics = ControllerMetrics()
    round_tick = TickReport(_plan(1, []), ReconcileResult(), 0.125, {}, reconcile_s=42.0)
    between = TickReport(_plan(None, [], time=1020.0), ReconcileResult(), 0.003, {}, 0.002)
    metrics.observe(round_tick)
    metrics.observe(between)
    text = _text(metrics)
    assert DURATION_BUCKETS[0] == 0.01 and DURATION_BUCKETS[-1] == 300.0
    for le in DURATION_BUCKETS:
        assert f'icefrog_round_duration_seconds_bucket{{le="{le}"}}' in text
    # the round's own work only: a tick between rounds is no round
    assert _value(text, 'icefrog_round_duration_seconds_bucket{le="0.1"}') == 0
    assert _value(text, 'icefrog_round_duration_seconds_bucket{le="0.25"}') == 1
    assert _value(text, 'icefrog_round_duration_seconds_bucket{le="+Inf"}') == 1
    assert _value(text, "icefrog_round_duration_seconds_sum") == 0.125
    assert _value(text, "icefrog_solve_duration_seconds_count") == 1
    assert _value(text, "icefrog_solve_duration_seconds_sum") == 0.25
    # every tick's reconcile pass
    assert _value(text, "icefrog_reconcile_duration_seconds_count") == 2
    assert _value(text, 'icefrog_reconcile_duration_seconds_bucket{le="0.01"}') == 1
    assert _value(text, 'icefrog_reconcile_duration_seconds_bucket{le="30.0"}') == 1
    assert _value(text, 'icefrog_reconcile_duration_seconds_bucket{le="60.0"}') == 2
    assert _value(text, "icefrog_rounds_total") == 1
    assert _value(text, "icefrog_last_tick_timestamp_seconds") == 1020.0
    assert "# TYPE icefrog_round_duration_seconds histogram" in text


def test_report_outcomes_are_counted_from_the_drains_result() -> None:
    metrics = ControllerMetrics()
    text = _text(metrics)  # every outcome exists at 0 before the first drain
    for outcome in ("accepted", "rejected", "duplicate", "deferred"):
        assert _value(text, f'icefrog_reports_total{{outcome="{outcome}"}}') == 0
    drained = DrainResult(accepted=3, rejected=2, duplicates=1, deferred=4)
    for _ in range(2):
        metrics.observe(TickReport(_plan(None, []), ReconcileResult(), 0.0, {}, drain=drained))
    metrics.observe(TickReport(_plan(None, []), ReconcileResult(), 0.0, {}))  # no drain
    text = _text(metrics)
    assert _value(text, 'icefrog_reports_total{outcome="accepted"}') == 6
    assert _value(text, 'icefrog_reports_total{outcome="rejected"}') == 4
    assert _value(text, 'icefrog_reports_total{outcome="duplicate"}') == 2
    assert _value(text, 'icefrog_reports_total{outcome="deferred"}') == 8


def test_the_real_controllers_ticks_feed_every_series() -> None:
    """The production controller (over the simulated cluster and a SQLite store) leads,
    drains, rounds and reconciles; the metrics say so: the leader gauge is 1 during its
    ticks and 0 once it let go, the last round's time is the last round's, and the drain's
    counts reach the report counters."""
    jobs = [TraceJob(f"j{i}", 0.0, "resnet18-cifar10", 1, 128) for i in range(2)]
    engine = Engine(jobs, StandInPolicy(), settings=Settings(), options=SimOptions(gpus=4))
    metrics = ControllerMetrics()
    leader_seen: list[float] = []
    rounds: list[float] = []
    drains: list[int] = []

    def on_tick(report: TickReport) -> None:
        metrics.observe(report)
        leader_seen.append(_value(_text(metrics), "icefrog_leader"))
        if report.plan.new_round:
            rounds.append(report.plan.time)

    def drain() -> DrainResult:
        drains.append(1)
        return DrainResult(accepted=1, rejected=1)

    controller = engine.controller
    controller.on_tick, controller.on_lead, controller.drain = on_tick, metrics.lead, drain
    try:
        assert _value(_text(metrics), "icefrog_leader") == 0  # not leading yet
        engine._arrivals()  # the two jobs register (as their first reports would)
        for _ in range(3):  # a round, then ticks that keep converging to it
            controller.run(max_ticks=1)
            engine.clock.sleep(Settings().controller.round_period_s / 2)
    finally:
        engine.close()
    text = _text(metrics)
    assert leader_seen == [1.0, 1.0, 1.0] and _value(text, "icefrog_leader") == 0
    assert len(rounds) == 2 and _value(text, "icefrog_rounds_total") == 2
    assert _value(text, "icefrog_last_round_timestamp_seconds") == rounds[-1]
    assert _value(text, "icefrog_round_duration_seconds_count") == 2
    assert _value(text, "icefrog_reconcile_duration_seconds_count") == 3
    assert _value(text, "icefrog_gpus_allocated") == 2  # the stand-in's two 1-GPU jobs
    assert drains and _value(text, 'icefrog_reports_total{outcome="accepted"}') == len(drains)
    assert _value(text, 'icefrog_reports_total{outcome="rejected"}') == len(drains)


RULES = Path(__file__).resolve().parents[2] / "slurm_conf" / "icefrog-alerts.rules.yml"


def test_the_example_alert_rules_use_only_series_the_controller_exports() -> None:
    """Read line by line (no YAML library): every rule has a comment above it, an
    expression, a severity and a summary; every icefrog series an expression names, and
    every report outcome, is in the exposition of a controller that ticked."""
    metrics = ControllerMetrics()
    metrics.lead(True)
    drained = DrainResult(accepted=1)
    metrics.observe(TickReport(_plan(1, []), ReconcileResult(), 0.1, {}, drain=drained))
    exported = set(re.findall(r"^(icefrog_[a-z_]+)", _text(metrics), re.MULTILINE))
    lines = RULES.read_text().splitlines()
    alerts = [i for i, line in enumerate(lines) if line.strip().startswith("- alert: ")]
    assert len(alerts) >= 5
    for start, end in zip(alerts, [*alerts[1:], len(lines)], strict=True):
        assert lines[start - 1].strip().startswith("#"), lines[start]  # explained
        rule = "\n".join(lines[start:end])
        assert "expr:" in rule and "severity:" in rule and "summary:" in rule, lines[start]
    expressions = "\n".join(lines[alerts[0] :])
    used = set(re.findall(r"\b(icefrog_[a-z_]+)", expressions))
    assert {
        "icefrog_leader",
        "icefrog_last_round_timestamp_seconds",
        "icefrog_reconcile_failures_total",
        "icefrog_reports_total",
        "icefrog_round_duration_seconds_bucket",
    } <= used
    assert used <= exported, used - exported
    outcomes = set(re.findall(r'outcome="([a-z]+)"', expressions))
    assert outcomes and outcomes <= set(REPORT_OUTCOMES)
    assert "up{" in expressions  # the controller down: Prometheus's own series


class _LostLease:
    """A lead that is found lost at the first tick (another controller took over)."""

    epoch = 7

    @contextmanager
    def hold(self) -> Iterator[None]:
        raise LostLead("the lease's epoch is 8 now")
        yield  # pragma: no cover

    def release(self) -> None:
        pass


class _Store:
    def try_lead(self) -> _LostLease:
        return _LostLease()


class _Clock:
    def now(self) -> float:
        return 0.0

    def sleep(self, seconds: float) -> None:
        pass


def test_the_leader_gauge_drops_when_the_lead_is_lost() -> None:
    metrics = ControllerMetrics()
    seen: list[float] = []

    def lead(leading: bool) -> None:
        metrics.lead(leading)
        seen.append(_value(_text(metrics), "icefrog_leader"))

    controller = Controller(
        settings=Settings(),
        policy=StandInPolicy(),
        cluster=None,  # type: ignore[arg-type]  # never asked: no tick gets that far
        store=_Store(),  # type: ignore[arg-type]
        clock=_Clock(),
        files=None,  # type: ignore[arg-type]
        on_lead=lead,
    )
    assert controller.run(max_ticks=2) == 2  # led twice, lost it twice
    assert seen == [1.0, 0.0, 1.0, 0.0]
