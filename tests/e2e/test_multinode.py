"""End to end on the local cluster, across nodes: ``icefrog submit`` a real training job
(digits MLP, gloo on the CPU); the real controller gives it 2 GPUs on 2 nodes (1 fake GPU
each, ``NumNodes=2``), so ``icefrog launch`` runs ``srun`` one torchrun per node with c10d
rendezvous on the first node's host; both ranks train (world size 2 in the logs and in
the profile reports). After an epoch the controller moves it to 1 GPU on a third node
(USR1 to the batch script, the launcher passes USR1 to srun, srun to each node's relay,
which sends torchrun TERM; rank 0 checkpoints; exit 75, requeue held, release): it
resumes from the checkpoint the 2-rank run wrote and reaches its target.

A scripted policy picks the sizes (the test is about running across nodes, not about
which size a policy prefers); the job lands on other nodes after the requeue for the
reason tests/e2e/test_resize.py gives (slurmd's revoked credential).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("icefrog_slurm.controller.daemon", reason="the controller is not merged")

from tests.e2e.harness import TwoStepPolicy, logs_of, rig

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


@pytest.mark.timeout(300)
def test_two_node_job_trains_and_resumes_after_requeue(job_dir: Path) -> None:
    with rig(job_dir, TwoStepPolicy(first=(2, ("node1", "node2")), then=(1, ("node3",)))) as r:
        workdir = job_dir / "mlp"
        sid = r.submit_digits(workdir, "e2e-nodes", "mlp")
        try:
            finished = r.run_until_finished(260)
            logs = logs_of(workdir)
            assert finished is not None, logs[-4000:]
            # the first run: srun across 2 nodes, c10d on the first node's host, 2 ranks
            assert "srun --nodes=2" in logs and "--rdzv-backend=c10d" in logs, logs[-4000:]
            ranks = set(re.findall(r"rank (\d) of 2 on (node\d)", logs))
            assert {r for r, _ in ranks} == {"0", "1"}, logs[-4000:]  # c10d picks the order
            assert {n for _, n in ranks} == {"node1", "node2"}, logs[-4000:]
            assert any(s.gpus == 2 for s in r.view().samples)
            # stopped by USR1 (srun -> relay -> TERM), or by the new round's decision.json
            # when an epoch ended before the signal came: rank 0 checkpointed, nothing killed
            stopped = re.search(r"checkpointed; requeue requested \((signal|decision round)", logs)
            assert stopped, logs[-4000:]
            assert "Killed" not in logs and "exit code 138" not in logs, logs[-4000:]  # 128+USR1
            # the requeued run resumed from the 2-rank checkpoint on 1 process
            assert "rank 0 of 1 on node3" in logs, logs[-4000:]
            assert "1 processes, was 2" in logs, logs[-4000:]
            assert len(finished.slurm_job_ids) > 1 or (
                r.cluster.job_detail(job_id=finished.slurm_job_id).restarts >= 1
            )
            assert finished.finish_reason == "target_reached", logs[-4000:]
            assert finished.final_metric is not None and finished.final_metric >= 0.95
        finally:
            r.cluster.cancel(job_id=sid)
