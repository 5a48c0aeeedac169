"""What ``icefrog simulate`` shows the one who runs it: progress on stderr (a bar on a
terminal, plain lines in a log), summary.json that reruns itself, and the plots."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.evaluation.runs import source_commit
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.sim.engine import SimOptions, SimResult
from icefrog_slurm.sim.jobs import JobOutcome
from icefrog_slurm.sim.progress import Progress
from icefrog_slurm.sim.summary import sample_frozen

WORKLOAD = ("name,time,application,num_replicas,batch_size\n"
            "a,0,cifar10,2,256\nb,60,cifar10,4,512\nc,120,cifar10,1,128\n")  # fmt: skip
TIMING = ("wall_s", "solver_s_mean", "solver_s_max")  # wall-clock readings, not results


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_at_each_tenth_or_every_30_s_never_a_carriage_return() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress("icefrog", 100, out, clock=clock, bar=False)
    p(60.0, 0, 100)  # nothing done, no time passed: no line
    assert out.getvalue() == ""
    clock.t = 5.0
    p(3600.0, 10, 100)  # a tenth
    clock.t = 6.0
    p(3700.0, 12, 100)  # not the next tenth, 1 s later: quiet
    clock.t = 36.0
    p(7200.0, 13, 100)  # 30 s since the last line
    p.close(9000.0, 100)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 3
    assert lines[0].startswith("icefrog: 10/100 jobs done (10 %), 1.0 h simulated, 5s wall")
    assert lines[0].endswith("ETA 45s")  # 90 jobs left at 0.5 s each
    assert lines[1].startswith("icefrog: 13/100 jobs done (13 %), 2.0 h simulated, 36s wall")
    assert lines[2] == "icefrog: 100/100 jobs done (100 %), 2.5 h simulated, 36s wall"


def test_a_terminal_gets_a_bar_with_rate_and_eta() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress("pollux+", 40, out, clock=clock, bar=True)
    for done in range(0, 21, 4):
        p(3600.0 * done, done, 40)
    p.close()
    text = out.getvalue()
    assert "pollux+" in text and "20/40" in text and "job/s" in text and "<" in text
    assert "h simulated" in text


def test_a_log_gets_lines_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text(WORKLOAD)
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stderr", err)
        rc = main(["simulate", "--workload", str(wl), "--gpus", "4", "--policy", "slurm",
                   "--seed", "1", "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 0
    lines = err.getvalue().splitlines()
    assert "\r" not in err.getvalue()
    assert lines[-1].startswith("slurm: 3/3 jobs done (100 %)")


def _strip(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    for k in TIMING:
        doc["totals"].pop(k)
    doc.pop("run")
    return doc


def test_summary_records_what_reruns_it_and_the_rerun_gives_the_same(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text(WORKLOAD)
    sets = ["controller.round_period_s=120", "sharing.speed_factor=0.8"]
    argv = ["simulate", "--workload", str(wl), "--gpus", "4", "--policy", "slurm", "--seed",
            "3", "--out", str(tmp_path / "first"), "--quiet", "--profile-noise", "0.1"]  # fmt: skip
    for kv in sets:
        argv += ["--set", kv]
    assert main(argv) == 0
    first = json.loads((tmp_path / "first" / "summary.json").read_text())
    run = first["run"]
    assert run["workload"] == {
        "path": str(wl),
        "sha256": hashlib.sha256(wl.read_bytes()).hexdigest(),
    }
    assert run["seed"] == 3 and run["sets"] == sets
    base = Settings()
    want = replace(
        base,
        controller=replace(base.controller, round_period_s=120.0),
        sharing=replace(base.sharing, speed_factor=0.8),
    )
    assert settings_from_mapping(run["settings"]) == want
    assert run["version"] and (run["commit"] is None or isinstance(run["commit"], str))
    import numpy
    import scipy

    versions = run["versions"]
    assert versions["numpy"] == numpy.__version__ and versions["scipy"] == scipy.__version__
    assert versions["python"].count(".") == 2 and "mip" in versions
    # rerun from the recorded command line alone, into another folder
    again = list(run["argv"])
    assert again[:2] == ["icefrog", "simulate"]
    again[again.index("--out") + 1] = str(tmp_path / "second")
    assert main([*again[1:], "--quiet"]) == 0
    second = json.loads((tmp_path / "second" / "summary.json").read_text())
    assert _strip(second) == _strip(first)
    assert second["run"]["workload"] == run["workload"]
    assert first["totals"]["finished"] == 3


def test_plots_in_the_chosen_format_one_panel_a_policy(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    wl = tmp_path / "w.csv"
    wl.write_text(WORKLOAD)
    out = tmp_path / "o"
    argv = ["simulate", "--workload", str(wl), "--gpus", "4", "--policy", "slurm", "--seed", "1",
            "--out", str(out), "--quiet", "--plot-format", "svg"]  # fmt: skip
    assert main(argv) == 0
    names = sorted(p.name for p in out.iterdir() if p.suffix == ".svg")
    assert names == ["frozen_fraction.svg", "gpus_in_use.svg", "jct_cdf.svg"]
    svg = (out / "gpus_in_use.svg").read_text()
    assert "capacity" in svg and "slurm" in svg
    assert "no job froze a layer" in (out / "frozen_fraction.svg").read_text()
    with pytest.raises(SystemExit) as exc:  # argparse's refusal, exit 2
        main(["simulate", "--workload", str(wl), "--out", str(out), "--plot-format", "gif"])
    assert exc.value.code == 2


def test_frozen_sample_is_the_longest_jobs_one_a_task_first_carried_to_their_finish() -> None:
    def job(name: str, task: str, hours: float) -> JobOutcome:
        return JobOutcome(name=name, task=task, submit=0.0, start=0.0, finish=3600.0 * hours)

    jobs = [job("a", "x", 5), job("b", "x", 9), job("c", "y", 1), job("d", "z", 2),
            job("e", "x", 8), job("f", "w", 30)]  # fmt: skip
    frozen = {n: [(60.0, 2), (120.0, 3)] for n in "abcde"}  # f never froze
    r = SimResult("icefrog", SimOptions(gpus=4), jobs, [], [], frozen, end_time=1e6)
    picked = sample_frozen(r)
    assert [j.name for j, _ in picked] == ["b", "d", "c", "e"]  # x, z, y; then x's next
    assert picked[0][1] == [(60.0, 2), (120.0, 3), (9 * 3600.0, 3)]


def test_without_git_the_commit_is_unknown_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no git to be found
    assert source_commit() == "?"
    wl = tmp_path / "w.csv"
    wl.write_text(WORKLOAD)
    out = tmp_path / "o"
    argv = ["simulate", "--workload", str(wl), "--gpus", "4", "--policy", "slurm", "--out",
            str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((out / "summary.json").read_text())["run"]["commit"] is None
