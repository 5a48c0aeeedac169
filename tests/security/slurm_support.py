"""Slurm jobs submitted by the real test users themselves, for the attack tests."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

from tests.integration.controller.support import SCRIPT


def sbatch_as(uid: int, workdir: Path, *args: str) -> str:
    """``sbatch --parsable`` run as ``uid`` (its own groups), the stand-in job script on
    stdin, in ``workdir`` with its output there; the new job id."""
    pw = pwd.getpwuid(uid)
    out = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={pw.pw_gid}", "--init-groups", "--",
         "sbatch", "--parsable", "-p", "gpu", f"--chdir={workdir}",
         f"--output={workdir}/%j.out", *args],
        input=SCRIPT, capture_output=True, text=True, check=True, env=dict(os.environ),
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]
