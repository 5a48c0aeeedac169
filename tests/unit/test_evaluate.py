"""icefrog_slurm.evaluation and ``icefrog evaluate``: the evaluation tables' runner (quick
mode on a tiny trace)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from icefrog_slurm import cli
from icefrog_slurm.commands import evaluate as command
from icefrog_slurm.errors import InputError
from icefrog_slurm.evaluation import driver, grid, runs, tables
from icefrog_slurm.sim.trace import packaged_philly

# the names the tests use, in one namespace
ev = SimpleNamespace(
    Grid=grid.Grid, ablation_rows=grid.ablation_rows, sharing_run=grid.sharing_run,
    main_runs=grid.main_runs, faithful_runs=grid.faithful_runs, _key=tables.main_key,
    FREEZEOUT_SET=grid.FREEZEOUT_SET, BATCH_SCALING_SET=grid.BATCH_SCALING_SET,
    PAPER_SET=grid.PAPER_SET, table_main=tables.table_main, table_tta=tables.table_tta,
    table_size=tables.table_size,
    table_ablation=tables.table_ablation, table_batch=tables.table_batch,
    table_sharing=tables.table_sharing, table_scale=tables.table_scale,
    scale_run=grid.scale_run,
    markdown=tables.markdown, grid_from=driver.grid_from,
)  # fmt: skip


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def _main(argv: list[str]) -> int:
    return cli.main(["evaluate", *argv])


def _parse(md: str) -> list[list[str]]:
    """A markdown table's rows (header first); fails on a ragged or malformed table."""
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    assert len(rows) >= 3, md
    assert all(set(c) <= {"-", ":"} for c in rows[1]), md
    assert all(len(r) == len(rows[0]) for r in rows), md
    return [rows[0], *rows[2:]]


def _doc(avg_h: float, jobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "totals": {"jobs": 2, "finished": 2, "avg_jct_s": avg_h * 3600,
                   "jct_by_size_s": {"small": avg_h * 3600}, "jobs_by_size": {"small": 2},
                   "rounds": 10, "solver_s_mean": 0.1, "solver_s_max": 0.3,
                   "reallocations": 1, "gpu_hours": 5.0, "wall_s": 3.0},
        "jobs": jobs or [],
    }  # fmt: skip


def test_main_table_speedup_is_baseline_over_icefrog_per_seed() -> None:
    g = ev.Grid(loads=(1.0,), seeds=(1, 2), policies=("icefrog", "optimus+"))
    res = {
        ev._key(g, 1.0, 1, "icefrog"): _doc(1.0),
        ev._key(g, 1.0, 2, "icefrog"): _doc(2.0),
        ev._key(g, 1.0, 1, "optimus+"): _doc(1.5),
        ev._key(g, 1.0, 2, "optimus+"): _doc(5.0),
    }
    header, rows, raw = ev.table_main(g, res)
    assert raw["load1/optimus+"]["speedup"] == [1.5, 2.5]
    opt = dict(zip(header, rows[1], strict=True))
    assert opt["ICEFROG speedup (its JCT / ICEFROG's)"] == "2.00x (1.50-2.50)"
    assert opt["avg JCT h, mean (min-max)"] == "3.25 (1.50-5.00)"
    assert opt["paper physical (48 GPUs)"] == "1.84x"
    assert opt["ICEFROG paper-protocol speedup (its JCT / that row's)"] == "-"  # no such row
    _parse(ev.markdown(header, rows))


def test_both_icefrog_rows_run_icefrog_and_name_the_batch_setting() -> None:
    """ICEFROG's two rows (batch and layer elasticity; the paper's protocol): one policy, the
    setting named on each (so neither depends on the configured default), and every row
    under ``--batch paper``."""
    g = ev.Grid(loads=(1.0,), seeds=(1,))
    runs = {r.label.rsplit("seed1-", 1)[1]: r for r in ev.main_runs(g)}
    assert set(runs) == {"icefrog", "icefrog-paper", "lucid+", "optimus+", "pollux+", "slurm"}
    assert runs["icefrog"].policy == runs["icefrog-paper"].policy == "icefrog"
    assert runs["icefrog"].extra[-2:] == ("--set", ev.BATCH_SCALING_SET)
    assert runs["icefrog-paper"].extra[-2:] == ("--set", ev.PAPER_SET)
    assert all(r.extra[:2] == ("--batch", "paper") for r in runs.values())
    assert runs["lucid+"].extra == ("--batch", "paper")
    res = {ev._key(g, 1.0, 1, p): _doc(h) for p, h in (("icefrog", 1.0), ("icefrog-paper", 1.5),
                                                        ("lucid+", 3.0))}  # fmt: skip
    _, _, raw = ev.table_main(replace(g, policies=("icefrog", "icefrog-paper", "lucid+")), res)
    assert raw["load1/lucid+"]["speedup"] == [3.0]
    assert raw["load1/lucid+"]["paper_protocol_speedup"] == [2.0]
    assert raw["load1/icefrog-paper"]["speedup"] == [1.5]
    assert raw["load1/icefrog-paper"]["paper_protocol_speedup"] is None


def test_size_table_says_what_makes_each_class_jct() -> None:
    """Per size class the seed means of its jobs' wait, run hours and GPUs (every job that
    ended, its target reached or not), and per row the runs' GPU-hours and spans."""

    def job(size: str, submit_h: float, wait_h: float, run_h: float, gpus: float,
            reached: bool = True) -> dict[str, Any]:  # fmt: skip
        start, finish = (submit_h + wait_h) * 3600, (submit_h + wait_h + run_h) * 3600
        return {"size": size, "task": "t", "submit": submit_h * 3600, "start": start,
                "finish": finish, "jct_s": finish - submit_h * 3600, "reached_target": reached,
                "gpu_hours": gpus * run_h}  # fmt: skip

    g = ev.Grid(loads=(1.0,), seeds=(1, 2), policies=("icefrog",))
    res = {
        ev._key(g, 1.0, 1, "icefrog"): _doc(1, [job("small", 0, 1, 2, 2), job("small", 1, 0, 4, 1,
                                                                               reached=False)]),
        ev._key(g, 1.0, 2, "icefrog"): _doc(1, [job("small", 2, 0.5, 1, 4)]),
    }  # fmt: skip
    header, rows, raw = ev.table_size(g, res)
    cell = raw["load1/icefrog/small"]
    assert (cell["wait_h"], cell["run_h"], cell["gpus"]) == ([0.5, 0.5], [3.0, 1.0], [1.5, 4.0])
    assert raw["load1/icefrog"] == {"gpu_hours": [8.0, 4.0], "span_h": [5.0, 1.5]}
    row = dict(zip(header, rows[0], strict=True))
    assert row["small wait / run h, GPUs"] == "0.50 / 2.00, 2.75"
    assert row["GPU-hours, span h"] == "6 (4-8), 3.2 (1.5-5.0)"
    _parse(ev.markdown(header, rows))


def test_tta_counts_only_jobs_that_reached_the_target() -> None:
    def job(task: str, jct_h: float, reached: bool, wait_h: float = 0.0,
            gpus: float = 1.0) -> dict[str, Any]:  # fmt: skip
        return {"task": task, "jct_s": jct_h * 3600, "reached_target": reached,
                "submit": 0.0, "start": wait_h * 3600, "finish": jct_h * 3600,
                "gpu_hours": gpus * (jct_h - wait_h)}  # fmt: skip

    g = ev.Grid(loads=(1.0,), seeds=(1,), policies=("icefrog", "pollux+"))
    res = {
        ev._key(g, 1.0, 1, "icefrog"): _doc(1, [job("a", 1, True), job("a", 9, False, 8, 8)]),
        ev._key(g, 1.0, 1, "pollux+"): _doc(1, [job("a", 3, True, 2, 4), job("a", 1, True)]),
    }
    header, rows, raw = ev.table_tta(g, res)
    assert raw["load1/a"]["ratio"] == [2.0]
    row = dict(zip(header, rows[0], strict=True))
    assert row["task"] == "a" and row["Pollux+ / ICEFROG"] == "2.00x"
    # the unfinished job's 8 GPUs and 8 h of waiting count for nothing
    assert row["GPUs, ICEFROG / Pollux+"] == "1.0 / 2.5"
    assert row["wait h, ICEFROG / Pollux+"] == "0.00 / 1.00"
    _parse(ev.markdown(header, rows))


def test_ablation_rows_reuse_the_default_run() -> None:
    g = ev.Grid()
    rows = dict(ev.ablation_rows(g))
    base = rows["as is (batch and layer elasticity, frozen penalty, sharing, lambda 0.9, "
                "period 5 min)"]  # fmt: skip
    assert rows["lambda 0.9"] is base and rows["period 5 min"] is base
    main = {r.key for r in ev.main_runs(g)}
    assert {r.key for r in base} <= main  # main's runs of the icefrog row at 2x
    paper = next(rs for label, rs in rows.items() if label.startswith("the paper's protocol"))
    assert {r.key for r in paper} <= main and all(ev.PAPER_SET in r.extra for r in paper)
    assert [r.key for r in rows["sharing off (`--no-share`)"]] == [
        ev.sharing_run(g, 2.0, s).key for s in (1, 2, 3)
    ]
    assert all("sharing.speed_factor=0.6" in r.extra for r in rows["lambda 0.6"])
    assert all("controller.round_period_s=600" in r.extra for r in rows["period 10 min"])
    assert rows["throughput noise sd 0.5"][0].extra[-2:] == ("--profile-noise", "0.5")
    runs = [r for rs in rows.values() for r in rs]
    assert all(r.workload.load == 2.0 and r.policy == "icefrog" for r in runs)
    assert all(ev.BATCH_SCALING_SET in r.extra for rs in rows.values() if rs is not paper
               for r in rs)  # fmt: skip
    assert all([r.seed for r in rs] == [1, 2, 3] for rs in rows.values())
    assert all(r.workload.seed == r.seed for r in runs)  # each seed on its own trace
    assert all(ev.FREEZEOUT_SET in r.extra for r in rows["frozen penalty -> tuned FreezeOut"])
    keys = {r.key for r in runs}
    assert len(keys) == 3 * (len(rows) - 2)  # lambda 0.9, period 5 = as is


def test_ablation_ratio_is_per_seed_against_the_as_is_run_of_that_seed() -> None:
    g = ev.Grid(ablation_seeds=(1, 2))
    rows_in = ev.ablation_rows(g)
    (_, base), (off_label, off) = rows_in[0], rows_in[1]
    assert base and off
    res = {base[0].key: _doc(1.0), base[1].key: _doc(4.0),
           off[0].key: _doc(1.5), off[1].key: _doc(4.0)}  # fmt: skip
    header, rows, raw = ev.table_ablation(rows_in, res)
    assert raw[off_label]["ratio"] == [1.5, 1.0]
    cells = dict(zip(header, rows[1], strict=True))
    assert cells["JCT / as-is JCT"] == "1.25 (1.00-1.50)"  # not 5.5 h / 5.0 h = 1.10
    assert cells["avg JCT h"] == "2.75 (1.50-4.00)" and cells["seeds"] == "2"
    assert dict(zip(header, rows[0], strict=True))["JCT / as-is JCT"] == "1.00 (1.00-1.00)"
    missing = next(r for r in rows if r[0].startswith("sharing off"))
    assert missing[1] == "0" and missing[2] == "-" and "2 run(s) missing" in missing[4]
    _parse(ev.markdown(header, rows))


def test_batch_table_compares_batch_scaling_with_the_paper_protocol_and_pollux() -> None:
    g = ev.Grid(loads=(1.0,), seeds=(1, 2))
    res = {
        ev._key(g, 1.0, 1, "icefrog-paper"): _doc(3.0),
        ev._key(g, 1.0, 2, "icefrog-paper"): _doc(2.0),
        ev._key(g, 1.0, 1, "pollux+"): _doc(2.0), ev._key(g, 1.0, 2, "pollux+"): _doc(1.0),
        ev._key(g, 1.0, 1, "icefrog"): _doc(2.0), ev._key(g, 1.0, 2, "icefrog"): _doc(2.0),
    }  # fmt: skip
    header, rows, raw = ev.table_batch(g, res)
    assert raw["load1/icefrog"]["paper_protocol_over"] == [1.5, 1.0]
    assert raw["load1/icefrog"]["pollux_over"] == [1.0, 0.5]
    cells = dict(zip(header, next(r for r in rows if r[1] == "icefrog"), strict=True))
    assert cells["ICEFROG paper protocol / it"] == "1.25x (1.00-1.50)"
    assert cells["Pollux+ / it"] == "0.75x (0.50-1.00)"
    assert cells["paper (batch scaling over the paper protocol)"] == "1.16-1.21x"
    _parse(ev.markdown(header, rows))


def test_sharing_table_is_the_jct_without_over_with_per_seed() -> None:
    g = ev.Grid(loads=(1.0, 3.0), seeds=(1, 2))
    on = {(w, s): ev._key(g, w, s, "icefrog") for w in g.loads for s in g.seeds}
    off = {(w, s): ev.sharing_run(g, w, s) for w in g.loads for s in g.seeds}
    assert all("--no-share" in r.extra and ev.BATCH_SCALING_SET in r.extra for r in off.values())
    assert {r.key for r in off.values()}.isdisjoint(on.values())

    def doc(h: float, shared: int, hours: float) -> dict[str, Any]:
        d = _doc(h)
        d["totals"].update(jobs_shared=shared, shared_hours=hours)
        return d

    res = {on[1.0, 1]: doc(1.0, 2, 0.5), on[1.0, 2]: doc(2.0, 0, 0.0),
           off[1.0, 1].key: doc(1.1, 0, 0.0), off[1.0, 2].key: doc(2.0, 0, 0.0),
           on[3.0, 1]: doc(2.0, 6, 3.0), on[3.0, 2]: doc(2.0, 4, 1.0),
           off[3.0, 1].key: doc(3.0, 0, 0.0)}  # fmt: skip
    header, rows, raw = ev.table_sharing(g, res)
    assert raw["load1"]["gain"] == pytest.approx([1.1, 1.0])
    assert raw["load3"]["gain"] == [1.5, None]
    third = dict(zip(header, rows[1], strict=True))
    assert third["JCT without / with, mean (min-max)"] == "1.50x"
    assert third["jobs that shared a GPU"] == "5 (4-6)"
    assert "1 run(s) missing" in third["jobs unfinished (with, without)"]
    _parse(ev.markdown(header, rows))


def test_scale_table_speedups_are_over_each_icefrog_row() -> None:
    g = ev.Grid(scale=((5.0, 240),), policies=("icefrog", "icefrog-paper", "pollux+"))
    res = {ev.scale_run(g, 5.0, 240, p).key: _doc(h)
           for p, h in (("icefrog", 1.0), ("icefrog-paper", 1.25), ("pollux+", 1.5))}  # fmt: skip
    header, rows, _ = ev.table_scale(g, res)
    cells = {r[2]: dict(zip(header, r, strict=True)) for r in rows}
    assert cells["pollux+"]["ICEFROG speedup (its JCT / ICEFROG's)"] == "1.50x"
    assert cells["pollux+"]["ICEFROG paper-protocol speedup (its JCT / that row's)"] == "1.20x"
    assert cells["icefrog"]["ICEFROG speedup (its JCT / ICEFROG's)"] == "-"
    _parse(ev.markdown(header, rows))


def test_faithful_runs_are_pollux_workloads_without_freezing_or_sharing() -> None:
    g = ev.Grid(workloads=2)
    runs = ev.faithful_runs(g)
    assert len(runs) == 3 * 2 * 2
    assert {r.gpus for r in runs} == {64} and {r.policy for r in runs} == {"optimus+", "pollux+"}
    assert all({"--no-freeze", "--no-share", "paper"} <= set(r.extra) for r in runs)
    assert all("controller.round_period_s=60" in r.extra for r in runs)  # AdaptDL's interval
    assert str(runs[0].workload).endswith("workloads-0.5/workload-1.csv")
    assert str(runs[-1].workload).endswith("workloads-2.0/workload-2.csv")  # the folder's name


def test_max_scale_stops_at_a_size_and_quick_is_small() -> None:
    g = ev.grid_from(_args("scale", "--max-scale", "480"))
    assert [n for _, n in g.scale] == [240, 480]
    assert g.loads == (1.0, 2.0, 3.0) and g.seeds == (1, 2, 3) and g.gpus == 48
    q = ev.grid_from(_args("main", "--quick", "--set", "a.b=1"))
    assert (q.gpus, q.loads, q.seeds) == (16, (0.25,), (1,))
    assert q.common == ("--batch", "paper", "--set", "a.b=1")


def test_pollux_defaults_to_the_repository_copy_else_the_option_is_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = runs.repo_pollux()
    assert repo is not None and (repo / "workloads-0.5").is_dir()  # a source checkout
    assert repo == Path(__file__).resolve().parents[2] / "data" / "pollux"
    monkeypatch.setattr(command, "repo_pollux", lambda: None)
    assert _main(["faithful", "--no-run", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "icefrog evaluate: error: --pollux:" in err and "give --pollux DIR" in err
    assert _main(["nosuch", "--out", str(tmp_path)]) == 2
    assert "unknown table(s) nosuch" in capsys.readouterr().err
    assert _main(["main", "--policies", "lucid+", "--out", str(tmp_path)]) == 2
    assert "--policies: must include icefrog" in capsys.readouterr().err


def test_the_command_line_in_each_table_names_what_was_given() -> None:
    args = _args("main", "size", "--quick", "--set", "a.b=1", "--jobs", "3")
    assert command.command_line(args) == "icefrog evaluate main size --jobs 3 --quick --set a.b=1"


def _philly(path: Path) -> Path:
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(12):
        rows.append(f"2017-10-09 03:{i * 4:02d}:00,{600 + 60 * i},1,{600 + 60 * i},c")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.slow
def test_quick_run_makes_parsable_tables_and_a_rerun_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    argv = ["--quick", "--base-jobs", "8", "--tasks", "resnet18-cifar10",
            "--policies", "icefrog,pollux+", "--philly", str(_philly(tmp_path / "p.csv")),
            "--out", str(out)]  # fmt: skip
    assert _main(["main", *argv]) == 0
    first = capsys.readouterr()
    assert "2 run(s) now, 0 reused" in first.out
    rows = _parse(first.out.split("### main", 1)[1])
    assert [r[1] for r in rows[1:]] == ["icefrog", "pollux+"]
    assert float(rows[1][2]) > 0  # an average JCT in hours
    summaries = sorted((out / "runs").glob("*/summary.json"))
    assert len(summaries) == 2 and not list((out / "runs").glob("*.tmp"))
    stamps = [p.stat().st_mtime_ns for p in summaries]
    meta = json.loads((summaries[0].parent / "run.json").read_text())
    assert meta["argv"][:2] == ["icefrog", "simulate"] and "--batch" in meta["argv"]
    trace = next((out / "traces").glob("*.json"))
    assert json.loads(trace.read_text())  # the sidecar: seed and mapping

    assert _main(["main", "size", "tta", *argv]) == 0
    again = capsys.readouterr()
    assert "0 run(s) now" in again.out and " run(s) now, 2 reused" in again.out
    assert "1 run(s) now" not in again.out and "2 run(s) now" not in again.out
    assert [p.stat().st_mtime_ns for p in summaries] == stamps
    assert _main(["main", "--no-run", *argv, "--seeds", "2"]) == 0  # seed 2 never ran
    missing = _parse(capsys.readouterr().out.split("### main", 1)[1])
    assert missing[1][2] == "-" and "1 run(s) missing" in missing[1][-1]
    assert not list((out / "runs").glob("*seed2*"))
    for table in ("main", "size", "tta"):
        doc = json.loads((out / "tables" / f"{table}.json").read_text())
        _parse((out / "tables" / f"{table}.md").read_text())
        assert doc["rows"] and doc["header"]


def test_a_workload_files_run_key_names_the_data_not_the_checkout(tmp_path: Path) -> None:
    """The same Pollux workload in two checkouts is one run; another load's is another, and
    so are other bytes under the same folder and name."""
    paths = [tmp_path / root / "data" / "pollux" / f"workloads-{w}" / "workload-1.csv"
             for root, w in (("a", "0.5"), ("b", "0.5"), ("a", "1.5"), ("c", "0.5"))]  # fmt: skip
    for p in paths:
        p.parent.mkdir(parents=True)
        p.write_text("name,time,application,num_replicas,batch_size\nj,0,ncf,1,256\n")
    paths[3].write_text("name,time,application,num_replicas,batch_size\nj,9,ncf,2,256\n")
    keys = [runs.Run("fidelity-64g-w1-pollux+", p, "pollux+", 64, 1).key for p in paths]
    assert keys[0] == keys[1] != keys[2]
    assert keys[3] != keys[0]


def test_a_workload_files_run_is_reused_only_from_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of another --pollux folder's bytes under the same folder and name is not
    reused; one made before the key held the sha256 is, when it records the same sha256."""
    calls: list[list[str]] = []
    monkeypatch.setattr(runs, "_icefrog", _fake_icefrog(calls))
    body = "name,time,application,num_replicas,batch_size\nj,0,ncf,1,256\n"
    a, b = (tmp_path / d / "workloads-0.5" / "workload-1.csv" for d in ("a", "b"))
    for path, text in ((a, body), (b, body.replace(",1,256", ",2,256"))):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    runner = runs.Runner(tmp_path / "eval", 1)
    run_a, run_b = (runs.Run("faithful-64g-load0.5-w1-pollux+", w, "pollux+", 64, 1)
                    for w in (a, b))  # fmt: skip
    assert runner.ensure([run_a])[run_a.key] is not None and runner.ran == 1
    assert runner.ensure([run_b])[run_b.key] is not None and runner.ran == 2
    assert runner.ensure([run_a, run_b]) and runner.ran == 2 and runner.reused == 2
    # a run made under the older key (folder and name alone)
    assert run_a.legacy_key == run_b.legacy_key != run_a.key
    old = tmp_path / "eval" / "runs"
    shutil.move(old / run_a.key, old / str(run_a.legacy_key))
    shutil.rmtree(old / run_b.key)
    assert runner.summary(run_a) is not None  # the same sha256: reused
    assert runner.summary(run_b) is None  # another file's: not
    runner.ensure([run_a, run_b])
    assert runner.ran == 3 and len(calls) == 3


def _fake_icefrog(calls: list[list[str]]) -> Any:
    """``runs._icefrog`` without a child: trace sample writes a one-job trace and its
    sidecar (with the source's sha256), simulate a summary.json that records the
    workload's sha256 as ``icefrog simulate`` does."""
    import subprocess

    def fake(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        if argv[:2] == ["trace", "sample"]:
            out = Path(opt["--out"])
            out.write_text("name,time,application,num_replicas,batch_size\nj,0,ncf,1,256\n")
            source = Path(opt["--philly"]) if "--philly" in opt else packaged_philly()
            side = {"seed": int(opt["--seed"]), "philly_sha256": _sha256(source)}
            out.with_suffix(".json").write_text(json.dumps(side))
        else:
            doc = {**_doc(1.0), "run": {"workload": {"sha256": _sha256(Path(opt["--workload"]))}}}
            (Path(opt["--out"]) / "summary.json").write_text(json.dumps(doc))
        return subprocess.CompletedProcess(argv, 0, "", "")

    return fake


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_another_philly_file_makes_new_traces_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run or a trace is reused only when made from the same Philly bytes: another file
    samples a new trace and runs anew; the first file's runs are reused once it is back."""
    calls: list[list[str]] = []
    monkeypatch.setattr(runs, "_icefrog", _fake_icefrog(calls))
    first, other = _philly(tmp_path / "p.csv"), tmp_path / "half.csv"
    other.write_text(first.read_text().replace(",600,1,600,", ",900,2,1800,"))  # other jobs
    out = tmp_path / "eval"
    argv = ["main", "--quick", "--base-jobs", "8", "--policies", "icefrog", "--out", str(out)]
    assert _main([*argv, "--philly", str(first)]) == 0
    assert "1 run(s) now, 0 reused" in capsys.readouterr().out
    assert _main([*argv, "--philly", str(other)]) == 0
    assert "1 run(s) now, 0 reused" in capsys.readouterr().out
    traces = sorted(p.name for p in (out / "traces").glob("*.csv"))
    assert len(traces) == 2 and all("-p" in t for t in traces)
    assert len(list((out / "runs").iterdir())) == 2
    assert _main([*argv, "--philly", str(first)]) == 0
    assert "0 run(s) now, 1 reused" in capsys.readouterr().out
    assert sum(c[:2] == ["trace", "sample"] for c in calls) == 2


def test_the_packaged_traces_names_and_run_keys_are_as_before() -> None:
    """Runs made from the packaged trace keep their keys (result folders stay reusable)."""
    g = ev.Grid(loads=(0.25,), seeds=(1,), gpus=16)
    assert g.trace(0.25, 1).name == "philly-load0.25-seed1-jobs120"
    keys = {r.key for r in ev.main_runs(replace(g, policies=("icefrog", "slurm")))}
    assert keys == {"main-16g-load0.25-seed1-icefrog-a170ca13",
                    "main-16g-load0.25-seed1-slurm-1724da1b"}  # fmt: skip


def test_a_sidecar_from_other_philly_bytes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runs, "_icefrog", _fake_icefrog([]))
    runner = runs.Runner(tmp_path, 1)
    trace = runs.Trace(1.0, 1, 8, "", _philly(tmp_path / "p.csv"))
    runner.trace_path(trace).parent.mkdir(parents=True)
    runner.trace_path(trace).with_suffix(".json").write_text('{"philly_sha256": "0" }')
    with pytest.raises(InputError, match="sampled from a Philly trace of sha256 0"):
        runner.ensure([runs.Run("x", trace, "icefrog", 16, 1)])


def test_a_trace_job_lucid_or_slurm_could_never_start_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once the traces are sampled and before a simulation starts: a job asking for more
    than --gpus is refused, naming the trace's row (Lucid+ and Slurm would leave it
    waiting)."""
    philly = tmp_path / "p.csv"
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    rows += [f"2017-10-09 03:{i:02d}:00,3600,8,28800,c" for i in range(4)]
    philly.write_text("\n".join(rows) + "\n")
    out = tmp_path / "eval"
    argv = ["main", "--quick", "--gpus", "4", "--base-jobs", "4", "--loads", "1",
            "--tasks", "resnet18-cifar10", "--policies", "icefrog,slurm", "--philly",
            str(philly), "--out", str(out)]  # fmt: skip
    assert _main(argv) == 2
    err = capsys.readouterr().err
    assert "philly-load1-seed1-jobs4-" in err and ".csv:2: num_replicas 8: more GPUs than " in err
    assert "--gpus 4; slurm starts a job only on the GPUs it requests" in err
    assert not (out / "runs").exists()


def test_a_run_another_command_is_making_is_waited_for_not_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two commands on one --out: the second waits on the run the first is making (its
    KEY.tmp left alone), then reuses it."""
    import fcntl
    import threading
    import time

    calls: list[list[str]] = []
    monkeypatch.setattr(runs, "_icefrog", _fake_icefrog(calls))
    work = tmp_path / "w" / "workload-1.csv"
    work.parent.mkdir()
    work.write_text("name,time,application,num_replicas,batch_size\nj,0,ncf,1,256\n")
    run = runs.Run("faithful-64g-load0.5-w1-pollux+", work, "pollux+", 64, 1)
    out = tmp_path / "eval"
    (out / ".locks").mkdir(parents=True)
    tmp = out / "runs" / f"{run.key}.tmp"
    tmp.mkdir(parents=True)
    (tmp / "log.txt").write_text("the other command's run, half made\n")
    logged: list[str] = []
    runner = runs.Runner(out, 1, log=logged.append)
    with open(out / ".locks" / f"{run.key}.lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # the other command holds the run
        second = threading.Thread(target=runner.ensure, args=([run],))
        second.start()
        time.sleep(1.0)
        assert (tmp / "log.txt").is_file() and second.is_alive()
        assert any("waiting for" in m for m in logged)
        (tmp / "summary.json").write_text(json.dumps(_doc(1.0)))
        tmp.rename(out / "runs" / run.key)  # the other command finishes
    second.join(timeout=30)
    assert not second.is_alive()
    assert calls == [] and runner.ran == 0 and runner.reused == 1
    assert runner.summary(run) == _doc(1.0)


def test_a_run_imports_the_runners_package_not_the_current_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from a folder holding another ``icefrog_slurm`` (another checkout, an older
    commit's worktree): each simulation's child process runs the runner's own package, the
    one whose commit ``run.json`` names, never the current folder's."""
    other = tmp_path / "icefrog_slurm"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "__main__.py").write_text("print('the current folder s package')\n")
    monkeypatch.chdir(tmp_path)
    done = runs._icefrog(["--version"])
    assert done.returncode == 0, done.stderr
    assert "current folder" not in done.stdout
    assert done.stdout.strip()  # the real package's version line
