"""Contract of the ClusterPort, run over every adapter against the real local cluster.

The semantics every implementation honours are ``tests/contract/cluster_semantics.py``
(``TestSlurmSemantics`` runs them here; SimCluster runs them in tests/contract); below them,
what only a real Slurm shows: the job's environment (CUDA_VISIBLE_DEVICES, the shard's GPU
ordinal, SLURM_RESTART_COUNT), StartTime=now after a requeue, a resubmission's batch script,
output path and signature, and slurmctld down or stopped.

The CLI adapter runs; the pyslurm adapter runs over the real pyslurm where it is importable,
else over the test stand-in ``tests/support/fake_pyslurm`` (pyslurm 25.11's API done with
the cluster's command-line tools: it checks the adapter's logic, not pyslurm itself), and is
skipped (``PYSLURM_REASON``) only when neither can be imported. It runs against the first
Slurm version of the matrix only: a pyslurm is built for one Slurm (25.11), and the
stand-in's commands are the CLI adapter's, which every version runs.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag, SlurmJobState
from icefrog_slurm.settings import ControllerSettings
from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
from icefrog_slurm.slurm.parse import expand_hostlist
from icefrog_slurm.slurm.port import (
    ClusterPort,
    SlurmRejected,
    SlurmUnavailable,
    SubmitRequest,
)
from icefrog_slurm.slurm.pyslurm_backend import SlurmPyslurmBackend
from tests.contract.cluster_semantics import ClusterSemantics
from tests.integration.conftest import cluster_sh, wait_for

pytestmark = pytest.mark.slurm

FAKE_PYSLURM = Path(__file__).resolve().parents[1] / "support" / "fake_pyslurm"
PYSLURM_REASON = (
    "neither pyslurm nor its test stand-in is importable: pyslurm on PyPI is 25.11 only and "
    "its build refuses Slurm 22.05 and 24.11 (setup checks the exact major version)"
)
NOBODY = 65534

# The job a test runs: prints its view, checkpoints (touches a marker) on USR1, then waits.
SCRIPT = """#!/bin/bash
echo "CVD=$CUDA_VISIBLE_DEVICES GDO=$GPU_DEVICE_ORDINAL RESTARTS=${SLURM_RESTART_COUNT:-0} \
NODES=$SLURM_JOB_NODELIST"
trap 'touch "ckpt.$SLURM_JOB_ID"' USR1
while true; do sleep 1000 & wait $!; done
"""


def _pyslurm_backend(monkeypatch: pytest.MonkeyPatch, settings: CliSettings) -> ClusterPort:
    """The pyslurm adapter over the real pyslurm, else over the stand-in (put on sys.path)."""
    try:
        importlib.import_module("pyslurm")
    except ImportError:
        monkeypatch.delitem(sys.modules, "pyslurm", raising=False)
        monkeypatch.syspath_prepend(str(FAKE_PYSLURM))
        try:
            assert importlib.import_module("pyslurm").IS_TEST_STAND_IN
        except ImportError:
            pytest.skip(PYSLURM_REASON)
    return SlurmPyslurmBackend(settings)


@pytest.fixture(params=["cli", pytest.param("pyslurm", marks=pytest.mark.one_slurm_version)])
def port(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, slurm_cluster: str
) -> Iterator[ClusterPort]:
    settings = CliSettings(timeout_s=20, attempts=3, backoff_s=0.2)
    if request.param == "pyslurm":
        backend = _pyslurm_backend(monkeypatch, settings)
    else:
        backend = SlurmCliBackend(settings)
    yield backend
    _cancel_tagged(backend)
    sys.modules.pop("pyslurm", None)


def _ours() -> list[str]:
    """Live jobs this module made (comment icefrog:ct-*, or name ct-foreign)."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i|%j|%k"], capture_output=True, text=True, check=False
    ).stdout
    rows = [line.split("|", 2) for line in out.splitlines()]
    return [
        jid
        for jid, name, comment in rows
        if comment.startswith("icefrog:ct-") or name == "ct-foreign"
    ]


def _cancel_tagged(backend: ClusterPort) -> None:
    """Cancel this module's jobs and wait until they are gone (their GPUs free again)."""
    for jid in _ours():
        backend.cancel(job_id=jid)
    wait_for("test jobs to end", lambda: not _ours(), timeout=30)


@pytest.fixture
def script(job_dir: Path) -> Path:
    path = job_dir / "job.sh"
    path.write_text(SCRIPT)
    path.chmod(0o755)
    return path


def _request(script: Path, key: str, gres: Gres, **kw: object) -> SubmitRequest:
    return SubmitRequest(
        script=str(script),
        tag=IcefrogTag(f"ct-{key}"),
        name=f"icefrog-ct-{key}",
        gres=gres,
        output=str(script.parent / "%j.out"),
        workdir=str(script.parent),
        partition="gpu",
        **kw,  # type: ignore[arg-type]
    )


def _after_requeue() -> None:
    """Wait as the controller does (settings' release_gap_s) before releasing a requeued
    job: a launch credential made in the second the requeue revoked the last one is
    refused ("Job credential revoked"), which 24.11 and 26.05, starting a released job at
    once, meet more often than 22.05; the job ends FAILED instead of starting."""
    time.sleep(ControllerSettings().release_gap_s)


T = TypeVar("T")


class SlurmHarness:
    """``ClusterHarness`` on the local cluster (node1-node4, 4 GPUs each): the foreign user
    and the job owner of a resubmission are ``nobody``, the administrator is root."""

    partition = "gpu"
    nodes = ("node1", "node2", "node3", "node4")
    gpus_per_node = 4

    def __init__(self, port: ClusterPort, script: Path) -> None:
        self.port, self.script = port, script

    def request(
        self, key: str, gres: Gres, *, nodes: tuple[str, ...] = (), num_nodes: int = 1
    ) -> SubmitRequest:
        return _request(self.script, key, gres, nodes=nodes, num_nodes=num_nodes)

    def wait(self, what: str, fn: Callable[[], T | None], timeout: float = 30.0) -> T:
        return wait_for(what, fn, timeout=timeout)

    def settle(self) -> None:
        time.sleep(1)

    def after_requeue(self) -> None:
        _after_requeue()

    def foreign_job(self, *, gpus: int, node: str, whole_memory: bool = False) -> str:
        memory = ("--mem=0",) if whole_memory else ()
        jid = _submit_as_nobody(
            self.script.parent, "-J", "ct-foreign", f"--gres=gpu:{gpus}", "-w", node, "-p", "gpu",
            *memory,
        )  # fmt: skip
        _running(self.port, jid)
        return jid

    def owned_held_job(self, key: str, gres: Gres) -> tuple[str, int]:
        jid = _submit_as_nobody(
            self.script.parent, "-H", "--requeue", "-J", f"icefrog-ct-{key}",
            f"--comment=icefrog:ct-{key}", f"--gres={gres}", "-p", "gpu",
        )  # fmt: skip
        return jid, NOBODY

    def admin_hold(self, job_id: str) -> None:
        subprocess.run(["scontrol", "hold", job_id], check=True)  # as root

    def checkpointed(self, job_id: str) -> bool:
        return (self.script.parent / f"ckpt.{job_id}").exists()


class TestSlurmSemantics(ClusterSemantics):
    @pytest.fixture
    def harness(self, port: ClusterPort, script: Path) -> SlurmHarness:
        return SlurmHarness(port, script)


def _state(port: ClusterPort, jid: str) -> SlurmJobState:
    return port.poll(job_ids=[jid])[jid]


def _running(port: ClusterPort, jid: str, timeout: float = 20) -> SlurmJobState:
    return wait_for(
        f"job {jid} RUNNING",
        lambda: (s := _state(port, jid)).state == "RUNNING" and s,
        timeout=timeout,
    )


def _output(script: Path, jid: str, pattern: str = "CVD=") -> str:
    out = script.parent / f"{jid}.out"
    return wait_for(
        f"output of job {jid}",
        lambda: out.exists() and pattern in (t := out.read_text()) and t,
    )


def _cvd_count(text: str) -> int:
    m = re.search(r"CVD=(\S*)", text)
    return len(m.group(1).split(",")) if m and m.group(1) else 0


def test_the_job_sees_the_decided_gpus(port: ClusterPort, script: Path) -> None:
    jid = port.submit_held(request=_request(script, "env", Gres("gpu", 1)))
    port.update_pending(job_id=jid, gres=Gres("gpu", 2), num_nodes=1, nodes=("node2",))
    port.release(job_id=jid)
    assert _running(port, jid).nodelist == "node2"
    assert _cvd_count(_output(script, jid)) == 2


def test_a_requeued_job_restarts_at_once_and_sees_its_new_gpus(
    port: ClusterPort, script: Path
) -> None:
    jid = port.submit_held(request=_request(script, "cycle", Gres("gpu", 1)))
    port.release(job_id=jid)
    _running(port, jid)
    assert _cvd_count(_output(script, jid)) == 1
    port.requeue_hold(job_id=jid)
    wait_for("requeued and held", lambda: _state(port, jid).held, timeout=20)
    port.update_pending(job_id=jid, gres=Gres("gpu", 2))
    _after_requeue()
    started = time.monotonic()
    port.release_now(job_id=jid)
    _running(port, jid, timeout=30)  # without StartTime=now it would wait ~120 s
    assert time.monotonic() - started < 60
    assert _cvd_count(_output(script, jid, "RESTARTS=1")) == 2


def test_two_shard_jobs_see_the_same_gpu_ordinal(port: ClusterPort, script: Path) -> None:
    ids = [
        port.submit_held(request=_request(script, f"sh-{k}", Gres("shard", 1), nodes=("node1",)))
        for k in "ab"
    ]
    for jid in ids:
        port.release(job_id=jid)
        _running(port, jid)
    gdo = {re.search(r"GDO=(\d+)", _output(script, j, "GDO=")) for j in ids}
    assert len({m.group(1) for m in gdo if m}) == 1


@pytest.mark.parametrize(
    ("options", "gpus"),
    [
        (("--gpus=2", "-w", "node2"), 2),
        (("-n2", "--gpus-per-task=1", "-w", "node2"), 2),
        (("--gpus-per-node=3", "-w", "node2"), 3),
        (("--gpus=5", "-N2", "-w", "node[3-4]"), 5),
    ],
    ids=["gpus", "gpus-per-task", "gpus-per-node", "gpus-on-two-nodes"],
)
def test_a_foreign_job_holds_its_gpus_however_it_asked_for_them(
    port: ClusterPort, job_dir: Path, options: tuple[str, ...], gpus: int
) -> None:
    """``--gpus``/``--gpus-per-task`` leave squeue's per-node request empty: the GPUs Slurm
    allocated (its per-node detail) leave the capacity all the same."""
    before = port.partition_capacity(partition="gpu")
    jid = _submit_as_nobody(job_dir, "-J", "theirs", "-p", "gpu", *options)
    try:
        _running(port, jid)
        after = port.partition_capacity(partition="gpu")
        assert jid in after.foreign_job_ids
        assert after.available_gpus == before.available_gpus - gpus
        gained = {
            n.name: n.foreign_gpus - b.foreign_gpus
            for n, b in zip(after.nodes, before.nodes, strict=True)
            if n.foreign_gpus != b.foreign_gpus
        }
        assert set(gained) == set(expand_hostlist(options[-1]))
    finally:
        subprocess.run(["scancel", jid], check=False)
        wait_for("it ended", lambda: jid not in port.poll(job_ids=[jid]) or
                 port.poll(job_ids=[jid])[jid].finished, timeout=30)  # fmt: skip


def _submit_as_nobody(job_dir: Path, *args: str, script: str = SCRIPT) -> str:
    out = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
         "sbatch", "--parsable", f"--chdir={job_dir}", f"--output={job_dir}/%j.out", *args],
        input=script, capture_output=True, text=True, check=True, env=dict(os.environ),
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def test_a_resubmission_keeps_the_owners_script_and_is_signed(
    port: ClusterPort, job_dir: Path
) -> None:
    old = _submit_as_nobody(
        job_dir, "-H", "--requeue", "-J", "icefrog-ct-owner", "--comment=icefrog:ct-owner",
        "--gres=gpu:1", "-p", "gpu",
    )  # fmt: skip
    if " 22.05." in subprocess.run(["sbatch", "--version"], capture_output=True, text=True).stdout:
        with pytest.raises(SlurmRejected, match="Invalid generic resource"):
            port.update_pending(job_id=old, gres=Gres("shard", 1))  # why resubmission exists
    script_before = subprocess.run(
        ["scontrol", "write", "batch_script", old, "-"], capture_output=True, text=True, check=True
    ).stdout
    with pytest.raises(SlurmRejected, match="Slurm says uid 65534 owns it"):
        port.resubmit(job_id=old, owner_uid=0, gres=Gres("shard", 1))  # never as another uid
    new = port.resubmit(
        job_id=old, owner_uid=NOBODY, gres=Gres("shard", 1), num_nodes=1, nodes=("node2",)
    )
    detail = port.job_detail(job_id=new)
    assert (detail.user_id, detail.group_id) == (NOBODY, NOBODY)
    assert detail.tag is not None and detail.tag.signature  # signed by the controller
    assert detail.name == "icefrog-ct-owner" and detail.work_dir == str(job_dir)
    assert detail.std_out is not None  # its own file, not the old job's (%j as JSON shows it)
    assert detail.std_out.replace("%j", new) == f"{job_dir}/{new}.out"
    script_after = subprocess.run(
        ["scontrol", "write", "batch_script", new, "-"], capture_output=True, text=True, check=True
    ).stdout
    assert script_after == script_before
    port.release_now(job_id=new)
    _running(port, new)
    assert re.search(r"GDO=\d", _output(job_dir / "job.sh", new, "GDO="))


@pytest.mark.slow
def test_slurmctld_down_raises_unavailable_after_bounded_retries(slurm_cluster: str) -> None:
    slept: list[float] = []
    backend = SlurmCliBackend(
        CliSettings(timeout_s=10, attempts=2, backoff_s=0.1),
        sleep=slept.append,
    )
    pid = int((Path(slurm_cluster).parent.parent / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    try:
        wait_for("slurmctld to stop", lambda: not Path(f"/proc/{pid}").exists())
        with pytest.raises(SlurmUnavailable, match="gave up after 2 tries"):
            backend.poll(job_ids=["1"])
        assert slept == [0.1]  # one backoff between the two tries
        once = SlurmCliBackend(CliSettings(timeout_s=10, attempts=1))
        with pytest.raises(SlurmUnavailable, match="gave up after 1 tries"):
            once.release(job_id="1")
    finally:
        up = cluster_sh("up")
        assert up.returncode == 0, up.stderr
    assert backend.partition_capacity(partition="gpu").total_gpus == 16


def test_slow_slurmctld_times_out_and_a_submission_is_never_doubled(
    slurm_cluster: str, script: Path
) -> None:
    slept: list[float] = []
    slow = SlurmCliBackend(CliSettings(timeout_s=1, attempts=2, backoff_s=0.1), sleep=slept.append)
    request = _request(script, "slow", Gres("gpu", 1))
    pid = int((Path(slurm_cluster).parent.parent / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGSTOP)  # slurmctld stops answering, its socket still accepts
    try:
        with pytest.raises(SlurmUnavailable, match="timed out after 1 s"):
            slow.poll(job_ids=["1"])
        with pytest.raises(SlurmUnavailable, match="gave up after 2 tries"):
            slow.submit_held(request=request)
        assert slept == [0.1, 0.1, 0.2]  # poll's one backoff; sbatch's, then the last look's
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(1)  # let slurmctld work off what reached it while stopped
    backend = SlurmCliBackend(CliSettings(attempts=3, backoff_s=0.5))
    try:
        jid = backend.submit_held(request=request)
        assert backend.submit_held(request=request) == jid  # idempotent per tag
        live = [j for j in _ours() if backend.job_detail(job_id=j).tag == request.tag]
        assert live == [jid]
    finally:
        _cancel_tagged(backend)
