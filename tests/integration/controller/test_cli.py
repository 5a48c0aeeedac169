"""``icefrog controller`` as admins run it: --dry-run prints the plan and enacts nothing;
--once makes one tick; the Prometheus endpoint serves the tick's figures."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from icefrog_slurm.controller.daemon import TickReport
from icefrog_slurm.controller.metrics import ControllerMetrics
from icefrog_slurm.controller.reconcile import ReconcileResult
from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.domain.plan import JobPlan, Plan, SlurmRequest
from icefrog_slurm.domain.records import Allocation
from tests.integration.controller.support import (
    backend,
    make_settings,
    make_store,
    running,
    state_of,
    submit_job,
)

REPO = Path(__file__).resolve().parents[3]


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", "controller", "--config", str(config), *args],
        env={**os.environ, "PYTHONPATH": str(REPO), "JOURNAL_STREAM": "8:1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slurm
def test_dry_run_prints_the_plan_and_enacts_nothing_then_once_enacts(
    tmp_path: Path, job_dir: Path
) -> None:
    settings = make_settings(tmp_path)
    config = tmp_path / "icefrog.toml"
    config.write_text(f'[state]\ndir = "{settings.state.dir}"\n')
    store = make_store(settings)
    cluster = backend()
    _, sid, _ = submit_job(store, cluster, job_dir, f"ctl-{uuid.uuid4().hex[:8]}", min_gpus=2)
    try:
        dry = _cli(config, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        plan = json.loads(dry.stdout[dry.stdout.index("{") :])
        [entry] = plan["jobs"]  # the icefrog policy, on the prior (no samples yet)
        gpus = entry["allocation"]["gpus"]
        assert entry["action"] == "start" and 2 <= gpus <= 4 and plan["policy"] == "icefrog"
        assert entry["target"]["gres"] == f"gpu:{gpus}"
        assert state_of(cluster, sid).held
        with store.transaction() as tx:
            assert tx.round() is None and tx.actions() == []
        once = _cli(config, "--once")
        assert once.returncode == 0, once.stderr
        assert "INFO icefrog_slurm.controller.daemon: round 1 (icefrog)" in once.stdout
        assert running(cluster, sid).gres == Gres("gpu", gpus)
    finally:
        cluster.cancel(job_id=sid)
        store.close()


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "icefrog.toml"
    config.write_text("[controller]\nround_period = 5\n")
    out = _cli(config, "--once")
    assert out.returncode == 2 and "round_period" in out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_endpoint_serves_a_ticks_figures() -> None:
    alloc = [
        Allocation(1, 2, 32, 0, nodes=("node1",)),
        Allocation(2, 1, 32, 0, shared=True, nodes=("node2",)),
        Allocation(3, 1, 32, 0, shared=True, nodes=("node2",)),
    ]
    jobs = tuple(
        JobPlan(a.job_id, str(a.job_id), 0, a, SlurmRequest(Gres("gpu", 1)), "none") for a in alloc
    )
    plan = Plan(time=0.0, round_no=4, policy="p", capacity_gpus=16, jobs=jobs, solve_s=0.25)
    report = TickReport(plan, ReconcileResult(reallocations=2), 0.125, {"running": 3})
    metrics = ControllerMetrics()
    port = _free_port()
    metrics.serve(port=port, address="127.0.0.1")
    metrics.observe(report)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in (
        "icefrog_round_duration_seconds_sum 0.125",
        "icefrog_solve_duration_seconds_sum 0.25",
        'icefrog_jobs{state="running"} 3.0',
        "icefrog_gpus_allocated 3.0",
        "icefrog_gpus_shared 1.0",  # the two shared jobs on node2 share one GPU
        "icefrog_jobs_sharing 2.0",
        "icefrog_reallocations_total 2.0",
        "icefrog_capacity_gpus 16.0",
    ):
        assert line in text, line
