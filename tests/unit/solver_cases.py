"""Shared helpers of the solver tests: random small problems and a brute-force enumerator."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from hypothesis import strategies as st

from icefrog_slurm.core.solver import WAIT, Cluster, Holding, JobRequest, Option, Problem
from icefrog_slurm.core.solver.problem import stage2_threshold


def max_matching(edges: list[tuple[int, int]], nodes: frozenset[int]) -> int:
    """Maximum matching size by exhaustive recursion (tiny graphs only)."""
    live = [(a, b) for a, b in edges if a in nodes and b in nodes]
    if not live:
        return 0
    a, b = live[0]
    without = max_matching(live[1:], nodes)
    return max(without, 1 + max_matching(live[1:], nodes - {a, b}))


def _assignments(problem: Problem) -> Iterator[tuple[list[int], int]]:
    """(each job's score, running jobs changed) of every assignment that fits."""
    jobs = problem.jobs
    menus = [[WAIT] + [i for i in range(len(j.options)) if problem.usable(j, i)] for j in jobs]
    for combo in itertools.product(*menus):
        shared = [k for k, i in enumerate(combo) if i != WAIT and jobs[k].options[i].shared]
        excl = sum(jobs[k].options[i].gpus for k, i in enumerate(combo) if i != WAIT)
        edges = [
            (a, b)
            for a, b in itertools.combinations(shared, 2)
            if problem.cluster.admissible(jobs[a].options[combo[a]], jobs[b].options[combo[b]])
        ]
        need = excl - problem.cluster.gpus
        if need > 0 and max_matching(edges, frozenset(shared)) < need:
            continue
        scores = [j.score(i) for j, i in zip(jobs, combo, strict=True)]
        yield scores, sum(0 if j.keeps(i) else 1 for j, i in zip(jobs, combo, strict=True))


def brute_force(problem: Problem, fairness_floor: float = 1.0) -> tuple[int, int, int]:
    """The lexicographic optimum (least score, sum of scores, -changes) over every
    assignment; with ``fairness_floor`` below 1, stage 2 and 3's optimum over the
    assignments whose least score reaches the floored stage-1 optimum (its least score is
    then that threshold, not the assignment's)."""
    found = list(_assignments(problem))
    t = stage2_threshold(max(min(sc) for sc, _ in found), fairness_floor)
    return max((t, sum(sc), -ch) for sc, ch in found if min(sc) >= t)


@st.composite
def problems(draw: st.DrawFn, max_jobs: int = 5) -> Problem:
    gpn = draw(st.sampled_from([2, 4]))
    nodes = draw(st.integers(1, 2))
    jobs = []
    for k in range(draw(st.integers(1, max_jobs))):
        counts = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3, unique=True))
        options = [Option(g, float(draw(st.integers(10, 400)))) for g in counts]
        if 1 in counts and draw(st.booleans()):
            options.append(
                Option(
                    1,
                    options[counts.index(1)].tta_s * draw(st.sampled_from([1.0, 1.1, 1.3, 2.0])),
                    shared=True,
                    util=draw(st.sampled_from([0.2, 0.4, 0.5, 0.6, 0.8])),
                    mem_gb=draw(st.sampled_from([10.0, 30.0, 40.0, 50.0])),
                )
            )
        current = None
        if draw(st.booleans()):
            o = draw(st.sampled_from(options))
            current = Holding(gpus=o.gpus, shared=o.shared)
        weight = draw(st.sampled_from([1.0, 1.0, 1.5, 2.0]))
        jobs.append(JobRequest(f"j{k}", tuple(options), weight=weight, current=current))
    cluster = Cluster(gpus=gpn * nodes, gpus_per_node=gpn, gpu_mem_gb=80.0)
    return Problem(cluster, tuple(jobs))
