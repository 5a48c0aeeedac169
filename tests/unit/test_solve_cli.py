"""``icefrog solve``: the spec's hand example end to end, and bad input -> exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.settings import SolverSettings

MIN = 60.0


def _hand_example(a1_minutes: float) -> dict[str, Any]:
    """Spec section 10: 4 GPUs; A 1/2/4 GPUs -> a1/60/50 min, B -> 80/50/45 min."""

    def opts(*minutes: float) -> list[dict[str, Any]]:
        return [{"gpus": g, "tta_s": m * MIN} for g, m in zip((1, 2, 4), minutes, strict=True)]

    return {
        "gpus": 4,
        "gpus_per_node": 4,
        "gpu_mem_gb": 80,
        "jobs": [
            {"id": "A", "weight": 1.0, "options": opts(a1_minutes, 60, 50)},
            {"id": "B", "options": opts(80, 50, 45)},
        ],
    }


def _solve(
    tmp_path: Path, doc: Any, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, Any, str]:
    path = tmp_path / "round.json"
    path.write_text(json.dumps(doc))
    code = main(["solve", str(path), *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


@pytest.mark.parametrize("solver", ["auto", "mip"])
def test_hand_example_gives_two_plus_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], solver: str
) -> None:
    code, out, _ = _solve(tmp_path, _hand_example(100), capsys, "--solver", solver)
    assert code == 0
    assert out["status"] == "optimal"
    assert out["min_share"] == pytest.approx(50 / 60, abs=1e-6)  # 0.83
    assert {j: v["gpus"] for j, v in out["jobs"].items()} == {"A": 2, "B": 2}
    assert out["jobs"]["B"]["share"] == pytest.approx(0.9)
    assert out["gpus_used"] == 4
    assert out["jobs"]["A"]["nodes"] == {"node1": 2}


@pytest.mark.parametrize("solver", ["auto", "mip"])
def test_freezing_a_to_55_minutes_gives_one_plus_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], solver: str
) -> None:
    code, out, _ = _solve(
        tmp_path, _hand_example(55), capsys, "--solver", solver, "--time-limit", "5"
    )
    assert code == 0
    assert {j: v["gpus"] for j, v in out["jobs"].items()} == {"A": 1, "B": 2}
    assert out["jobs"]["A"]["share"] == pytest.approx(50 / 55)  # 0.91
    assert out["min_share"] == pytest.approx(0.9)
    assert out["gpus_used"] == 3  # one GPU left for a third job


def test_shared_pair_and_waiting_job_in_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def small(i: str) -> dict[str, Any]:
        return {
            "id": i,
            "options": [
                {"gpus": 1, "tta_s": 900},
                {"gpus": 1, "shared": True, "tta_s": 1000, "util": 0.4, "mem_gb": 30},
            ],
        }

    doc = {
        "gpus": 1,
        "gpus_per_node": 1,
        "gpu_mem_gb": 80,
        "jobs": [small("s1"), small("s2"), {"id": "big", "options": [{"gpus": 1, "tta_s": 5}]}],
    }
    code, out, _ = _solve(tmp_path, doc, capsys)
    assert code == 0
    s1, s2 = out["jobs"]["s1"], out["jobs"]["s2"]
    assert s1["shared"] and s1["partner"] == "s2" and s2["partner"] == "s1"
    assert s1["gpu"] == s2["gpu"] == {"node": "node1", "index": 0}
    assert out["jobs"]["big"] == {"gpus": 0, "shared": False, "share": 0.0, "nodes": {}}
    assert out["gpus_used"] == 1


def _bad(doc: dict[str, Any], edit: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    edit(doc)
    return doc


BAD = [
    (lambda d: d["jobs"][0].update(colour="red"), "jobs[0].colour: unknown field"),
    (lambda d: d.update(gpu=4), "gpu: unknown field"),
    (
        lambda d: d["jobs"][1]["options"][0].update(tta_s=-5),
        "jobs[1].options[0].tta_s: must be > 0",
    ),
    (lambda d: d["jobs"][1].update(id="A"), "jobs[1].id: duplicate job id 'A'"),
    (
        lambda d: d["jobs"][0].update(
            options=[
                {"gpus": 2, "tta_s": 10},
                {"gpus": 1, "shared": True, "tta_s": 20, "util": 0.3, "mem_gb": 10},
            ]
        ),
        "a shared option on a job that cannot run on one GPU",
    ),
    (
        lambda d: d["jobs"][0]["options"].append({"gpus": 1, "shared": True, "tta_s": 9}),
        "util: missing",
    ),
]


def test_a_fairness_floor_gives_the_fast_scaling_job_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """8 GPUs, five jobs: the max-min gives C, D and E two GPUs each; held to half of that
    minimum instead, stage 2 gives D (16 min on 4 GPUs, 64 on 1) four and the sum of shares
    grows from 3.02 to 3.48."""
    minutes = {"A": (100, 95, 86), "B": (86, 83, 78), "C": (90, 85, 30), "D": (64, 40, 16),
               "E": (64, 48, 24)}  # fmt: skip
    jobs = [{"id": k, "options": [{"gpus": g, "tta_s": m * MIN}
                                  for g, m in zip((1, 2, 4), v, strict=True)]}
            for k, v in minutes.items()]  # fmt: skip
    doc = {"gpus": 8, "gpus_per_node": 8, "gpu_mem_gb": 80, "jobs": jobs}
    gpus = {}
    for floor in ("1", "0.5"):
        code, out, _ = _solve(tmp_path, doc, capsys, "--fairness-floor", floor)
        assert code == 0 and out["status"] == "optimal"
        gpus[floor] = ({j: v["gpus"] for j, v in out["jobs"].items()}, round(out["sum_share"], 2))
    assert gpus["1"] == ({"A": 1, "B": 1, "C": 2, "D": 2, "E": 2}, 3.02)
    assert gpus["0.5"] == ({"A": 1, "B": 1, "C": 1, "D": 4, "E": 1}, 3.48)
    code, out, _ = _solve(tmp_path, doc, capsys)  # the default: the controller's
    default = ({j: v["gpus"] for j, v in out["jobs"].items()}, round(out["sum_share"], 2))
    assert code == 0 and SolverSettings().fairness_floor == 0.5 and default == gpus["0.5"]
    for bad in ("0", "1.5", "nan"):
        code, _, err = _solve(tmp_path, doc, capsys, "--fairness-floor", bad)
        assert code == 2 and "--fairness-floor" in err


@pytest.mark.parametrize(("edit", "message"), BAD)
def test_bad_input_exits_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, message: str
) -> None:
    code, _, err = _solve(tmp_path, _bad(_hand_example(100), edit), capsys)
    assert code == 2
    assert message in err


def test_fragmentation_is_re_solved_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {
        "gpus": 8,
        "gpus_per_node": 4,
        "gpu_mem_gb": 80,
        "jobs": [
            {"id": "a", "options": [{"gpus": 3, "tta_s": 100}]},
            {"id": "b", "options": [{"gpus": 3, "tta_s": 100}]},
            {"id": "c", "options": [{"gpus": 1, "tta_s": 200}, {"gpus": 2, "tta_s": 100}]},
        ],
    }
    code, out, _ = _solve(tmp_path, doc, capsys)
    assert code == 0
    assert out["jobs"]["c"]["gpus"] == 1
    assert sum(out["jobs"]["c"]["nodes"].values()) == 1
    assert any(n.startswith("c: 2 GPU(s) could not be placed") for n in out["notes"])
