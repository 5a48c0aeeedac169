"""``icefrog evaluate fidelity``: Pollux+ on V100s against Pollux's published per-job JCTs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.errors import InputError
from icefrog_slurm.evaluation.grid import Grid, fidelity_runs
from icefrog_slurm.evaluation.tables import markdown, table_fidelity


def test_fidelity_runs_are_pollux_plus_on_v100_as_adaptdl_ran_it() -> None:
    runs = fidelity_runs(Grid(workloads=2))
    assert len(runs) == 3 * 2 and {r.policy for r in runs} == {"pollux+"}
    assert {r.gpus for r in runs} == {64}
    for r in runs:
        extra = list(r.extra)
        assert extra[extra.index("--gpu-model") + 1] == "v100"
        assert {"--no-freeze", "--no-share", "controller.round_period_s=60",
                "controller.reallocation_overhead_s=30"} <= set(extra)  # fmt: skip
    assert str(runs[-1].workload).endswith("workloads-2.0/workload-2.csv")


def _job(name: str, task: str, jct: float | None) -> dict[str, Any]:
    return {"name": name, "task": task, "jct_s": jct}


def test_table_takes_medians_per_application_and_the_average_ratio(tmp_path: Path) -> None:
    g = Grid(workloads=1, faithful_loads=(0.5, 1.5), pollux=tmp_path)
    published = {
        0.5: {"cifar10-1": 100.0, "cifar10-2": 200.0, "cifar10-3": 400.0, "ncf-4": 50.0},
        1.5: {"bert-1": 1000.0, "bert-2": 3000.0},
    }
    for w, jcts in published.items():
        folder = tmp_path / "results-jobload" / f"pollux-{w:.1f}"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"jcts": {"workload-1": jcts}}))
    docs = {
        0.5: [_job("cifar10-1", "resnet18-cifar10", 100.0),  # 1.0
              _job("cifar10-2", "resnet18-cifar10", 400.0),  # 2.0
              _job("cifar10-3", "resnet18-cifar10", 200.0),  # 0.5
              _job("ncf-4", "ncf-movielens", None)],  # unfinished: left out
        1.5: [_job("bert-1", "bert-squad", 1500.0), _job("bert-2", "bert-squad", 3300.0),
              _job("extra", "bert-squad", 5.0)],  # not in the published run: left out
    }  # fmt: skip
    res = {}
    for r in fidelity_runs(g):
        w = 0.5 if "load0.5" in r.label else 1.5
        res[r.key] = {"jobs": docs[w]}
    header, rows, raw = table_fidelity(g, res)
    cells = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert cells["0.5"]["cifar10 median (jobs)"] == "1.00 (3)"
    assert cells["0.5"]["ncf median (jobs)"] == "-" and cells["0.5"]["unfinished"] == "1"
    assert cells["0.5"]["avg JCT ratio"] == "1.00"  # 700 s / 700 s
    assert cells["1.5"]["bert median (jobs)"] == "1.30 * (2)"  # 1.5 and 1.1: outside goal
    assert cells["1.5"]["avg JCT ratio"] == "1.20 *"  # 4800 / 4000: outside 15 %
    assert cells["all"]["avg JCT ratio"] == "1.17 *"  # 5500 / 4700
    assert cells["all"]["cifar10 median (jobs)"] == "1.00 (3)"
    assert raw["all/bert"]["ratios"] == pytest.approx([1.5, 1.1])
    markdown(header, rows)


def test_a_missing_or_malformed_published_summary_names_the_file(tmp_path: Path) -> None:
    g = Grid(workloads=1, faithful_loads=(0.5,), pollux=tmp_path)
    res = {r.key: {"jobs": []} for r in fidelity_runs(g)}
    with pytest.raises(InputError, match=r"pollux-0\.5"):
        table_fidelity(g, res)
    folder = tmp_path / "results-jobload" / "pollux-0.5"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text('{"jcts": {"workload-1": {"a": "x"}}}')
    with pytest.raises(InputError, match=r"pollux-0\.5"):
        table_fidelity(g, res)
