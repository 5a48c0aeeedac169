"""The launcher's notice in a Slurm job ``icefrog submit`` did not submit, and the marker
``icefrog submit``'s batch script exports so that its own jobs do not print it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from icefrog_launcher.launch import MANAGED_ENV, unmanaged_notice
from icefrog_slurm.commands.jobscript import batch_script


def test_a_plain_slurm_job_is_told_it_runs_unmanaged_and_how_to_submit() -> None:
    notice = unmanaged_notice({"SLURM_JOB_ID": "42"})
    assert notice is not None and "\n" not in notice
    assert "Slurm job 42" in notice and "unmanaged" in notice
    assert "icefrog submit" in notice.split("unmanaged", 1)[1]


def test_no_notice_in_a_submitted_job_nor_outside_slurm() -> None:
    assert unmanaged_notice({"SLURM_JOB_ID": "42", MANAGED_ENV: "1"}) is None
    assert unmanaged_notice({}) is None
    # anything but the exact marker is no marker
    assert unmanaged_notice({"SLURM_JOB_ID": "42", MANAGED_ENV: "yes"}) is not None


def test_icefrog_submits_script_exports_the_marker_to_the_launcher(tmp_path: Path) -> None:
    launch = ["bash", "-c", f'echo "${MANAGED_ENV}" > {tmp_path}/seen']
    script = tmp_path / "job.sbatch"
    script.write_text(batch_script(launch=launch, env={"PATH": "/usr/bin:/bin"}))
    done = subprocess.run(["bash", str(script)], timeout=20, check=False, env={})
    assert done.returncode == 0
    assert (tmp_path / "seen").read_text() == "1\n"
