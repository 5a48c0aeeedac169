"""The weight-aging rule prevents starvation across rounds (docs/solver.md)."""

from __future__ import annotations

import pytest

from icefrog_slurm.core.solver import (
    Cluster,
    Holding,
    JobRequest,
    Option,
    Problem,
    aged_weight,
    solve,
)
from icefrog_slurm.errors import InputError


def _rounds(n: int, *, aging: bool) -> list[set[str]]:
    """X needs all 4 GPUs; four 1-GPU jobs always win stage 2 (sum 4 > 1) without aging."""
    options = {"X": (Option(4, 100.0),)} | {f"Y{i}": (Option(1, 100.0),) for i in range(4)}
    waited = dict.fromkeys(options, 0)
    current: dict[str, Holding] = {}
    history = []
    for _ in range(n):
        jobs = tuple(
            JobRequest(
                jid,
                opts,
                current=current.get(jid),
                weight=aged_weight(1.0, waited[jid]) if aging else 1.0,
            )
            for jid, opts in options.items()
        )
        sol = solve(Problem(Cluster(gpus=4, gpus_per_node=4, gpu_mem_gb=80), jobs))
        running = {j for j, c in sol.choices.items() if c.gpus}
        for jid in options:
            waited[jid] += jid not in running
        current = {j: Holding(sol.choices[j].gpus) for j in running}
        history.append(running)
    return history


def test_without_aging_the_big_job_always_waits() -> None:
    assert all("X" not in r for r in _rounds(30, aging=False))


def test_with_aging_every_job_runs() -> None:
    history = _rounds(30, aging=True)
    first = next(i for i, r in enumerate(history) if "X" in r)
    # 1 + w/4 > 4 (the four 1-GPU jobs' weights) first when X has waited 13 rounds
    assert first == 13
    assert sum("X" in r for r in history) >= 3  # X keeps getting turns, not just once
    assert all(any(f"Y{i}" in r for r in history[first + 1 :]) for i in range(4))


def test_aged_weight_rule() -> None:
    assert aged_weight(2.0, 0) == 2.0
    assert aged_weight(2.0, 4) == 4.0
    assert aged_weight(1.0, 6, rounds_per_step=3) == 3.0
    with pytest.raises(InputError):
        aged_weight(1.0, -1)
