"""``icefrog squeue`` beside the real ``squeue`` for a job both know: an icefrog job the real
controller (this test's policy, the local cluster) started on two nodes. The fields with a
Slurm twin (the Slurm job id, partition, user, compact state, node count and the folded
node list) print the same row with the same ``-O`` widths, under the same header names but
the id's (``SlurmJobID`` here: ``JobID`` is the icefrog id).
(The headers and letters of every field against squeue's own: tests/integration/report/
test_report_vs_slurm.py. sacct cannot be compared here: the local cluster keeps no
accounting, ``AccountingStorageType=accounting_storage/none``.)
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import wait_for
from tests.integration.controller.support import (
    FixedPolicy,
    OffsetClock,
    backend,
    converge,
    make_controller,
    make_settings,
    make_store,
    running,
    submit_job,
)

pytestmark = pytest.mark.slurm

OURS = "SlurmJobID:12,Partition:10,User:8,ST:3,Nodes:6,NodeList:20"
SLURMS = "JobID:12,Partition:10,UserName:8,StateCompact:3,NumNodes:6,NodeList:20"


def _idle_pair() -> tuple[str, ...] | None:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %T"], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    idle = sorted({n for n, state in map(str.split, out.splitlines()) if state == "idle"})
    return tuple(idle[:2]) if len(idle) >= 2 else None


def _icefrog_squeue(url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", "squeue", "--db", url, "-O", OURS, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _squeue(job_id: str, *args: str) -> str:
    return subprocess.run(
        ["squeue", "-j", job_id, "-O", SLURMS, *args], capture_output=True, text=True,
        check=True, timeout=60,
    ).stdout  # fmt: skip


def test_a_running_jobs_slurm_fields_print_as_squeue_prints_them(
    tmp_path: Path, job_dir: Path
) -> None:
    settings = make_settings(tmp_path)
    store = make_store(settings)
    cluster = backend()
    sid = ""
    try:
        nodes = wait_for("two idle nodes", _idle_pair, timeout=120, every=1)
        job, sid, _ = submit_job(store, cluster, job_dir, f"ctl-{uuid.uuid4().hex[:8]}")
        policy = FixedPolicy({job: (2, False, nodes)})  # one GPU on each of the two nodes
        ctl = make_controller(settings, store, policy, OffsetClock())
        converge(ctl)
        running(cluster, sid)
        real = _squeue(sid)
        assert "[" in real.splitlines()[1], real  # Slurm folds the two names: node[1-2]
        deadline = time.monotonic() + 60
        while (ours := _icefrog_squeue(settings.store.url)).splitlines()[1:] != (
            real.splitlines()[1:]
        ) and time.monotonic() < deadline:
            ctl.tick_once()  # records the job's state once Slurm runs it
            time.sleep(1)
        assert ours.splitlines()[1:] == real.splitlines()[1:]  # the row, byte for byte
        # the header: the same names in the same widths, but the id's (JobID is icefrog's)
        assert ours.splitlines()[0][12:] == real.splitlines()[0][12:]
        assert ours.startswith("SLURMJOBID  ") and real.startswith("JOBID       ")
        assert _icefrog_squeue(settings.store.url, "-h") == _squeue(sid, "-h")
        [line] = _squeue(sid, "-h").splitlines()
        assert line.split()[1:5] == ["gpu", "root", "R", "2"], line
    finally:
        if sid:
            cluster.cancel(job_id=sid)
        store.close()
