"""Placement: mapping the solver's GPU counts onto nodes and GPU indices (spec section 9.6).

The IceShare ILP decides only counts and the shared/exclusive kind; this module turns them
into nodes, in this order:

1. A running job whose chosen count and kind equal its current ones stays exactly where it
   is (no checkpoint-restart), on the lowest free GPU indices of its nodes.
2. The other exclusive jobs, largest first: a request larger than a node takes whole free
   nodes (``gpus / gpus_per_node`` of them; the solver offers only multiples); a request of
   at most a node goes on ONE node, best fit (the node with the fewest free GPUs that still
   fit it; ties by node order).
3. Each shared GPU (a pair, or a shared job alone) takes one GPU index, preferring a node
   where one of its jobs runs now, else best fit; both jobs of a pair get the same index.

When fragmentation leaves a count unplaceable (e.g. 3+3+2 GPUs on two 4-GPU nodes), the job
is reported in ``unplaced``; :func:`solve_and_place` then forbids that (job, option), and the
job's larger exclusive options, and re-solves, until everything chosen is placed. Running
jobs are never moved to make room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from icefrog_slurm.core.solver.problem import WAIT, Choice, Problem, Solution

NodeGpus = tuple[tuple[str, tuple[int, ...]], ...]  # (node, GPU indices) per node used


@dataclass(frozen=True)
class Placement:
    """``gpus``: job id -> its GPUs per node; ``unplaced``: jobs whose count did not fit."""

    gpus: Mapping[str, NodeGpus]
    unplaced: tuple[str, ...] = ()

    def counts(self, job_id: str) -> dict[str, int]:
        return {node: len(idx) for node, idx in self.gpus.get(job_id, ())}


class _Free:
    """Free GPU indices per node, in node order."""

    def __init__(self, names: tuple[str, ...], per_node: int) -> None:
        self.per_node = per_node
        self.free: dict[str, list[int]] = {n: list(range(per_node)) for n in names}

    def take(self, node: str, n: int) -> tuple[int, ...]:
        got, self.free[node] = self.free[node][:n], self.free[node][n:]
        return tuple(got)

    def best_fit(self, n: int, prefer: tuple[str, ...] = ()) -> str | None:
        for node in prefer:
            if len(self.free.get(node, ())) >= n:
                return node
        fits = [(len(f), i, node) for i, (node, f) in enumerate(self.free.items()) if len(f) >= n]
        return min(fits)[2] if fits else None

    def whole_nodes(self, count: int) -> list[str] | None:
        empty = [node for node, f in self.free.items() if len(f) == self.per_node]
        return empty[:count] if len(empty) >= count else None


def _keep(problem: Problem, solution: Solution, free: _Free) -> dict[str, NodeGpus]:
    kept: dict[str, NodeGpus] = {}
    for job in problem.jobs:
        ch = solution.choices[job.id]
        cur = job.current
        if ch.index == WAIT or ch.shared or cur is None or not job.keeps(ch.index):
            continue
        if sum(n for _, n in cur.nodes) != ch.gpus:
            continue
        if all(len(free.free.get(node, ())) >= n for node, n in cur.nodes):
            kept[job.id] = tuple((node, free.take(node, n)) for node, n in cur.nodes)
    return kept


def _place_exclusive(free: _Free, gpus: int) -> NodeGpus | None:
    if gpus > free.per_node:
        nodes = free.whole_nodes(gpus // free.per_node)
        return None if nodes is None else tuple((n, free.take(n, free.per_node)) for n in nodes)
    node = free.best_fit(gpus)
    return None if node is None else ((node, free.take(node, gpus)),)


def place(problem: Problem, solution: Solution) -> Placement:
    """Nodes and GPU indices for every running choice of ``solution`` (module docstring)."""
    free = _Free(problem.cluster.node_names, problem.cluster.gpus_per_node)
    out = _keep(problem, solution, free)
    unplaced: list[str] = []
    jobs = {j.id: j for j in problem.jobs}
    exclusive = [
        (jid, c)
        for jid, c in solution.choices.items()
        if c.gpus and not c.shared and jid not in out
    ]
    for jid, ch in sorted(exclusive, key=lambda jc: -jc[1].gpus):
        got = _place_exclusive(free, ch.gpus)
        if got is None:
            unplaced.append(jid)
        else:
            out[jid] = got
    for unit in _shared_units(solution.choices):
        cur = [jobs[j].current for j in unit]
        prefer = tuple(node for c in cur if c is not None and c.shared for node, _ in c.nodes)
        node = free.best_fit(1, prefer)
        if node is None:
            unplaced.extend(unit)
            continue
        idx = free.take(node, 1)
        for jid in unit:
            out[jid] = ((node, idx),)
    return Placement(gpus=out, unplaced=tuple(unplaced))


def _shared_units(choices: Mapping[str, Choice]) -> list[tuple[str, ...]]:
    units: list[tuple[str, ...]] = []
    for jid, c in choices.items():
        if c.shared and (c.partner is None or jid < c.partner):
            units.append((jid,) if c.partner is None else (jid, c.partner))
    return units


def solve_and_place(
    problem: Problem,
    solve: Callable[[Problem], Solution],
    steer: Callable[[Problem], Solution] | None = None,
    max_solves: int = 3,
) -> tuple[Solution, Placement, Problem]:
    """Solve, place, and re-solve without each unplaceable (job, option) until all fit.

    ``steer``, a cheaper solver (the fast one when ``solve`` may call the MIP): once a
    solution does not place, the retries that only find out which options cannot be placed
    use it, and ``solve`` runs again when its answer places. On a fragmented cluster this
    takes tens of retries a round; with the MIP in each they were most of a large
    simulation's time. ``solve`` runs at most ``max_solves`` times: when its answer still
    does not place, the steering solver's placed answer stands (at 960 GPUs the MIP's
    answers kept landing on other fragmented counts, 16 MIP runs a round).
    Returns the final solution, its placement and the problem it solved (with the
    ``forbidden`` options). Terminates: every retry forbids at least one more option, and
    waiting always places.
    """
    solution = solve(problem)
    placement = place(problem, solution)
    solves = 1
    while placement.unplaced:
        problem = _forbid(problem, solution, placement)
        while steer is not None:
            cheap = steer(problem)
            cheap_placement = place(problem, cheap)
            if not cheap_placement.unplaced:
                if solves >= max_solves:
                    return cheap, cheap_placement, problem
                break
            problem = _forbid(problem, cheap, cheap_placement)
        solution = solve(problem)
        solves += 1
        placement = place(problem, solution)
    return solution, placement, problem


def _forbid(problem: Problem, solution: Solution, placement: Placement) -> Problem:
    """Forbid each unplaced choice and, for an exclusive one, the job's larger exclusive
    options too: where ``g`` GPUs found no node with ``g`` free (or not enough empty
    nodes), more GPUs find none either, and trying them one retry at a time cost hundreds
    of retries in a fragmented 960-GPU round."""
    jobs = {j.id: j for j in problem.jobs}
    banned: set[tuple[str, int]] = set()
    for jid in placement.unplaced:
        ch = solution.choices[jid]
        banned.add((jid, ch.index))
        if not ch.shared:
            opts = jobs[jid].options
            banned |= {(jid, i) for i, o in enumerate(opts) if not o.shared and o.gpus >= ch.gpus}
    return replace(problem, forbidden=problem.forbidden | banned)
