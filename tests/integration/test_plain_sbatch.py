"""A plain ``sbatch`` job that runs ``icefrog launch`` (the user guide's Launching section)
is an ordinary Slurm job, on the local cluster with the real controller and inbox.

Its Slurm record has no icefrog tag (only ``icefrog submit`` sets the comment
``icefrog:<key>``), so the controller counts its GPUs as foreign (once: it never becomes an
icefrog job) and refuses its ``register`` report with a logged reason; the launcher says in
one line that it runs unmanaged and how to submit a managed job, and the job trains with
its declared limits on the GPU it was given and completes. The attacker's variant exports
the launcher's marker variable (``ICEFROG_MANAGED=1``, what ``icefrog submit``'s script
exports): the notice is gone, but nothing else changes -- the controller adopts a job by
its Slurm record, not by what the job says, so no job is planned and a managed job in the
store is left as it was.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from icefrog_launcher.launch import MANAGED_ENV
from tests.e2e.harness import DIGITS, rig
from tests.integration.conftest import REPO, wait_for
from tests.integration.controller.support import FixedPolicy, submit_job

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


def _plain_sbatch(workdir: Path, inbox: str, *, marker: bool) -> str:
    workdir.mkdir()
    workdir.chmod(0o755)
    export = f"export {MANAGED_ENV}=1\n" if marker else ""
    script = workdir / "plain.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"export PYTHONPATH={REPO} OMP_NUM_THREADS=1 PATH={Path(sys.executable).parent}:$PATH\n"
        f"{export}"
        f"exec {sys.executable} -m icefrog_slurm launch --gpus 1-2 --batch 16 --max-epochs 1 "
        f"--workdir {workdir} --inbox {inbox} -- {DIGITS}\n"
    )
    done = subprocess.run(
        ["sbatch", "--parsable", "--requeue", "-p", "gpu", "--gres=gpu:1", "-J", "plain",
         "-D", str(workdir), "-o", str(workdir / "out.txt"), str(script)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(";")[0]


@pytest.mark.timeout(240)
def test_a_plain_sbatch_job_runs_unmanaged_and_is_never_adopted(
    job_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="icefrog_slurm.store.inbox")
    with rig(job_dir, FixedPolicy()) as r:  # no job is given GPUs: the managed one waits
        inbox = r.settings.inbox.dir
        # a managed job of the store, held: nothing the plain jobs do may change it
        managed, managed_sid, _ = submit_job(r.store, r.cluster, job_dir, "plain-managed")
        r.controller.tick_once()
        with r.store.transaction() as tx:
            before = tx.job(managed)
        plain = _plain_sbatch(job_dir / "plain", inbox, marker=False)
        forged = _plain_sbatch(job_dir / "forged", inbox, marker=True)
        sids = (plain, forged)
        try:
            foreign_seen: list[tuple[str, ...]] = []

            def done() -> bool:
                r.controller.tick_once()
                states = r.cluster.poll(job_ids=sids)
                if any(s.state == "RUNNING" for s in states.values()):
                    foreign_seen.append(
                        r.cluster.partition_capacity(partition="gpu").foreign_job_ids
                    )
                return all(s.finished for s in states.values())

            wait_for("both plain jobs to end", done, timeout=200, every=0.5)
            time.sleep(1.0)
            r.controller.tick_once()  # the last reports drained
            for sid in sids:
                assert r.cluster.poll(job_ids=[sid])[sid].state == "COMPLETED"
            out = (job_dir / "plain" / "out.txt").read_text()
            forged_out = (job_dir / "forged" / "out.txt").read_text()
            assert f"Slurm job {plain} was not submitted with icefrog submit" in out, out
            assert "icefrog submit" in out.split("runs unmanaged", 1)[1].splitlines()[0]
            assert "runs unmanaged" not in forged_out
            assert "finished" in out and "finished" in forged_out
            # GPUs counted as foreign while they ran, each job once
            assert foreign_seen
            for ids in foreign_seen:
                assert all(ids.count(sid) <= 1 for sid in sids), ids
            assert any(plain in ids for ids in foreign_seen)
            # never adopted: the register was refused with its reason, nothing planned
            with r.store.transaction() as tx:
                view = tx.snapshot(include_finished=True)
                after = tx.job(managed)
            assert {j.job.slurm_job_id for j in view.jobs} == {managed_sid}
            for sid in sids:
                assert any(
                    f"slurm_job={sid}" in m and "does not carry the icefrog tag" in m
                    for m in caplog.messages
                ), caplog.messages
            assert after == before
        finally:
            for sid in (*sids, managed_sid):
                r.cluster.cancel(job_id=sid)
