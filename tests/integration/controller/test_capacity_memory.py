"""The controller against the real local cluster (CR_Core_Memory, DefMemPerGPU=450): a
foreign job holding one GPU and its node's whole memory (``--mem=0``) takes the node's
four GPUs out of the capacity, and no icefrog job is released onto the three it leaves
free (Slurm would keep it pending, Resources)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.parse import expand_hostlist
from icefrog_slurm.store.sql import SqlStore
from tests.integration.controller.support import (
    OffsetClock,
    converge,
    make_controller,
    make_settings,
    running,
    submit_job,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


TAG_PREFIX = "cap-"
"""The tags of this module's jobs (the ``cluster`` fixture cancels them: conftest.py)."""


def test_a_foreign_job_holding_a_nodes_memory_takes_all_its_gpus_out(
    tmp_path: Path, store: SqlStore, cluster: SlurmCliBackend, job_dir: Path
) -> None:
    out = subprocess.run(
        ["sbatch", "--parsable", "-p", "gpu", "--gres=gpu:1", "--mem=0", "-N1",
         "-o", "/dev/null", "--wrap", "sleep 120"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    try:
        [taken] = expand_hostlist(running(cluster, out).nodelist)
        node = {n.name: n for n in cluster.partition_capacity(partition="gpu").nodes}[taken]
        assert (node.foreign_gpus, node.blocked_gpus, node.blocked_by) == (1, 3, "memory")
        # one GPU wanted: best fit would pick the node with 3 GPUs free, were they usable
        _, sid, _ = submit_job(store, cluster, job_dir, f"cap-{uuid.uuid4().hex[:8]}")
        ctl = make_controller(make_settings(tmp_path), store, StandInPolicy(), OffsetClock())
        report = ctl.tick_once()
        assert report.plan.capacity_gpus == 12
        converge(ctl)
        placed = running(cluster, sid)
        assert taken not in expand_hostlist(placed.nodelist)
        assert running(cluster, out).job_id == out  # untouched
    finally:
        cluster.cancel(job_id=out)
