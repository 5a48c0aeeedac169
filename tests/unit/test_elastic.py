"""The baselines' marginal-gain allocation (``policies.baseline.elastic``): one count at a
time (Optimus+), or looking past a dip to every larger count (Pollux+)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from icefrog_slurm.policies.baseline import JobOptions, elastic

# One job's value by GPU count: it rises, dips at 8 (the first count across two nodes of 4)
# and rises past it at 16.
DIP = {1: 1.0, 2: 2.0, 4: 3.8, 8: 3.0, 16: 7.0}


def _options(job_id: int, values: dict[int, float]) -> JobOptions:
    job: Any = SimpleNamespace(id=job_id)
    return JobOptions(job=job, exclusive=dict.fromkeys(values), shared=None)  # type: ignore[arg-type]


def _allocate(values: dict[int, dict[int, float]], gpus: int, *, lookahead: bool) -> dict[int, int]:
    opts = [_options(j, v) for j, v in values.items()]
    free: Any = SimpleNamespace(total=gpus)
    return elastic(
        opts, free, value=lambda o, g: values[o.job.id][g], order=lambda o: (0.0, o.job.id),
        lookahead=lookahead,
    )  # fmt: skip


def test_one_count_at_a_time_stops_in_front_of_a_dip() -> None:
    assert _allocate({1: DIP}, 16, lookahead=False) == {1: 4}


def test_lookahead_jumps_past_the_dip() -> None:
    assert _allocate({1: DIP}, 16, lookahead=True) == {1: 16}
    assert _allocate({1: DIP}, 12, lookahead=True) == {1: 4}  # 16 does not fit: 8 loses


def test_lookahead_still_gives_the_gpus_where_they_gain_most_per_gpu() -> None:
    steady = {1: 1.0, 2: 1.9, 4: 3.6, 8: 6.8, 16: 7.0}
    got = _allocate({1: DIP, 2: steady}, 16, lookahead=True)
    assert got == {1: 4, 2: 8}  # job 2 gains 0.8 a GPU from 4 to 8, job 1 less past its dip
