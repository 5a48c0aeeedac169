"""Slurm jobs submitted by the real test users themselves, for the attack tests."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

from tests.integration.controller.support import SCRIPT


def sbatch_as(uid: int, workdir: Path, *args: str, output: str | None = None) -> str:
    """``sbatch --parsable`` run as ``uid`` (its own groups), the stand-in job script on
    stdin, in ``workdir`` with its output there (or at ``output``); the new job id."""
    pw = pwd.getpwuid(uid)
    out = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={pw.pw_gid}", "--init-groups", "--",
         "sbatch", "--parsable", "-p", "gpu", f"--chdir={workdir}",
         f"--output={output or f'{workdir}/%j.out'}", *args],
        input=SCRIPT, capture_output=True, text=True, check=True, env=dict(os.environ),
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def held_job_as(user: str, *args: str) -> str:
    """A held one-GPU job of ``user`` (run in /tmp, output discarded); the job id."""
    uid = pwd.getpwnam(user).pw_uid
    return sbatch_as(uid, Path("/tmp"), "-H", "--gres=gpu:1", *args, output="/dev/null")
