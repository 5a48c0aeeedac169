"""Trace sampling (spec section 12) and the Pollux-format workload reader, on the real data."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.commands.simulate import ALL, check_requests
from icefrog_slurm.errors import InputError
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import SimOptions
from icefrog_slurm.sim.trace import (
    PhillyJob,
    in_window,
    nearest_task,
    packaged_philly,
    parse_hours,
    read_philly,
    sample_workload,
)
from icefrog_slurm.sim.truth import build_truths
from icefrog_slurm.sim.workload import read_workload, write_workload

POLLUX = Path(__file__).resolve().parents[2] / "data" / "pollux"
PHILLY = POLLUX / "traces" / "philly.csv"
needs_data = pytest.mark.skipif(not PHILLY.exists(), reason="Pollux/Philly data not present")


@pytest.fixture(scope="module")
def philly() -> list[PhillyJob]:
    return read_philly(PHILLY)


@pytest.fixture(scope="module")
def task_gpu_s() -> dict[str, float]:
    catalog, cal = shipped_catalog(), shipped_calibration()
    return {n: cal[n].reference_gpu_seconds(catalog.get(n)) for n in catalog.available("icefrog")}


def _sample(philly: list[PhillyJob], task_gpu_s: dict[str, float], count: int, seed: int):
    return sample_workload(
        philly, hours=(3, 6), count=count, seed=seed, catalog=shipped_catalog(),
        task_gpu_s=task_gpu_s,
    )  # fmt: skip


@needs_data
@pytest.mark.parametrize("load", [1, 2, 3])
def test_counts_window_and_nearest_mapping(philly, task_gpu_s, load: int) -> None:
    jobs, mapped = _sample(philly, task_gpu_s, 120 * load, seed=7)
    assert len(jobs) == len(mapped) == 120 * load
    assert len({m.philly_row for m in mapped}) == len(mapped)  # without replacement
    assert all(0 <= j.submit_s < 3 * 3600 for j in jobs)
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    catalog = shipped_catalog()
    for job, m in zip(jobs, mapped, strict=True):
        row = philly[m.philly_row - 2]  # line 2 is the first job
        assert (row.gpu_time_s, row.num_gpus) == (m.gpu_time_s, m.num_gpus)
        assert 3 <= row.timestamp.hour < 6 and row.duration_s >= 60
        assert job.submit_s == (row.timestamp.hour - 3) * 3600 + row.timestamp.minute * 60 + (
            row.timestamp.second
        )
        dist = {t: abs(math.log(g) - math.log(row.gpu_time_s)) for t, g in task_gpu_s.items()}
        assert dist[job.task] == min(dist.values())
        task = catalog.get(job.task)
        assert task.min_gpus <= job.gpus <= task.max_gpus
        assert job.batch_size == job.gpus * task.default_batch


@needs_data
def test_reproducible_by_seed(philly, task_gpu_s) -> None:
    a, _ = _sample(philly, task_gpu_s, 120, seed=3)
    b, _ = _sample(philly, task_gpu_s, 120, seed=3)
    c, _ = _sample(philly, task_gpu_s, 120, seed=4)
    assert a == b
    assert a != c


def test_window_filters_follow_pollux() -> None:
    from datetime import datetime

    def job(row: int, stamp: str, duration: float, gpus: int = 1) -> PhillyJob:
        when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
        return PhillyJob(row, when, duration, gpus, duration * gpus)

    jobs = [
        job(2, "2017-10-01 02:59:59", 100),  # before the window
        job(3, "2017-10-01 03:00:00", 100),  # first second: kept
        job(4, "2017-10-02 05:59:59", 100),  # another day, last second: kept
        job(5, "2017-10-01 06:00:00", 100),  # after the window
        job(6, "2017-10-01 04:00:00", 59),  # shorter than 60 s
        job(7, "2017-10-01 04:00:00", 3600 * 1000, 1),  # 1000 GPU-hours: dropped
        job(8, "2017-10-01 04:00:00", 3600 * 999, 1),  # just under: kept
    ]
    assert [j.row for j in in_window(jobs, (3, 6))] == [3, 4, 8]


def test_nearest_is_by_ratio() -> None:
    tasks = {"a": 14.5 * 3600, "b": 58 * 3600}
    assert nearest_task(30 * 3600, tasks) == "b"  # 1.93x vs 2.07x
    assert nearest_task(28 * 3600, tasks) == "a"


@pytest.mark.parametrize("text", ["3", "6-3", "a-b", "3-25", "-1-4"])
def test_bad_hours(text: str) -> None:
    with pytest.raises(InputError, match="--hours"):
        parse_hours(text)


@needs_data
def test_cli_writes_workload_and_sidecar(tmp_path: Path, capsys) -> None:
    out = tmp_path / "w.csv"
    argv = ["trace", "sample", "--philly", str(PHILLY), "--hours", "3-6", "--jobs", "120",
            "--load", "2", "--seed", "5", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    jobs = read_workload(out, shipped_catalog())
    side = json.loads(out.with_suffix(".json").read_text())
    assert len(jobs) == side["count"] == 240
    assert side["seed"] == 5 and side["hours"] == [3, 6] and side["load"] == 2
    assert [j.name for j in jobs] == [m["name"] for m in side["jobs"]]
    assert all(m["task"] in side["task_gpu_time_s"] for m in side["jobs"])
    assert main(argv) == 0  # same seed, same file
    assert read_workload(out, shipped_catalog()) == jobs


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--load", "0"], "--load"),
        (["--jobs", "0"], "--jobs"),
        (["--load", "1e308", "--jobs", "2"], "--jobs 2 x --load 1e+308 must be at most"),
        (["--jobs", "9" * 400], "--jobs: must be within [1, 1000000], got 99999"),
        (["--hours", "7-2"], "--hours"),
        (["--tasks", "alexnet"], "unknown task"),
    ],
)
def test_cli_bad_arguments_exit_2(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    philly = tmp_path / "philly.csv"
    philly.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 03:00:00,100,1,100,x\n"
    )
    argv = ["trace", "sample", "--philly", str(philly), "--seed", "1", "--out",
            str(tmp_path / "w.csv"), *extra]  # fmt: skip
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_bad_files_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "philly.csv"
    bad.write_text("when,how_long\n1,2\n")
    out = str(tmp_path / "w.csv")
    assert main(["trace", "sample", "--philly", str(bad), "--seed", "1", "--out", out]) == 2
    assert "missing column" in capsys.readouterr().err
    assert main(["trace", "sample", "--philly", str(tmp_path / "no.csv"), "--seed", "1",
                 "--out", out]) == 2  # fmt: skip
    assert "no such file" in capsys.readouterr().err
    bad.write_text("timestamp,duration,num_gpus,gpu_time\n2017-10-01 03:00:00,100,1,100\n")
    assert main(["trace", "sample", "--philly", str(bad), "--seed", "1", "--out", out]) == 2
    assert "window holds only 1" in capsys.readouterr().err


def test_packaged_trace_reads() -> None:
    jobs = read_philly(packaged_philly())
    assert len(jobs) == 82247
    assert (jobs[0].row, jobs[0].num_gpus, jobs[0].duration_s) == (2, 1, 66.0)
    if PHILLY.exists():  # the same rows as the checkout's plain copy
        assert jobs == read_philly(PHILLY)


def test_cli_samples_the_packaged_trace_without_philly(tmp_path: Path, capsys) -> None:
    out = tmp_path / "w.csv"
    argv = ["trace", "sample", "--seed", "3", "--jobs", "20", "--out", str(out)]
    assert main(argv) == 0
    assert "20 jobs" in capsys.readouterr().out
    assert len(read_workload(out, shipped_catalog())) == 20
    meta = json.loads(out.with_suffix(".json").read_text())
    assert "packaged" in json.dumps(meta)
    assert meta["philly_sha256"] == hashlib.sha256(packaged_philly().read_bytes()).hexdigest()


def test_gzip_trace_errors(tmp_path: Path) -> None:
    bad = tmp_path / "p.csv.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(InputError, match="not a readable gzip file"):
        read_philly(bad)


@needs_data
def test_reads_a_real_pollux_workload() -> None:
    path = POLLUX / "workloads-0.5" / "workload-1.csv"
    jobs = read_workload(path, shipped_catalog())
    assert len(jobs) == 80
    first = jobs[0]
    assert (first.name, first.submit_s, first.task, first.gpus, first.batch_size) == (
        "deepspeech2-0", 110.0, "deepspeech2-arctic", 6, 320,
    )  # fmt: skip
    assert {j.task for j in jobs} <= set(shipped_catalog().names)


def test_workload_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\nj1,5,cifar10,2,256\n")
    jobs = read_workload(path, shipped_catalog())
    assert jobs[0].task == "resnet18-cifar10"
    write_workload(jobs, tmp_path / "again.csv")
    assert read_workload(tmp_path / "again.csv", shipped_catalog()) == jobs
    for body, message in [
        ("name,time\nj1,5\n", "missing column"),
        ("name,time,application,num_replicas,batch_size\nj1,5,alexnet,1,1\n", "alexnet"),
        ("name,time,application,num_replicas,batch_size\nj1,-5,ncf,1,1\n", "time"),
        ("name,time,application,num_replicas,batch_size\nj1,5,ncf,0,1\n", "num_replicas"),
        ("name,time,application,num_replicas,batch_size\nj1,5,ncf,1,1\nj1,6,ncf,1,1\n", "repeated"),
    ]:
        path.write_text(body)
        with pytest.raises(InputError, match=message):
            read_workload(path, shipped_catalog())


@needs_data
def test_pollux_workloads_read_and_pass_the_policies_that_choose_gpus() -> None:
    """Every Pollux workload reads (its requests are legal counts or above the task's
    largest); on 64 GPUs the policies that choose a job's GPUs, and plain Slurm, take it;
    Lucid+, which starts a job only on a legal requested count, refuses those above."""
    catalog = shipped_catalog()
    truths = build_truths(catalog, shipped_calibration(), seed=0)
    options = SimOptions(gpus=64)
    above = 0
    for path in sorted(POLLUX.glob("workloads-*/workload-*.csv")):
        jobs = read_workload(path, catalog)
        check_requests(path, jobs, ["icefrog", "optimus+", "pollux+", "slurm"], options,
                       catalog, truths)  # fmt: skip
        if any(j.gpus > catalog.get(j.task).max_gpus for j in jobs):
            above += 1
            with pytest.raises(InputError, match=r"workload-\d\.csv:\d+: num_replicas .*lucid"):
                check_requests(path, jobs, ["lucid+"], options, catalog, truths)
    assert above > 0


def test_sampled_traces_pass_every_policy(tmp_path: Path) -> None:
    """trace sample clips each request to the task's legal counts: every policy takes its
    traces on the evaluation's 48 GPUs."""
    catalog = shipped_catalog()
    truths = build_truths(catalog, shipped_calibration(), seed=0)
    for seed in (1, 2, 3):
        out = tmp_path / f"w{seed}.csv"
        assert main(["trace", "sample", "--seed", str(seed), "--load", "3", "--out", str(out)]) == 0
        jobs = read_workload(out, catalog)
        check_requests(out, jobs, list(ALL), SimOptions(gpus=48), catalog, truths)


def test_a_byte_order_mark_before_the_header_is_not_part_of_it(tmp_path: Path) -> None:
    """A spreadsheet's UTF-8 CSV starts with a byte-order mark: it read as a column
    ``\\ufeffname`` ("missing column(s) name")."""
    body = "name,time,application,num_replicas,batch_size\nj1,5,cifar10,2,256\n"
    plain, marked = tmp_path / "w.csv", tmp_path / "bom.csv"
    plain.write_text(body)
    marked.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert read_workload(marked, shipped_catalog()) == read_workload(plain, shipped_catalog())
    philly = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 03:00:00,100,1,100,x\n"
    (tmp_path / "p.csv").write_text(philly)
    (tmp_path / "pbom.csv").write_bytes(b"\xef\xbb\xbf" + philly.encode())
    assert read_philly(tmp_path / "pbom.csv") == read_philly(tmp_path / "p.csv")
