"""``icefrog solve FILE.json``: one IceShare round from a JSON file, printed as JSON.

Reads the cluster and each job's options (docs/solver.md has the schema), solves with the
fast path or the reference MIP, places the counts on nodes (re-solving around fragmentation)
and prints the decision. Bad input exits with code 2 and names the field.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from icefrog_slurm import jsonio
from icefrog_slurm.core.placement import solve_and_place
from icefrog_slurm.core.solver import (
    Cluster,
    Holding,
    JobRequest,
    Option,
    Problem,
    SolveOptions,
    solve,
)
from icefrog_slurm.errors import InputError
from icefrog_slurm.limits import MAX_CLUSTER_GPUS, MAX_GPUS_PER_NODE, MAX_JOB_GPUS
from icefrog_slurm.settings import SolverSettings
from icefrog_slurm.userfiles import load_json_file

TOP = ("gpus", "gpus_per_node", "gpu_mem_gb", "nodes", "max_jobs_per_gpu", "mem_safety", "jobs")
JOB = ("id", "weight", "current", "options")
CURRENT = ("gpus", "shared", "nodes")
OPTION = ("gpus", "tta_s", "shared", "util", "mem_gb")
MAX_TTA_S = 1e9
"""Longest time to accuracy, seconds (about 30 years): larger figures only break the
solver's arithmetic."""
MAX_WEIGHT = 1e6
"""Largest job weight."""
MAX_MEM_GB = 1e6
"""Largest GPU memory, GB."""
MAX_WORKERS = 256
"""Most solver processes."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the problem as JSON ('-' for stdin)")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=30.0,
        metavar="S",
        help="MIP time limit in seconds (per partition)",
    )
    parser.add_argument(
        "--solver",
        choices=("auto", "mip", "fast"),
        default="auto",
        help="auto: fast exact path, MIP fallback; mip: the reference",
    )
    parser.add_argument(
        "--partition-gpus",
        type=int,
        default=0,
        metavar="N",
        help="split clusters larger than N GPUs into partitions (0: never)",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes for partitions")
    parser.add_argument(
        "--fairness-floor",
        type=float,
        default=SolverSettings().fairness_floor,
        metavar="F",
        help="stage 2 keeps every job at F x stage 1's max-min share, in (0, 1] (1: the paper;"
        " default: the controller's, %(default)s)",
    )


def _option(raw: Any, where: str) -> Option:
    obj = jsonio.expect_object(raw, where)
    jsonio.reject_unknown(obj, OPTION, where)
    shared = jsonio.get_bool(obj, "shared", where, default=False)
    return Option(
        gpus=jsonio.get_int(obj, "gpus", where, minimum=1, maximum=1 if shared else MAX_JOB_GPUS),
        tta_s=jsonio.get_number(obj, "tta_s", where, exclusive_minimum=0, maximum=MAX_TTA_S),
        shared=shared,
        util=jsonio.get_number(
            obj, "util", where, minimum=0, maximum=1, default=None if shared else 0.0
        ),
        mem_gb=jsonio.get_number(obj, "mem_gb", where, minimum=0, default=None if shared else 0.0),
    )


def _current(raw: Any, where: str) -> Holding:
    obj = jsonio.expect_object(raw, where)
    jsonio.reject_unknown(obj, CURRENT, where)
    nodes = jsonio.expect_object(obj.get("nodes", {}), f"{where}.nodes")
    return Holding(
        gpus=jsonio.get_int(obj, "gpus", where, minimum=0, maximum=MAX_JOB_GPUS),
        shared=jsonio.get_bool(obj, "shared", where, default=False),
        nodes=tuple(
            (name, jsonio.get_int(nodes, name, f"{where}.nodes", minimum=1, maximum=MAX_JOB_GPUS))
            for name in nodes
        ),
    )


def _job(raw: Any, where: str) -> JobRequest:
    obj = jsonio.expect_object(raw, where)
    jsonio.reject_unknown(obj, JOB, where)
    options = jsonio.get_list(obj, "options", where)
    job_id = jsonio.get_str(obj, "id", where)
    try:
        return JobRequest(
            id=job_id,
            weight=jsonio.get_number(
                obj, "weight", where, default=1.0, exclusive_minimum=0, maximum=MAX_WEIGHT
            ),
            current=_current(obj["current"], f"{where}.current") if "current" in obj else None,
            options=tuple(_option(o, f"{where}.options[{i}]") for i, o in enumerate(options)),
        )
    except InputError as exc:
        if str(exc).startswith(where):
            raise
        raise InputError(
            f"{where} ({job_id}): {str(exc).removeprefix(f'job {job_id}: ')}"
        ) from None


def _node_names(raw: list[Any]) -> tuple[str, ...]:
    for i, name in enumerate(raw):
        if not isinstance(name, str) or not name:
            raise InputError(f"nodes[{i}]: must be a non-empty string")
    return tuple(raw)


def parse_problem(doc: Any) -> Problem:
    """The :class:`Problem` in a JSON document (schema in docs/solver.md)."""
    obj = jsonio.expect_object(doc, "problem")
    jsonio.reject_unknown(obj, TOP, "")
    raw_jobs = jsonio.get_list(obj, "jobs")
    jobs = [_job(j, f"jobs[{i}]") for i, j in enumerate(raw_jobs)]
    seen: dict[str, int] = {}
    for i, job in enumerate(jobs):
        if job.id in seen:
            raise InputError(
                f"jobs[{i}].id: duplicate job id {job.id!r} (also jobs[{seen[job.id]}])"
            )
        seen[job.id] = i
    names = jsonio.get_list(obj, "nodes", required=False)
    cluster = Cluster(
        gpus=jsonio.get_int(obj, "gpus", minimum=0, maximum=MAX_CLUSTER_GPUS),
        gpus_per_node=jsonio.get_int(obj, "gpus_per_node", minimum=1, maximum=MAX_GPUS_PER_NODE),
        gpu_mem_gb=jsonio.get_number(obj, "gpu_mem_gb", exclusive_minimum=0, maximum=MAX_MEM_GB),
        nodes=_node_names(names),
        max_jobs_per_gpu=jsonio.get_int(obj, "max_jobs_per_gpu", default=2, minimum=1, maximum=2),
        mem_safety=jsonio.get_number(obj, "mem_safety", default=1.1, minimum=1.0),
    )
    return Problem(cluster=cluster, jobs=tuple(jobs))


def _fragmentation_notes(final: Problem) -> list[str]:
    jobs = {j.id: j for j in final.jobs}
    return [
        f"{jid}: {jobs[jid].options[i].gpus} GPU(s) could not be placed (fragmentation); "
        "re-solved without that option"
        for jid, i in sorted(final.forbidden)
    ]


def _check_options(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise InputError(f"--time-limit: must be a finite number > 0, got {args.time_limit}")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise InputError(f"--workers: must be within [1, {MAX_WORKERS}], got {args.workers}")
    if not (math.isfinite(args.fairness_floor) and 0 < args.fairness_floor <= 1):
        raise InputError(f"--fairness-floor: must be within (0, 1], got {args.fairness_floor}")
    if not 0 <= args.partition_gpus <= MAX_CLUSTER_GPUS:
        raise InputError(
            f"--partition-gpus: must be within [0, {MAX_CLUSTER_GPUS}], got {args.partition_gpus}"
        )


def run(args: argparse.Namespace) -> int:
    _check_options(args)
    problem = parse_problem(load_json_file(args.file))
    settings = SolveOptions(
        method=args.solver,
        time_limit_s=args.time_limit,
        partition_gpus=args.partition_gpus,
        workers=args.workers,
        fairness_floor=args.fairness_floor,
    )
    began = time.perf_counter()
    solution, placement, final = solve_and_place(problem, lambda p: solve(p, settings))
    elapsed = time.perf_counter() - began
    jobs: dict[str, Any] = {}
    for jid, ch in solution.choices.items():
        entry: dict[str, Any] = {
            "gpus": ch.gpus,
            "shared": ch.shared,
            "share": round(ch.share, 6),
            "nodes": placement.counts(jid),
        }
        if ch.shared:
            node, idx = placement.gpus[jid][0]
            entry["gpu"] = {"node": node, "index": idx[0]}
            entry["partner"] = ch.partner
        jobs[jid] = entry
    out = {
        "status": solution.status,
        "min_share": round(solution.min_share, 6),
        "sum_share": round(solution.sum_share, 6),
        "gpus_used": solution.gpus_used,
        "changes": solution.changes,
        "solver": solution.solver,
        "solve_s": round(elapsed, 4),
        "notes": list(solution.notes) + _fragmentation_notes(final),
        "jobs": jobs,
    }
    print(json.dumps(out, indent=2))
    return 0
