"""Pairing shared jobs onto GPUs: a maximum matching on the admissible-pair graph.

Jobs choosing "shared" cost one GPU alone and one GPU per pair, so the GPUs they need are
``|S| - nu(S)`` where ``nu`` is the maximum matching of the graph whose edges are the
admissible pairs (eq 8: memory x 1.1 and utilization rules). Two predicates (memory and
utilization) make that graph general, so a greedy is not exact in general: we run a
min-degree greedy first and stop when it is provably enough (a perfect or near-perfect
matching, or as many pairs as the caller needs), and otherwise call Edmonds' blossom
algorithm (networkx ``max_weight_matching`` with ``maxcardinality``), which is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np
import numpy.typing as npt

from icefrog_slurm.core.solver.problem import Cluster, Option

BoolMatrix = npt.NDArray[np.bool_]


def admissible_matrix(cluster: Cluster, options: Sequence[Option]) -> BoolMatrix:
    """``adj[i, j]``: options i and j may share a GPU (eq 8; see ``Cluster.admissible``)."""
    n = len(options)
    if cluster.max_jobs_per_gpu < 2 or n < 2:
        return np.zeros((n, n), dtype=bool)
    mem = np.array([o.mem_gb for o in options])
    util = np.array([o.util for o in options])
    adj: BoolMatrix = (mem[:, None] + mem[None, :]) * cluster.mem_safety <= (
        cluster.gpu_mem_gb + 1e-9
    )
    adj &= util[:, None] + util[None, :] <= 1.0 + 1e-9
    np.fill_diagonal(adj, False)
    return adj


def greedy_pairs(adj: BoolMatrix) -> list[tuple[int, int]]:
    """Min-degree greedy matching: repeatedly pair the unmatched vertex with fewest
    unmatched neighbours to its neighbour with fewest. A maximal matching, not always
    maximum."""
    n = adj.shape[0]
    if n < 2:
        return []
    alive = np.ones(n, dtype=bool)
    work = adj.copy()
    degree = work.sum(axis=1)
    pairs: list[tuple[int, int]] = []
    while True:
        cand = np.where(alive & (degree > 0), degree, n + 1)
        i = int(np.argmin(cand))
        if cand[i] > n:
            return pairs
        nbrs = np.where(work[i], degree, n + 1)
        j = int(np.argmin(nbrs))
        pairs.append((min(i, j), max(i, j)))
        for v in (i, j):
            alive[v] = False
            degree -= work[v]
            work[v, :] = False
            work[:, v] = False
        degree[[i, j]] = 0


def exact_pairs(adj: BoolMatrix) -> list[tuple[int, int]]:
    """A maximum-cardinality matching (Edmonds' blossom algorithm via networkx)."""
    graph = nx.Graph()
    graph.add_nodes_from(range(adj.shape[0]))
    rows, cols = np.nonzero(np.triu(adj, 1))
    graph.add_edges_from(zip(rows.tolist(), cols.tolist(), strict=True))
    matching = nx.max_weight_matching(graph, maxcardinality=True)
    return sorted((min(a, b), max(a, b)) for a, b in matching)


def max_pairs(adj: BoolMatrix, *, need: int | None = None) -> tuple[list[tuple[int, int]], bool]:
    """Pairs for the shared jobs and whether the count is proven maximum.

    Returns the greedy result when it is maximum by counting (``2*pairs >= n - 1``) or when
    it already has ``need`` pairs (``exact`` then says only "enough"); otherwise blossom.
    """
    n = adj.shape[0]
    if n < 2:
        return [], True
    pairs = greedy_pairs(adj)
    if 2 * len(pairs) >= n - 1:
        return pairs, True
    if need is not None and len(pairs) >= need:
        return pairs, False
    return exact_pairs(adj), True
