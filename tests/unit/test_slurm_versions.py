"""The Slurm version differences the CLI backend acts on (docs/controller.md, "Slurm
versions"): the version read from each version's real ``--version`` output (tests/golden), and
the update of a requeued job that 24.11 alone needs with ``NumTasks``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.slurm import cli_backend, parse
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.commands import Argv
from icefrog_slurm.slurm.port import SlurmRejected

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


@pytest.mark.parametrize(
    ("folder", "want"),
    [("slurm-22.05", (22, 5)), ("slurm-24.11", (24, 11)), ("slurm-26.05", (26, 5))],
)
def test_version_of_each_real_slurm(folder: str, want: tuple[int, int]) -> None:
    assert parse.parse_version((GOLDEN / folder / "version.txt").read_text()) == want
    assert parse.parse_version("slurm 24.11.0-0rc1") == (24, 11)


@pytest.mark.parametrize(
    "text", ["", "slurm", "slurm 24", "slurm-wlm 24.11.5\nslurm 22.05.8", "sbatch: error: x 1.2.3"]
)
def test_a_version_slurm_did_not_print_is_refused(text: str) -> None:
    with pytest.raises(parse.ParseError, match="not a Slurm version"):
        parse.parse_version(text)


class _Recorder(SlurmCliBackend):
    """Runs nothing: records each command and answers the version question."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self.version_text = version
        self.ran: list[Argv] = []

    def _run(
        self, argv: Argv, *, stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> str:
        self.ran.append(argv)
        return self.version_text if argv == cli_backend.VERSION_COMMAND else ""


@pytest.mark.parametrize(
    ("version", "tasks"),
    [("slurm-wlm 22.05.8", False), ("slurm-wlm 24.11.5", True), ("slurm-wlm 26.05.5", False)],
)
def test_an_update_sets_tasks_only_where_slurm_needs_it(version: str, tasks: bool) -> None:
    backend = _Recorder(version)
    backend.update_pending(job_id="7", gres=Gres("gpu", 1), num_nodes=2)
    backend.update_pending(job_id="7", nodes=("node1",))  # no resize: never
    updates = [a for a in backend.ran if a[:2] == ("scontrol", "update")]
    assert updates[0][-1] == "NumTasks=2" if tasks else "NumTasks=2" not in updates[0]
    assert not any(a.startswith("NumTasks") for a in updates[1])
    assert backend.ran.count(cli_backend.VERSION_COMMAND) == 1  # asked once


class _StartsOnRelease(_Recorder):
    """Slurm that starts a job as it is released (26.05), or refuses the update otherwise."""

    def __init__(self, answer: str) -> None:
        super().__init__("slurm-wlm 26.05.5")
        self.answer = answer

    def _refuse_admin_hold(self, job_id: str) -> None:
        pass

    def _run(
        self, argv: Argv, *, stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> str:
        if "StartTime=now" in argv:
            raise SlurmRejected(f"{' '.join(argv)}: {self.answer} for job 9")
        return super()._run(argv, stdin=stdin, env=env)


def test_release_now_of_a_job_that_started_as_it_was_released() -> None:
    _StartsOnRelease("Job is no longer pending execution").release_now(job_id="9")
    with pytest.raises(SlurmRejected, match="Access/permission denied"):
        _StartsOnRelease("Access/permission denied").release_now(job_id="9")
