"""Contract of the ClusterPort, run over every adapter against the real local cluster.

The CLI adapter runs; the pyslurm adapter runs over the real pyslurm where it is importable,
else over the test stand-in ``tests/support/fake_pyslurm`` (pyslurm 25.11's API done with
the cluster's command-line tools: it checks the adapter's logic, not pyslurm itself), and is
skipped (``PYSLURM_REASON``) only when neither can be imported.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag, SlurmJobState
from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
from icefrog_slurm.slurm.port import (
    ClusterPort,
    JobNotFound,
    SlurmRejected,
    SlurmUnavailable,
    SubmitRequest,
)
from icefrog_slurm.slurm.pyslurm_backend import SlurmPyslurmBackend
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


@pytest.fixture(params=["cli", "pyslurm"])
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


def test_held_job_released_with_decided_gpus_and_node(port: ClusterPort, script: Path) -> None:
    jid = port.submit_held(request=_request(script, "held", Gres("gpu", 1)))
    held = _state(port, jid)
    assert held.held and held.tag == IcefrogTag("ct-held")
    time.sleep(0.5)
    assert _state(port, jid).state == "PENDING"  # held: it does not start by itself
    port.update_pending(job_id=jid, gres=Gres("gpu", 2), num_nodes=1, nodes=("node2",))
    port.release(job_id=jid)
    run = _running(port, jid)
    assert run.nodelist == "node2" and run.gres == Gres("gpu", 2)
    [alloc] = port.gres_allocation(job_id=jid)
    assert alloc.nodes == ("node2",) and alloc.kind == "gpu" and len(alloc.indices) == 2
    assert _cvd_count(_output(script, jid)) == 2


def test_pending_job_gpus_and_nodes_change(port: ClusterPort, script: Path) -> None:
    jid = port.submit_held(request=_request(script, "resize", Gres("gpu", 1)))
    port.update_pending(job_id=jid, gres=Gres("gpu", 3), num_nodes=2, nodes=("node3", "node4"))
    detail = port.job_detail(job_id=jid)
    assert detail.gres == Gres("gpu", 3) and detail.num_nodes == 2
    assert port.hostnames(nodelist=detail.req_nodes or "") == ("node3", "node4")
    assert detail.state == "PENDING"
    port.release(job_id=jid)
    run = _running(port, jid)
    assert run.nodelist == "node[3-4]" and run.num_nodes == 2
    assert {a.nodes: len(a.indices) for a in port.gres_allocation(job_id=jid)} == {
        ("node3", "node4"): 3
    }


def test_requeuehold_update_release_cycle(port: ClusterPort, script: Path) -> None:
    jid = port.submit_held(request=_request(script, "cycle", Gres("gpu", 1)))
    port.release(job_id=jid)
    _running(port, jid)
    assert _cvd_count(_output(script, jid)) == 1
    port.signal_batch(job_id=jid, signal="USR1")
    wait_for("checkpoint marker", (script.parent / f"ckpt.{jid}").exists, timeout=15)
    port.requeue_hold(job_id=jid)
    wait_for("requeued and held", lambda: _state(port, jid).held, timeout=20)
    port.update_pending(job_id=jid, gres=Gres("gpu", 2))
    started = time.monotonic()
    port.release_now(job_id=jid)
    run = _running(port, jid, timeout=30)  # without StartTime=now it would wait ~120 s
    assert time.monotonic() - started < 60 and run.gres == Gres("gpu", 2)
    assert port.job_detail(job_id=jid).restarts == 1
    text = _output(script, jid, "RESTARTS=1")
    assert _cvd_count(text) == 2


def test_a_released_job_not_started_yet_can_be_held_again(port: ClusterPort, script: Path) -> None:
    # what reconcile does before a gpu<->shard resubmission of a job Slurm has not started
    jid = port.submit_held(request=_request(script, "rehold", Gres("gpu", 1)))
    subprocess.run(["scontrol", "update", f"jobid={jid}", "StartTime=now+1hour"], check=True)
    port.release(job_id=jid)
    pending = _state(port, jid)
    assert pending.state == "PENDING" and not pending.held
    port.hold(job_id=jid)
    assert wait_for("held", lambda: _state(port, jid).held, timeout=10)
    port.release_now(job_id=jid)
    assert _running(port, jid, timeout=30).gres == Gres("gpu", 1)


def test_an_administrators_hold_is_never_lifted(port: ClusterPort, script: Path) -> None:
    jid = port.submit_held(request=_request(script, "adminhold", Gres("gpu", 1)))
    port.hold(job_id=jid)  # icefrog's own hold: a user hold
    assert _state(port, jid).reason == "JobHeldUser"
    subprocess.run(["scontrol", "hold", jid], check=True)  # as root: an administrator's hold
    assert wait_for("admin hold", lambda: _state(port, jid).admin_held, timeout=10)
    with pytest.raises(SlurmRejected, match="held by an administrator"):
        port.release(job_id=jid)
    with pytest.raises(SlurmRejected, match="held by an administrator"):
        port.release_now(job_id=jid)
    assert _state(port, jid).admin_held


def test_shard_pair_on_one_gpu(port: ClusterPort, script: Path) -> None:
    a = port.submit_held(request=_request(script, "sh-a", Gres("shard", 1), nodes=("node1",)))
    b = port.submit_held(request=_request(script, "sh-b", Gres("shard", 1), nodes=("node1",)))
    port.release(job_id=a)
    _running(port, a)
    [alloc_a] = port.gres_allocation(job_id=a)
    port.release(job_id=b)
    _running(port, b)
    [alloc_b] = port.gres_allocation(job_id=b)
    assert alloc_a.kind == alloc_b.kind == "shard" and alloc_a.nodes == alloc_b.nodes
    assert alloc_a.indices == alloc_b.indices and len(alloc_a.indices) == 1
    gdo = {re.search(r"GDO=(\d+)", _output(script, j, "GDO=")) for j in (a, b)}
    assert len({m.group(1) for m in gdo if m}) == 1  # both see the same GPU ordinal


def _submit_as_nobody(job_dir: Path, *args: str, script: str = SCRIPT) -> str:
    out = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
         "sbatch", "--parsable", f"--chdir={job_dir}", f"--output={job_dir}/%j.out", *args],
        input=script, capture_output=True, text=True, check=True, env=dict(os.environ),
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def test_foreign_job_gpus_are_excluded_from_capacity(port: ClusterPort, job_dir: Path) -> None:
    before = port.partition_capacity(partition="gpu")
    assert before.total_gpus == 16
    foreign = _submit_as_nobody(job_dir, "-J", "ct-foreign", "--gres=gpu:2", "-w", "node4")
    _running(port, foreign)
    assert port.job_detail(job_id=foreign).user_id == NOBODY
    after = port.partition_capacity(partition="gpu")
    assert foreign in after.foreign_job_ids and after.total_gpus == 16
    assert after.available_gpus == before.available_gpus - 2
    node4 = {n.name: n for n in after.nodes}["node4"]
    assert node4.foreign_gpus - {n.name: n for n in before.nodes}["node4"].foreign_gpus == 2


def test_icefrog_jobs_do_not_reduce_capacity(port: ClusterPort, script: Path) -> None:
    before = port.partition_capacity(partition="gpu").available_gpus
    jid = port.submit_held(request=_request(script, "own", Gres("gpu", 2), nodes=("node1",)))
    port.release(job_id=jid)
    _running(port, jid)
    cap = port.partition_capacity(partition="gpu")
    assert cap.available_gpus == before and jid not in cap.foreign_job_ids


def test_batched_poll_of_many_jobs_with_unknown_ids(port: ClusterPort, script: Path) -> None:
    ids = [port.submit_held(request=_request(script, f"poll{i}", Gres("gpu", 1))) for i in range(3)]
    states = port.poll(job_ids=[*ids, "9999999"])
    assert sorted(states) == sorted(ids) and all(s.held for s in states.values())
    assert port.poll(job_ids=["9999998"]) == {} and port.poll(job_ids=[]) == {}
    port.cancel(job_id=ids[0])
    port.cancel(job_id=ids[0])  # cancelling twice is fine
    port.cancel(job_id="9999999")  # and so is an unknown job
    assert wait_for("cancelled", lambda: port.poll(job_ids=ids)[ids[0]].finished)
    with pytest.raises(JobNotFound):
        port.job_detail(job_id="9999999")


def test_resubmission_switches_gpu_to_shard_as_the_owner(port: ClusterPort, job_dir: Path) -> None:
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
    assert new != old
    detail = port.job_detail(job_id=new)
    assert (detail.user_id, detail.group_id) == (NOBODY, NOBODY)
    assert detail.tag is not None and detail.tag.signature  # signed by the controller
    assert (detail.tag.key, detail.tag.previous_id) == ("ct-owner", old)
    assert port.find_successor(job_id=old, owner_uid=NOBODY) == new
    assert port.find_successor(job_id=old, owner_uid=0) is None
    assert (
        detail.gres == Gres("shard", 1)
        and detail.state == "PENDING"
        and detail.reason == "JobHeldUser"
    )
    assert detail.name == "icefrog-ct-owner" and detail.work_dir == str(job_dir)
    assert detail.std_out is not None  # its own file, not the old job's (%j as JSON shows it)
    assert detail.std_out.replace("%j", new) == f"{job_dir}/{new}.out"
    assert wait_for("old job cancelled", lambda: _state(port, old).state == "CANCELLED")
    script_after = subprocess.run(
        ["scontrol", "write", "batch_script", new, "-"], capture_output=True, text=True, check=True
    ).stdout
    assert script_after == script_before
    port.release_now(job_id=new)
    _running(port, new)
    assert re.search(r"GDO=\d", _output(job_dir / "job.sh", new, "GDO="))
    with pytest.raises(SlurmRejected, match="only a pending"):
        port.resubmit(job_id=new, owner_uid=NOBODY, gres=Gres("gpu", 1))


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
        assert slept == [0.1, 0.1]
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
