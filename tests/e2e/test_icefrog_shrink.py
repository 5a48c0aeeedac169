"""End to end with the real ICEFROG policy: a job alone on the cluster's one free node starts
on 1 GPU (with ``policy.exploration``: no more than twice what it has measured, nothing
yet), and once it has measured that, the next round grows it to its maximum, 2; when two
more jobs arrive whose minimums fill the node with it at 1 (a 2-GPU job and a 1-GPU job on
4 GPUs),
IceShare's max-min shrinks it to 1 (or packs it onto a shared GPU: 1 GPU either way).
It checkpoints, is requeued, resumes from its checkpoint on one
process, reaches its target, and ``icefrog sacct`` shows the restart.

A foreign job holds node2-node4 throughout (the policy plans only with whole nodes
foreign jobs leave free). The shrunk job restarts on the same node, so slurmd may refuse
it once ("Job credential revoked") and the controller releases it again after
``launch_retry_s`` (see docs/controller.md): the test allows for that wait.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("icefrog_slurm.policies.icefrog", reason="the ICEFROG policy is not merged")

from icefrog_slurm.domain.records import JobRecord
from icefrog_slurm.policies.icefrog import IcefrogPolicy
from tests.e2e.harness import DIGITS, Rig, icefrog, logs_of, rig

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def _foreign(job_dir: Path) -> str:
    done = subprocess.run(
        ["sbatch", "--parsable", "-J", "e2e-foreign", "-N3", "-w", "node2,node3,node4",
         "--gres=gpu:4", "-o", "/dev/null", "-D", str(job_dir), "--wrap", "sleep 900"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(";")[0]


def _small(r: Rig, job_dir: Path, name: str, gpus: str) -> str:
    """A short job (2 epochs of the digits MLP) that needs ``gpus`` GPUs."""
    return r.submit(
        job_dir / name, "--gpus", gpus, "--batch", "16", "--max-epochs", "2",
        "--job-name", name, "--", str(DIGITS), "--model", "mlp",
    )  # fmt: skip


@pytest.mark.timeout(600)
def test_icefrog_policy_shrinks_a_job_that_resumes_to_its_target(job_dir: Path) -> None:
    foreign = _foreign(job_dir)
    sids = [foreign]
    with rig(job_dir, IcefrogPolicy(), {"policy": {"exploration": True}}) as r:
        try:
            wide = job_dir / "wide"
            # slowed so that the two arrivals and the new round land while it trains (the
            # digits CNN alone reaches its target in a few seconds on an idle machine); no
            # layer frozen: the test is about the shrink, and a frozen CNN may stop short
            sids.append(
                r.submit(
                    wide, "--gpus", "1-2", "--batch", "16", "--target", "val_acc>=0.97",
                    "--max-epochs", "40", "--max-frozen", "0", "--job-name", "e2e-shrink",
                    "--", str(DIGITS), "--model", "cnn", "--step-delay", "0.05",
                )
            )  # fmt: skip

            def by_name(name: str) -> JobRecord | None:
                with r.store.transaction() as tx:
                    jobs = [v.job for v in tx.snapshot(include_finished=True).jobs]
                return next((j for j in jobs if j.name == name), None)

            deadline = time.monotonic() + 540
            seen: list[int] = []  # the GPU counts it ran on before the others came, in order
            explored, grown_at, others_in = False, -1, False
            finished = None
            while finished is None and time.monotonic() < deadline:
                r.controller.tick_once()
                job = by_name("e2e-shrink")
                assert job is not None
                if job.state == "running" and not others_in:
                    gres = r.cluster.job_detail(job_id=job.slurm_job_id).gres
                    gpus = gres.count if gres is not None else -1
                    if seen[-1:] != [gpus]:
                        seen.append(gpus)
                    if gpus == 1 and not explored and job.progress.epoch >= 1:
                        r.clock.next_round(r.settings)  # measured on 1: a round may offer 2
                        explored = True
                    elif gpus == 2 and grown_at < 0:
                        grown_at = job.progress.epoch
                    elif gpus == 2 and job.progress.epoch > grown_at:  # an epoch on 2 GPUs
                        sids += [
                            _small(r, job_dir, "e2e-two", "2"),
                            _small(r, job_dir, "e2e-one", "1"),
                        ]
                        r.controller.tick_once()  # read their registrations
                        r.clock.next_round(r.settings)
                        others_in = True
                finished = job if job.state == "finished" else None
                time.sleep(0.5)
            logs = logs_of(wide)
            # alone: 1 GPU (nothing measured yet), then its maximum; then shrunk
            assert seen[:2] == [1, 2] and others_in, (seen, logs[-3000:])
            assert finished is not None, logs[-3000:]
            assert "1 processes, was 2" in logs, logs[-3000:]  # resumed from the 2-GPU run
            assert finished.finish_reason == "target_reached", logs[-3000:]
            assert finished.final_metric is not None and finished.final_metric >= 0.97
            sacct = icefrog(
                "sacct", "--config", str(r.config), "-P", "--format", "JobName,Restarts"
            )
            assert sacct.returncode == 0, sacct.stderr
            rows = dict(line.split("|") for line in sacct.stdout.strip().splitlines()[1:])
            assert int(rows["e2e-shrink"]) >= 1, sacct.stdout
        finally:
            for sid in sids:
                r.cluster.cancel(job_id=sid)
