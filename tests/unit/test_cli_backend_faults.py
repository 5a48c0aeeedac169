"""How the Slurm CLI backend reads a failing client: the words of "slurmctld or munged did
not answer" are an outage (retried, the reconcile pass pauses), never a refusal (which
fails an intent). The clients are stand-ins on PATH that print what Slurm's print."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
from icefrog_slurm.slurm.port import SlurmRejected, SlurmUnavailable, SubmitRequest

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


TIMED_OUT = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"


def _held_job(name: str, comment: str) -> str:
    record = {
        "job_id": 41, "user_id": os.geteuid(), "group_id": os.getegid(),
        "job_state": "PENDING", "state_reason": "JobHeldUser", "name": name, "comment": comment,
    }  # fmt: skip
    return json.dumps({"jobs": [record]})


@pytest.mark.parametrize(
    ("takes_effect_on", "squeue_at_the_end", "want"),
    [
        (2, True, "41"),  # the last sbatch reached slurmctld: the last look finds the job
        (None, True, "gave up after 2 tries"),  # no try took effect: never a third sbatch
        (2, False, "may have been made"),  # the last look failed too: the error says so
    ],
)
def test_a_submission_whose_last_try_times_out_is_looked_for_once_more(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    takes_effect_on: int | None,
    squeue_at_the_end: bool,
    want: str,
) -> None:
    """sbatch's answer times out on every try; on the last one the job was made all the
    same (slurmctld took it): it is returned, never left held and unknown to the caller."""
    request = SubmitRequest(script=str(tmp_path / "job.sh"), tag=IcefrogTag("k"), name="icefrog-k",
                            gres=Gres("gpu", 1))  # fmt: skip
    Path(request.script).write_text("#!/bin/sh\n")
    calls, made, jobs = tmp_path / "sbatch-calls", tmp_path / "made", tmp_path / "jobs.json"
    jobs.write_text(_held_job(request.name, request.tag.comment()))
    effect = (
        f'[ "$(wc -l < {calls})" -ge {takes_effect_on} ] && : > {made}\n' if takes_effect_on else ""
    )
    _stand_in(
        tmp_path,
        "sbatch",
        f"cat >/dev/null\necho . >> {calls}\n{effect}echo '{TIMED_OUT}' >&2\nexit 1\n",
    )
    looks = tmp_path / "squeue-calls"
    down = (
        ""
        if squeue_at_the_end
        else f'[ "$(wc -l < {looks})" -ge 3 ] && {{ echo "{TIMED_OUT}" >&2; exit 1; }}\n'
    )
    _stand_in(tmp_path, "squeue", f"echo . >> {looks}\n{down}"
              f'if [ -e {made} ]; then cat {jobs}; else echo \'{{"jobs": []}}\'; fi\n')  # fmt: skip
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    slept: list[float] = []
    backend = SlurmCliBackend(CliSettings(attempts=2, backoff_s=0.1), sleep=slept.append)
    if want == "41":
        assert backend.submit_held(request=request) == "41"
    else:
        with pytest.raises(SlurmUnavailable, match=want):
            backend.submit_held(request=request)
    assert len(calls.read_text().split()) == 2  # sbatch at most the tries asked for
    assert slept == [0.1, 0.2]


def _stand_in(tmp_path: Path, name: str, body: str) -> None:
    script = tmp_path / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_what_a_client_printed_reaches_the_log_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a refusal quotes the client's words, which may carry a job's name or comment: the
    # error (logged as is by the reconcile pass) cannot forge a line or send escapes
    forged = "scontrol: error: bad\nicefrog: round 9 done\r\x1b[2J\n"
    _client(tmp_path, "scontrol", forged)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SlurmRejected) as caught:
        SlurmCliBackend(sleep=lambda _s: None).hold(job_id="7")
    text = str(caught.value)
    assert "round 9 done" in text
    assert not any(c in text for c in "\n\r\x1b")
