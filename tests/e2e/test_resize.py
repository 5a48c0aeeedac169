"""End to end on the local cluster: ``icefrog submit`` a real training job (digits CNN), the
real controller (store, inbox, reconcile, Slurm CLI backend) runs it on 2 GPUs, then
resizes it to 1 (checkpoint, requeue held, GRES update, release); the job resumes from its
checkpoint on one process, reaches its target, and ``icefrog sacct`` counts the restart.

The sizes come from a scripted policy (2 GPUs until the job reports an epoch, then 1): the
test is about enacting a resize, not about which size a policy prefers. The policy moves
the job from node1 to node2: when a job has exited (the launcher checkpoints and exits 75)
and is requeued and released at once on the same node, slurmd may refuse it ("Killing
non-startable batch JobId=N: Job credential revoked", Slurm 22.05) because it revoked
that job id's credential when the first run ended (until cred_expire, 120 s). A
controller restarting on the same node hits this; noted for the controller.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("icefrog_slurm.controller.daemon", reason="the controller is not merged")

from tests.e2e.harness import TwoStepPolicy, icefrog, logs_of, rig

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


@pytest.mark.timeout(240)
def test_resized_job_resumes_and_reaches_target(job_dir: Path) -> None:
    with rig(job_dir, TwoStepPolicy(first=(2, ("node1",)), then=(1, ("node2",)))) as r:
        workdir = job_dir / "cnn"
        sid = r.submit_digits(workdir, "e2e-resize", "cnn")
        try:
            finished = r.run_until_finished(200)
            logs = logs_of(workdir)
            assert finished is not None, logs[-3000:]
            assert finished.finish_reason == "target_reached", logs[-3000:]
            assert finished.final_metric is not None and finished.final_metric >= 0.95
            # it trained on 2 processes, was stopped after a checkpoint, and resumed on 1
            assert "1 processes, was 2" in logs, logs[-3000:]
            detail = r.cluster.job_detail(job_id=finished.slurm_job_id)
            assert detail.restarts >= 1 or len(finished.slurm_job_ids) > 1
            assert str(detail.gres) == "gpu:1" and detail.nodelist == "node2"
            sacct = icefrog(
                "sacct", "--config", str(r.config), "-P", "--format", "JobID,Restarts,State"
            )
            assert sacct.returncode == 0, sacct.stderr
            row = sacct.stdout.strip().splitlines()[-1].split("|")
            assert int(row[1]) >= 1, sacct.stdout
        finally:
            r.cluster.cancel(job_id=sid)
