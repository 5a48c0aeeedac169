"""The reports against what the real Slurm of the local cluster prints for the same
options: hostlists (``scontrol show hostnames`` / ``hostlist``), squeue's ``-o`` letters
and ``-O`` header, ``SLURM_TIME_FORMAT`` (on a held job of this test's own) and the
``--json`` envelope. Fields named alike in both print alike. The local cluster keeps no
accounting (sacct answers "Slurm accounting storage is disabled"), so sacct's own output is
not compared here; its header names and delimiters are those of the unit tests."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from icefrog_slurm.report import timefmt
from icefrog_slurm.slurm.parse import compress_hostlist, expand_hostlist
from tests.integration.report.test_reports import run

pytestmark = pytest.mark.slurm


def slurm(*argv: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return done.stdout


@pytest.fixture
def _local_time() -> Iterator[None]:
    """The report conftest pins UTC; Slurm prints the host's zone: use the host's here."""
    saved = os.environ.get("TZ")
    os.environ.pop("TZ", None)
    time.tzset()
    yield
    if saved is not None:
        os.environ["TZ"] = saved
    time.tzset()
    timefmt.use_time_style(timefmt.STANDARD)


@pytest.mark.parametrize(
    "text", ["rack[1-2]-node[01-02]", "node7", "node[098-101],gpu1", "r[1-2]n[1-2],x"]
)
def test_expand_hostlist_as_scontrol_show_hostnames(text: str) -> None:
    real = tuple(slurm("scontrol", "show", "hostnames", text).split())
    assert sorted(expand_hostlist(text)) == sorted(real)


@pytest.mark.parametrize(
    ("text", "names"), [("n[001-002]x", ("n001x", "n002x")), ("a[1,3-4]b", ("a1b", "a3b", "a4b"))]
)
def test_a_suffix_after_the_range_slurm_never_prints_is_still_read(
    text: str, names: tuple[str, ...]
) -> None:
    """Slurm 22.05 calls these invalid (and so never prints them); ClusterShell reads them."""
    done = subprocess.run(
        ["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "" and "Invalid hostlist" in done.stderr
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(
    "names",
    [
        "node1,node2,node4",
        "node9,node10,node11",
        "rack1-node01,rack1-node02,rack2-node01,rack2-node02",
        "node01,node02,node03",
        "gpu1",
    ],
)
def test_compress_hostlist_as_scontrol_show_hostlist(names: str) -> None:
    real = slurm("scontrol", "show", "hostlist", names).strip()
    assert compress_hostlist(names.split(",")) == real


def test_squeue_long_format_header_as_squeue(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    real = slurm("squeue", "-O", "JobID:8,Partition:.9,Name,UserName:6|").splitlines()[0]
    _, ours, _ = run(capsys, "squeue", *db, "-O", "JobID:8,Partition:.9,Name,User:6|")
    assert ours.splitlines()[0] == real


@pytest.mark.parametrize("fmt", ["%.5i %.9P %8u %R", "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"])
def test_squeue_letter_header_as_squeue(
    db: list[str], capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    real = slurm("squeue", "-o", fmt).splitlines()[0]
    _, ours, _ = run(capsys, "squeue", *db, "-o", fmt)
    assert ours.splitlines()[0] == real.rstrip()


def test_json_envelope_has_squeues_keys_and_meta_shape(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    real = json.loads(slurm("squeue", "--json"))
    ours = json.loads(run(capsys, "squeue", *db, "--json")[1])
    assert set(real) <= set(ours) | {"warnings"}
    assert set(real["meta"]) <= set(ours["meta"])
    assert set(real["meta"]["Slurm"]["version"]) == set(ours["meta"]["Slurm"]["version"])
    assert set(real["meta"]["plugin"]) == set(ours["meta"]["plugin"])


@pytest.fixture
def held_job() -> Iterator[str]:
    """A held job of this test's own (never runs): its submit time is what squeue shows."""
    out = slurm("sbatch", "--parsable", "-H", "-p", "gpu", "-o", "/dev/null", "--wrap", "true")
    job = out.strip().split(";")[0]
    try:
        yield job
    finally:
        subprocess.run(["scancel", job], check=False, timeout=60)


@pytest.mark.usefixtures("_local_time")
@pytest.mark.parametrize("style", ["relative", "standard", "%d.%m. %H:%M", "%a %b %d %Y"])
def test_slurm_time_format_as_squeue(held_job: str, style: str) -> None:
    """The job's submit time (``%V``) printed by squeue and by icefrog in the same style."""
    stamp = int(slurm("squeue", "-h", "-j", held_job, "-o", "%V", env={"SLURM_TIME_FORMAT": "%s"}))
    real = slurm("squeue", "-h", "-j", held_job, "-o", "%V", env={"SLURM_TIME_FORMAT": style})
    timefmt.use_time_style(timefmt.parse_time_style(style, now=time.time()))
    assert timefmt.format_time(stamp) == real.strip()
