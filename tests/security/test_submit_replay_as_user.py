"""An ordinary user's (icefrog-alice's) batch script, submitted with ``icefrog submit``, keeps
what she asked for when the controller (root) resubmits it as her: the resubmission runs
``setpriv ... sbatch`` as alice with a minimal environment, and the script's ``#SBATCH``
lines and ``export`` lines are what carry her account, time limit, mail settings and
environment. Alice's ``icefrog submit`` runs in a forked child that dropped to her uid
(``inbox_support.as_user``); the job's body only prints, so no Python runs as her on the
node."""

from __future__ import annotations

import pwd
import re
import subprocess
from pathlib import Path

import pytest

import icefrog_slurm.commands.submit  # noqa: F401 (loaded before the child drops to alice)
from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from tests.integration.conftest import job_dir as job_dir  # the fixture
from tests.integration.conftest import wait_for
from tests.security.inbox_support import as_user
from tests.security.test_reports_as_user import ALICE, run_cli

pytestmark = [pytest.mark.slurm]

SCRIPT = """#!/bin/bash
#SBATCH --account=physics --time=00:20:00 --mail-type=FAIL
echo "USER=$USER ALICE_VAR=$ALICE_VAR"
"""


def _show(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    return dict(re.findall(r"(\w+)=(\S*)", out))


@pytest.mark.timeout(180)
def test_alices_options_and_environment_survive_roots_resubmission(
    munge_users: dict[str, int], job_dir: Path
) -> None:
    uid = munge_users[ALICE]
    inbox = job_dir / "inbox"
    inbox.mkdir(mode=0o1733)
    inbox.chmod(0o1733)
    (job_dir / "job.sh").write_text(SCRIPT)
    workdir = job_dir / "alice"
    argv = ["submit", "--inbox", str(inbox), "--partition", "gpu", "--workdir", str(workdir),
            "-D", str(job_dir), "--export=ALL,ALICE_VAR=hers", str(job_dir / "job.sh")]  # fmt: skip
    code, stdout, err = as_user(ALICE, lambda: run_cli(argv))
    assert code == 0, err
    first = stdout.split()[-1]
    assert _show(first)["UserId"].startswith(f"{ALICE}({uid})")
    backend = SlurmCliBackend()
    ids = [first]
    try:
        kept = {k: _show(first)[k] for k in ("Account", "TimeLimit", "MailType")}
        assert kept == {"Account": "physics", "TimeLimit": "00:20:00", "MailType": "FAIL"}
        new = backend.resubmit(job_id=first, owner_uid=uid, gres=Gres("shard", 1))
        ids.append(new)
        assert _show(new)["UserId"].startswith(f"{ALICE}({uid})")
        assert {k: _show(new)[k] for k in kept} == kept
        backend.release(job_id=new)
        final = wait_for(
            "the job to finish",
            lambda: (s := backend.poll(job_ids=[new]).get(new)) and s.finished and s,
            timeout=120,
            every=1.0,
        )
        out = workdir / f"slurm-{new}.out"
        log = out.read_text() if out.exists() else ""
        assert final.state == "COMPLETED", log[-3000:] or _show(new).get("Reason")
        assert f"USER={pwd.getpwuid(uid).pw_name} ALICE_VAR=hers\n" in log
    finally:
        for jid in ids:
            backend.cancel(job_id=jid)
