"""The IceShare solvers against a brute-force enumerator and each other (spec section 16)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icefrog_slurm.core.solver import (
    Cluster,
    Holding,
    JobRequest,
    Option,
    Problem,
    Solution,
    SolveOptions,
    check_solution,
    solve,
)
from icefrog_slurm.core.solver.fast import max_min_threshold, solve_fast
from icefrog_slurm.core.solver.matching import max_pairs
from icefrog_slurm.core.solver.mip import solve_mip
from icefrog_slurm.core.solver.problem import SCORE_SCALE
from icefrog_slurm.errors import InputError
from tests.unit.solver_cases import brute_force, max_matching, problems

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _key(problem: Problem, sol: object) -> tuple[int, int, int]:
    from icefrog_slurm.core.solver import Solution

    assert isinstance(sol, Solution)
    scores = [j.score(sol.choices[j.id].index) for j in problem.jobs]
    return (min(scores), sum(scores), -sol.changes)


@FAST
@given(problems())
def test_fast_matches_brute_force(problem: Problem) -> None:
    sol = solve_fast(problem)
    assert check_solution(problem, sol) == []
    best = brute_force(problem)
    got = _key(problem, sol)
    assert got[0] == best[0]  # stage 1 is exact
    assert got[:2] <= best[:2]
    assert sol.bound * SCORE_SCALE >= best[1] - 1
    if sol.status == "optimal":
        assert got == best


@FAST
@given(problems())
def test_auto_is_optimal_like_brute_force(problem: Problem) -> None:
    sol = solve(problem, SolveOptions(method="auto", time_limit_s=10))
    assert check_solution(problem, sol) == []
    assert _key(problem, sol) == brute_force(problem)
    assert sol.status == "optimal"


@SLOW
@given(problems(max_jobs=4))
def test_mip_matches_brute_force(problem: Problem) -> None:
    sol = solve_mip(problem, time_limit_s=10)
    assert sol.status == "optimal"
    assert check_solution(problem, sol) == []
    assert _key(problem, sol) == brute_force(problem)


def _floored(problem: Problem, sol: Solution) -> tuple[int, int, int]:
    """(stage 2's threshold, sum of scores, -changes), every job's score checked to reach
    that threshold."""
    scores = [j.score(sol.choices[j.id].index) for j in problem.jobs]
    t = round(sol.floor_share * SCORE_SCALE)
    assert min(scores) >= t
    return (t, sum(scores), -sol.changes)


@FAST
@given(problems(), st.sampled_from([0.3, 0.5, 0.8]))
def test_a_fairness_floor_trades_the_least_share_for_the_sum_like_brute_force(
    problem: Problem, floor: float
) -> None:
    """Stage 2 held to ``floor`` x stage 1's optimum: the best sum of shares (then the
    fewest changes) over the assignments that give every job that much, as the fast path
    (when it proves it) and auto find it; never a smaller sum than the paper's objective."""
    best = brute_force(problem, floor)
    assert best[1] >= brute_force(problem)[1]
    auto = solve(problem, SolveOptions(method="auto", time_limit_s=10, fairness_floor=floor))
    assert check_solution(problem, auto) == []
    assert auto.status == "optimal" and _floored(problem, auto) == best
    fast = solve_fast(problem, fairness_floor=floor)
    assert check_solution(problem, fast) == []
    assert _floored(problem, fast)[:2] <= best[:2]
    if fast.status == "optimal":
        assert _floored(problem, fast) == best


@SLOW
@given(problems(max_jobs=4))
def test_the_mip_with_a_fairness_floor_matches_brute_force(problem: Problem) -> None:
    sol = solve_mip(problem, time_limit_s=10, fairness_floor=0.5)
    assert sol.status == "optimal" and check_solution(problem, sol) == []
    assert _floored(problem, sol) == brute_force(problem, 0.5)


def test_a_fairness_floor_outside_0_to_1_is_refused() -> None:
    for floor in (0.0, -0.5, 1.5):
        with pytest.raises(InputError, match="fairness_floor"):
            SolveOptions(fairness_floor=floor)


def _random_problem(rng: random.Random, n_jobs: int, nodes: int) -> Problem:
    jobs = []
    for k in range(n_jobs):
        base = rng.uniform(100, 1000)
        counts = sorted(rng.sample([1, 2, 4, 8], rng.randint(1, 3)))
        opts = [Option(g, base / g ** rng.uniform(0.3, 0.95)) for g in counts]
        if counts[0] == 1 and rng.random() < 0.5:
            opts.append(
                Option(
                    1,
                    base / 0.9,
                    shared=True,
                    util=rng.uniform(0.2, 0.7),
                    mem_gb=rng.uniform(5, 45),
                )
            )
        jobs.append(JobRequest(f"j{k}", tuple(opts), weight=rng.choice([1.0, 1.0, 2.0])))
    return Problem(Cluster(gpus=4 * nodes, gpus_per_node=4, gpu_mem_gb=80), tuple(jobs))


def test_fast_and_mip_agree_on_medium_instances() -> None:
    rng = random.Random(7)
    for n_jobs, nodes in [(6, 2), (10, 2), (14, 4), (20, 4), (30, 4)]:
        problem = _random_problem(rng, n_jobs, nodes)
        fast = solve(problem, SolveOptions(method="auto"))
        ref = solve_mip(problem, time_limit_s=30)
        assert ref.status == "optimal"
        assert check_solution(problem, fast) == []
        assert _key(problem, fast) == _key(problem, ref)


def test_pairs_obey_both_rules_of_eq8() -> None:
    # a/c are compute-heavy (util 0.7), b/d memory-heavy (60 GB): a+c breaks the
    # utilization rule, b+d the memory rule (x 1.1), the cross pairs fit.
    def shared(util: float, mem: float) -> Option:
        return Option(1, 100.0, shared=True, util=util, mem_gb=mem)

    jobs = (
        JobRequest("a", (Option(1, 90.0), shared(0.7, 10))),
        JobRequest("b", (Option(1, 90.0), shared(0.2, 60))),
        JobRequest("c", (Option(1, 90.0), shared(0.7, 10))),
        JobRequest("d", (Option(1, 90.0), shared(0.2, 60))),
    )
    problem = Problem(Cluster(gpus=2, gpus_per_node=2, gpu_mem_gb=80), jobs)
    t, _, pairs = max_min_threshold(problem)
    assert t == round(0.9 * SCORE_SCALE)
    assert {frozenset(p) for p in pairs} in (
        {frozenset("ab"), frozenset("cd")},
        {frozenset("ad"), frozenset("bc")},
    )
    sol = solve_fast(problem)
    assert sol.status == "optimal" and sol.gpus_used == 2
    assert check_solution(problem, sol) == []
    # one more GB on b and d and no pair fits b or d: only 1 + 2 jobs can run.
    heavier = Problem(
        problem.cluster,
        tuple(
            JobRequest(j.id, (j.options[0], shared(j.options[1].util, j.options[1].mem_gb + 13)))
            if j.id in "bd"
            else j
            for j in jobs
        ),
    )
    assert max_min_threshold(heavier)[0] == 0


@FAST
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20))
def test_max_pairs_is_a_maximum_matching(edges: list[tuple[int, int]]) -> None:
    adj = np.zeros((8, 8), dtype=bool)
    for a, b in edges:
        if a != b:
            adj[a, b] = adj[b, a] = True
    pairs, exact = max_pairs(adj)
    assert exact
    used = [v for p in pairs for v in p]
    assert len(used) == len(set(used)) and all(adj[a, b] for a, b in pairs)
    clean = [(a, b) for a, b in edges if a != b]
    assert len(pairs) == max_matching(clean, frozenset(range(8)))


def test_partitioned_solution_is_feasible_and_close() -> None:
    rng = random.Random(3)
    problem = _random_problem(rng, 40, 8)
    whole = solve(problem, SolveOptions(method="fast"))
    parts = solve(problem, SolveOptions(method="fast", partition_gpus=8, workers=2))
    assert parts.notes[0].startswith("partitioned into 4")
    assert check_solution(problem, parts) == []
    assert parts.sum_share <= whole.sum_share + 1e-9
    assert parts.sum_share >= 0.8 * whole.sum_share


def test_requests_larger_than_a_node_must_be_whole_nodes() -> None:
    job = JobRequest("j", (Option(2, 100.0), Option(6, 10.0), Option(8, 20.0)))
    problem = Problem(Cluster(gpus=8, gpus_per_node=4, gpu_mem_gb=80), (job,))
    assert [problem.usable(job, i) for i in range(3)] == [True, False, True]
    assert solve(problem).choices["j"].gpus == 8  # 6 GPUs would be faster but is not offered


def test_warm_start_is_the_current_allocation_when_it_fits() -> None:
    from icefrog_slurm.core.solver import Holding
    from icefrog_slurm.core.solver.mip import current_picks

    def job(i: str, cur: int) -> JobRequest:
        return JobRequest(i, (Option(1, 90.0), Option(2, 50.0)), current=Holding(cur))

    fits = Problem(Cluster(gpus=4, gpus_per_node=4, gpu_mem_gb=80), (job("a", 2), job("b", 1)))
    assert current_picks(fits) == ({"a": 1, "b": 0}, [])
    over = Problem(Cluster(gpus=2, gpus_per_node=2, gpu_mem_gb=80), (job("a", 2), job("b", 1)))
    assert current_picks(over) is None
    sol = solve_mip(fits)
    assert sol.changes == 1 and sol.status == "optimal"  # b grows to 2, a keeps its 2


def test_partitions_keep_running_jobs_with_their_nodes() -> None:
    from icefrog_slurm.core.solver import Holding
    from icefrog_slurm.core.solver.partition import split

    running = JobRequest("r", (Option(4, 10.0),), current=Holding(4, nodes=(("node4", 4),)))
    others = tuple(JobRequest(f"n{i}", (Option(2, 10.0),)) for i in range(6))
    problem = Problem(Cluster(gpus=16, gpus_per_node=4, gpu_mem_gb=80), (running, *others))
    parts = split(problem, 8)
    assert [p.cluster.node_names for p in parts] == [("node1", "node2"), ("node3", "node4")]
    assert "r" in {j.id for j in parts[1].jobs}
    assert sorted(j.id for p in parts for j in p.jobs) == sorted(j.id for j in problem.jobs)
    assert abs(len(parts[0].jobs) - len(parts[1].jobs)) <= 2


def test_a_memo_re_solves_only_the_partitions_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from icefrog_slurm.core.solver import api

    rng = random.Random(5)
    problem = _random_problem(rng, 40, 8)
    settings = SolveOptions(method="fast", partition_gpus=8)
    solved: list[Problem] = []
    real = api.solve_one
    monkeypatch.setattr(api, "solve_one", lambda p, s: solved.append(p) or real(p, s))
    memo: api.Memo = {}
    first = solve(problem, settings, memo)
    assert len(solved) == 4 and first.notes[0].startswith("partitioned into 4")
    job = problem.jobs[0]
    used = first.choices[job.id].index
    banned = replace(problem, forbidden=frozenset({(job.id, used if used >= 0 else 0)}))
    again = solve(banned, settings, memo)
    assert len(solved) == 5  # only job 0's group again
    assert job.id in {j.id for j in solved[-1].jobs} and solved[-1].forbidden == banned.forbidden
    assert again.choices == solve(banned, settings).choices  # same answer as without a memo
    assert again.choices[job.id].index != used or used < 0


def _philly_shaped(rng: random.Random, n_jobs: int, gpus: int, shared_p: float) -> Problem:
    """A round shaped like benchmarks/solver.py's Philly instances: mostly 1-2 GPU jobs with
    g / (1 + s (g - 1)) scaling, counts g0/4..2 g0, and a shared option (lambda 0.9) on a
    ``shared_p`` fraction of the jobs that may run on one GPU; some jobs already running."""
    jobs = []
    for k in range(n_jobs):
        g0 = rng.choice([1, 1, 1, 1, 2, 2, 4, 8, 16])
        s = rng.uniform(0.02, 0.3)

        def x(g: int, s: float = s) -> float:
            return g / (1 + s * (g - 1))

        work, age = rng.uniform(600, 20000) * x(g0), rng.uniform(0, 3 * 3600)
        counts = [g for g in (1, 2, 4, 8, 16, 32) if g0 / 4 <= g <= 2 * g0]
        opts = [Option(g, age + work / x(g)) for g in counts]
        if counts[0] == 1 and rng.random() < shared_p:
            util, mem = rng.uniform(0.2, 0.7), rng.uniform(5, 50)
            opts.append(Option(1, age + work / (0.9 * x(1)), True, util, mem))
        current = None
        if rng.random() < 0.3:
            pick = rng.choice(opts)
            current = Holding(pick.gpus, pick.shared)
        weight = rng.choice([1.0, 1.0, 1.0, 1.25, 2.0])
        jobs.append(JobRequest(f"j{k}", tuple(opts), weight=weight, current=current))
    return Problem(Cluster(gpus=gpus, gpus_per_node=4, gpu_mem_gb=80), tuple(jobs))


def test_fast_and_auto_equal_cbc_on_random_and_philly_shaped_rounds() -> None:
    """Many rounds, the objective (min, sum, changes) of CBC's proven optimum against the
    fast path's (whenever it says optimal) and auto's (always optimal)."""
    rng = random.Random(11)
    cases = [_random_problem(rng, n, nodes) for n, nodes in [(12, 2), (24, 4), (40, 6)] * 4]
    cases += [_philly_shaped(rng, n, g, p) for n, g, p in [(30, 12, 0.9), (60, 24, 1.0)] * 4]
    cases += [_philly_shaped(rng, 120, 48, p) for p in (0.6, 0.9, 1.0)]
    proven = 0
    for problem in cases:
        ref = solve_mip(problem, time_limit_s=60)
        assert ref.status == "optimal"
        fast = solve_fast(problem)
        auto = solve(problem, SolveOptions(method="auto", time_limit_s=60))
        assert check_solution(problem, fast) == [] and check_solution(problem, auto) == []
        assert auto.status == "optimal" and _key(problem, auto) == _key(problem, ref)
        assert _key(problem, fast)[0] == _key(problem, ref)[0]  # stage 1 is always exact
        if fast.status == "optimal":
            proven += 1
            assert _key(problem, fast) == _key(problem, ref)
    assert proven >= len(cases) // 2  # the exact path answers most rounds without CBC


def test_shared_options_that_can_pair_with_nobody_are_proven_by_the_fast_path() -> None:
    """Every shared option uses 0.8 of a GPU: no two may share (eq 8). The DP charges each a
    whole GPU from the start, so its bound is attained and no CBC is needed."""
    jobs = tuple(
        JobRequest(
            f"j{k}",
            (
                Option(1, 1800.0),
                Option(2, 1300.0),
                Option(4, 960.0),
                Option(1, 1970.0, True, 0.8, 2),
            ),
        )
        for k in range(30)
    )
    problem = Problem(Cluster(gpus=12, gpus_per_node=4, gpu_mem_gb=80), jobs)
    fast = solve_fast(problem)
    assert fast.status == "optimal" and fast.bound == fast.sum_share
    assert _key(problem, fast) == _key(problem, solve_mip(problem, time_limit_s=30))
