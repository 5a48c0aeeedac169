"""Placement of IceShare counts onto nodes, and the re-solve around fragmentation."""

from __future__ import annotations

from collections.abc import Callable

from icefrog_slurm.core.placement import place, solve_and_place
from icefrog_slurm.core.solver import (
    WAIT,
    Choice,
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


def _solution(choices: dict[str, Choice]) -> Solution:
    return Solution("optimal", choices, 0.0, 0.0, 0, 0, "test")


def _excl(g: int) -> Choice:
    return Choice(index=0, gpus=g, shared=False, share=1.0)


def _cluster(nodes: int) -> Cluster:
    return Cluster(gpus=4 * nodes, gpus_per_node=4, gpu_mem_gb=80)


def test_small_jobs_best_fit_and_large_jobs_whole_nodes() -> None:
    jobs = tuple(
        JobRequest(i, (Option(g, 10.0),))
        for i, g in [("big", 8), ("three", 3), ("one", 1), ("two", 2)]
    )
    problem = Problem(_cluster(4), jobs)
    sol = _solution({"big": _excl(8), "three": _excl(3), "one": _excl(1), "two": _excl(2)})
    pl = place(problem, sol)
    assert pl.unplaced == ()
    assert pl.counts("big") == {"node1": 4, "node2": 4}
    assert pl.counts("three") == {"node3": 3}
    # best fit: the 2 goes to the empty node4 (node3 has 1 free), then the 1 fills node3
    assert pl.counts("two") == {"node4": 2}
    assert pl.counts("one") == {"node3": 1}
    used = [(n, i) for g in pl.gpus.values() for n, idx in g for i in idx]
    assert len(used) == len(set(used)) == 14


def test_running_jobs_stay_when_their_count_is_unchanged() -> None:
    stay = JobRequest("stay", (Option(2, 10.0),), current=Holding(2, nodes=(("node1", 2),)))
    grown = JobRequest(
        "grown", (Option(1, 10.0), Option(2, 5.0)), current=Holding(1, nodes=(("node2", 1),))
    )
    big = JobRequest("big", (Option(4, 10.0),))
    problem = Problem(_cluster(2), (stay, grown, big))
    sol = solve(problem)
    assert [sol.choices[j].gpus for j in ("stay", "grown", "big")] == [2, 2, 4]
    assert sol.changes == 1
    pl = place(problem, sol)
    # kept on node1 although largest-first best fit would have put big there first
    assert pl.counts("stay") == {"node1": 2}
    assert pl.counts("big") == {"node2": 4}
    assert pl.counts("grown") == {"node1": 2}


def test_shared_pairs_land_on_one_gpu() -> None:
    def job(i: str) -> JobRequest:
        return JobRequest(i, (Option(1, 90.0), Option(1, 100.0, shared=True, util=0.4, mem_gb=30)))

    problem = Problem(
        Cluster(gpus=2, gpus_per_node=2, gpu_mem_gb=80), tuple(job(i) for i in "abcd")
    )
    sol, pl, _ = solve_and_place(problem, solve)
    assert check_solution(problem, sol) == []
    assert all(c.shared and c.partner for c in sol.choices.values())
    for jid, ch in sol.choices.items():
        assert ch.partner is not None
        assert pl.gpus[jid] == pl.gpus[ch.partner]
    assert len({pl.gpus[j] for j in "abcd"}) == 2


def test_fragmentation_forbids_the_option_and_re_solves() -> None:
    # 3 + 3 + 2 = 8 GPUs fit the count, but two 4-GPU nodes then have 1 + 1 free:
    # c's 2-GPU option cannot be placed, so the round is re-solved without it.
    jobs = (
        JobRequest("a", (Option(3, 100.0),)),
        JobRequest("b", (Option(3, 100.0),)),
        JobRequest("c", (Option(1, 200.0), Option(2, 100.0))),
    )
    problem = Problem(_cluster(2), jobs)
    first = solve(problem)
    assert first.choices["c"].gpus == 2
    assert place(problem, first).unplaced == ("c",)
    sol, pl, final = solve_and_place(problem, lambda p: solve(p, SolveOptions(method="mip")))
    assert final.forbidden == frozenset({("c", 1)})
    assert sol.choices["c"].gpus == 1 and pl.unplaced == ()
    assert sorted(pl.counts("c").values()) == [1]


def test_waiting_jobs_get_no_nodes() -> None:
    problem = Problem(_cluster(1), (JobRequest("w", (Option(4, 1.0),)),))
    sol = _solution({"w": Choice(index=WAIT, gpus=0, shared=False, share=0.0)})
    assert place(problem, sol).counts("w") == {}


def _fragmented(e: JobRequest) -> Problem:
    """Four running 3-GPU jobs (they keep their nodes) leave one free GPU on each of four
    4-GPU nodes; ``e`` joins them."""
    fixed = tuple(
        JobRequest(j, (Option(3, 100.0),), current=Holding(3, False, ((node, 3),)))
        for j, node in zip("abcd", _cluster(4).node_names, strict=True)
    )
    return Problem(_cluster(4), (*fixed, e))


def _counting(calls: dict[str, int], method: str) -> Callable[[Problem], Solution]:
    """``solve`` with ``method``, counting its calls in ``calls[method]``."""

    def run(p: Problem) -> Solution:
        calls[method] += 1
        return solve(p, SolveOptions(method=method))

    return run


def test_cheap_solver_steers_the_retries_and_the_answer_is_the_real_solvers() -> None:
    # Four running 3-GPU jobs leave one free GPU on each of four nodes: e's 4-, 3- and 2-GPU
    # options each fail placement in turn. Steered, the fast solver finds that out and
    # the MIP runs twice (the first answer, the final one) instead of four times.
    problem = _fragmented(JobRequest("e", tuple(Option(g, 400.0 / g) for g in (1, 2, 3, 4))))
    calls = {"mip": 0, "fast": 0}  # e's TTA: 4 GPUs best
    plain, plain_pl, plain_final = solve_and_place(problem, _counting(calls, "mip"))
    assert calls == {"mip": 4, "fast": 0} and plain.choices["e"].gpus == 1
    calls.update(mip=0)
    sol, pl, final = solve_and_place(
        problem, _counting(calls, "mip"), steer=_counting(calls, "fast")
    )
    assert calls == {"mip": 2, "fast": 3}
    assert sol.solver == "mip" and pl.unplaced == () and check_solution(final, sol) == []
    assert sol.choices == plain.choices and final.forbidden == plain_final.forbidden
    assert pl.counts("e") == plain_pl.counts("e") and sum(pl.counts("e").values()) == 1


def test_an_unplaceable_count_forbids_the_jobs_larger_counts_in_the_same_retry() -> None:
    # Four running 3-GPU jobs leave one free GPU on each 4-GPU node. e prefers 2 GPUs, then
    # a whole node: neither can be placed, and one retry (not two) finds that out.
    problem = _fragmented(JobRequest("e", (Option(1, 400.0), Option(2, 150.0), Option(4, 200.0))))
    assert solve(problem).choices["e"].gpus == 2
    calls = []

    def mip(p: Problem) -> Solution:
        calls.append(p.forbidden)
        return solve(p, SolveOptions(method="mip"))

    sol, pl, final = solve_and_place(problem, mip)
    assert final.forbidden == frozenset({("e", 1), ("e", 2)}) and len(calls) == 2
    assert sol.choices["e"].gpus == 1 and pl.unplaced == ()


def test_after_max_solves_the_steering_solvers_placed_answer_stands() -> None:
    problem = _fragmented(JobRequest("e", tuple(Option(g, 400.0 / g) for g in (1, 2, 3, 4))))
    calls = {"mip": 0, "fast": 0}
    sol, pl, final = solve_and_place(
        problem, _counting(calls, "mip"), steer=_counting(calls, "fast"), max_solves=1
    )
    assert calls["mip"] == 1 and sol.solver == "fast"  # the MIP's one answer did not place
    assert pl.unplaced == () and check_solution(final, sol) == [] and sol.choices["e"].gpus == 1
