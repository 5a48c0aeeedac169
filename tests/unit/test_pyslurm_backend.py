"""SlurmPyslurmBackend without a cluster: the missing-library error, the selection setting
and the mapping of pyslurm's RPCError to the port's errors (the stand-in's RPCError)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from icefrog_slurm.errors import InputError
from icefrog_slurm.settings import settings_from_mapping
from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
from icefrog_slurm.slurm.port import JobNotFound, SlurmRejected, SlurmUnavailable
from icefrog_slurm.slurm.pyslurm_backend import PyslurmMissing, SlurmPyslurmBackend
from icefrog_slurm.slurm.select import make_cluster

STAND_IN = Path(__file__).resolve().parents[1] / "support/fake_pyslurm/pyslurm/__init__.py"


def _stand_in() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pyslurm_stand_in", STAND_IN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_pyslurm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import pyslurm -> ImportError
    expected = r"needs the pyslurm extra: pip install 'icefrog-slurm\[pyslurm\]'.*Slurm 25\.11"
    with pytest.raises(PyslurmMissing, match=expected):
        make_cluster("pyslurm")
    assert isinstance(make_cluster("cli"), SlurmCliBackend)


@pytest.mark.parametrize("version", ["24.5.3", "25.5.0", "26.05.1", "unknown"])
def test_a_pyslurm_of_another_series_is_refused(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """pyslurm's API changes between series: one built for another Slurm is refused in one
    line (exit 2) naming the series the adapter is written for, never half-used."""
    module = ModuleType("pyslurm")
    if version != "unknown":
        module.__version__ = version  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyslurm", module)
    with pytest.raises(InputError, match=r"written for pyslurm 25\.11.*slurm.backend = 'cli'") as e:
        make_cluster("pyslurm")
    assert e.value.exit_code == 2 and version in str(e.value)


def test_the_series_the_adapter_is_written_for_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _stand_in()  # __version__ "25.11.0-icefrog-test-stand-in"
    monkeypatch.setitem(sys.modules, "pyslurm", module)
    assert isinstance(make_cluster("pyslurm"), SlurmPyslurmBackend)


def test_backend_setting() -> None:
    assert settings_from_mapping({}).slurm.backend == "cli"
    assert settings_from_mapping({"slurm": {"backend": "pyslurm"}}).slurm.backend == "pyslurm"
    with pytest.raises(InputError, match=r"slurm\.backend: must be one of cli, pyslurm"):
        settings_from_mapping({"slurm": {"backend": "rest"}})


@pytest.mark.parametrize(
    ("errno", "msg", "error"),
    [
        (2017, "Invalid job id specified", JobNotFound),
        (1800, "Unable to contact slurm controller", SlurmUnavailable),
        (5004, "Socket timed out on send/recv", SlurmUnavailable),
        (2050, "Invalid generic resource (gres) specification", SlurmRejected),
    ],
)
def test_rpc_errors_map_to_port_errors(errno: int, msg: str, error: type[Exception]) -> None:
    py = _stand_in()
    slept: list[float] = []
    backend = SlurmPyslurmBackend(
        CliSettings(attempts=3, backoff_s=0.5), sleep=slept.append, module=py
    )
    calls: list[int] = []

    def fail() -> None:
        calls.append(1)
        raise py.RPCError(errno=errno, msg=msg)

    with pytest.raises(error, match=re.escape(msg)) as got:
        backend._call("test", fail)
    if error is SlurmUnavailable:  # retried with backoff, then given up
        assert len(calls) == 3 and slept == [0.5, 1.0]
        assert "gave up after 3 tries" in str(got.value)
    else:  # a refusal is not retried
        assert len(calls) == 1 and slept == []
        assert not isinstance(got.value, SlurmUnavailable)


@pytest.mark.parametrize(
    ("refusal", "done"),
    [("Job is no longer pending execution", True), ("Invalid job id specified", False)],
)
def test_release_now_of_a_job_that_started_as_it_was_released(
    monkeypatch: pytest.MonkeyPatch, refusal: str, done: bool
) -> None:
    """Slurm 26.05 may start a job as it is released: bringing its start forward is then
    refused ("no longer pending"), which is the job running, as the CLI backend takes it;
    any other refusal is still an error."""
    backend = SlurmPyslurmBackend(CliSettings(attempts=1), module=_stand_in())
    released: list[str] = []
    monkeypatch.setattr(backend, "release", lambda *, job_id: released.append(job_id))

    def refuse(job_id: str, what: str, **changes: object) -> None:
        raise SlurmRejected(f"{what}: {refusal}")

    monkeypatch.setattr(backend, "_modify", refuse)
    if done:
        backend.release_now(job_id="42")
    else:
        with pytest.raises(SlurmRejected, match=refusal):
            backend.release_now(job_id="42")
    assert released == ["42"]
