"""How the Slurm CLI backend reads a failing client: the words of "slurmctld or munged did
not answer" are an outage (retried, the reconcile pass pauses), never a refusal (which
fails an intent). The clients are stand-ins on PATH that print what Slurm's print."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.port import SlurmRejected, SlurmUnavailable

# what sbatch / scontrol print when this host's munged is down or restarting
MUNGE_DOWN = (
    "scontrol: error: If munged is up, restart with --num-threads=10\n"
    'scontrol: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2": '
    "No such file or directory\n"
    "scontrol: error: authentication: Socket communication error\n"
    "scontrol: error: slurm_send_node_msg: auth_g_create: REQUEST_UPDATE_JOB has "
    "authentication error\n"
    "Protocol authentication error\n"
)


def _client(tmp_path: Path, name: str, stderr: str) -> None:
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{stderr}EOF\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize(
    ("stderr", "error"),
    [
        (MUNGE_DOWN, SlurmUnavailable),
        ("Protocol authentication error\n", SlurmUnavailable),
        ("scontrol: error: Invalid job id specified\n", SlurmRejected),
        ("Access/permission denied for job 7\n", SlurmRejected),
    ],
)
def test_munged_down_is_an_outage_not_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr: str, error: type[Exception]
) -> None:
    _client(tmp_path, "scontrol", stderr)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    slept: list[float] = []
    with pytest.raises(error):
        SlurmCliBackend(sleep=slept.append).hold(job_id="7")
    assert bool(slept) == (error is SlurmUnavailable)  # an outage is retried first
