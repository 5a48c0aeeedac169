"""The benchmarks whose figures the controller and solver documents quote run to their end
on a tiny instance (they time nothing here: a broken benchmark is found by the suite, not
by the next person who measures)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_controller_benchmark_runs_its_three_ticks() -> None:
    out = _run("benchmarks.controller", "--jobs", "12", "--nodes", "3", "--new-stats")
    for tick in ("first round", "nothing due", "second round"):
        (line,) = [x for x in out.splitlines() if x.strip().startswith(tick)]
        assert "12 jobs, 12 GPUs given" in line


def test_the_store_benchmark_fills_and_times_a_tick() -> None:
    out = _run("benchmarks.store_snapshot", "--jobs", "12", "--intents", "2", "--repeat", "1")
    assert "tick transaction (snapshot + round of 12 allocations" in out


@pytest.mark.parametrize("floor", ["0.5", "1"])
def test_the_solver_benchmark_solves_and_checks_a_round(floor: str) -> None:
    out = _run(
        "benchmarks.solver", "--sizes", "48", "--rounds", "2", "--seeds", "1", "--no-mip",
        "--mip-max-gpus", "0", "--fairness-floor", floor,
    )  # fmt: skip
    assert f"fairness floor {floor}" in out
    (row,) = [x for x in out.splitlines() if x.split()[:2] == ["48", "120"]]
    assert "optimal" in row
