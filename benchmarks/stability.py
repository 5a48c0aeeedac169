"""How often a policy undoes its own moves, and how often it shares a GPU, on one simulation.

Runs ``icefrog simulate``'s engine for each policy with its store kept, then reads the
recorded rounds (``round_allocations``: one row a job a round) and prints per policy:

- average JCT (h) of the finished jobs, reallocations (restarts after the first start);
- GPU-count changes: a job decided a different GPU count (shared counts as its own value,
  ``1s``) than in the round before, the job running in both rounds (a start from waiting
  or a stop to waiting is not a change of a running job's count);
- of them undone: the round after, the job is back at the count it left;
- shared job-rounds: rounds in which a job was decided a shared GPU, of the job-rounds with
  any GPU;
- the policy's solve time a round (``PolicyResult.solve_s``: solver and placement).

Usage (the 48-GPU 1x trace of docs/evaluation.md):
    .venv/bin/icefrog trace sample --load 1 --seed 1 --jobs 120 --out W.csv
    nice -n 10 .venv/bin/python -m benchmarks.stability --workload W.csv --gpus 48 --seed 1 \\
        --policy icefrog,pollux+ [--set controller.move_gain_factor=0]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from icefrog_slurm.commands.simulate import adapts_batch, make_policy
from icefrog_slurm.settings import Settings, apply_overrides
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import read_workload


@dataclass(frozen=True)
class Moves:
    """Counts over one run's recorded rounds (module docstring)."""

    changes: int
    undone: int
    shared_rounds: int
    running_rounds: int
    grows: int = 0  # changes to more GPUs (a shared GPU counts half of one)
    grows_undone: int = 0


def count_moves(rows: list[tuple[int, int, int, bool]]) -> Moves:
    """``rows``: (round, job, gpus, shared), any order -> the counts of the module doc."""
    by_job: dict[int, list[tuple[int, str]]] = defaultdict(list)
    shared_rounds = running_rounds = 0
    for round_no, job, gpus, shared in sorted(rows):
        value = "1s" if shared and gpus else str(gpus)
        by_job[job].append((round_no, value))
        running_rounds += gpus > 0
        shared_rounds += bool(shared and gpus)
    changes = undone = grows = grows_undone = 0
    for seq in by_job.values():
        for i in range(1, len(seq)):
            (r0, a), (r1, b) = seq[i - 1], seq[i]
            if r1 != r0 + 1 or a == b or "0" in (a, b):
                continue
            changes += 1
            grow = _gpus(b) > _gpus(a)
            grows += grow
            if i + 1 < len(seq) and seq[i + 1][0] == r1 + 1 and seq[i + 1][1] == a:
                undone += 1
                grows_undone += grow
    return Moves(changes, undone, shared_rounds, running_rounds, grows, grows_undone)


def _gpus(value: str) -> float:
    return 0.5 if value == "1s" else float(value)


def read_rows(db: Path) -> list[tuple[int, int, int, bool]]:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT round_no, job_id, gpus, shared FROM round_allocations")
        return [(int(r), int(j), int(g), bool(s)) for r, j, g, s in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, required=True)
    ap.add_argument("--gpus", type=int, default=48)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--policy", default="icefrog,pollux+")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", choices=("paper", "fixed", "tuned"), default="paper",
                    help="as icefrog simulate --batch (default paper)")  # fmt: skip
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one setting, as icefrog simulate --set")  # fmt: skip
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="keep each policy's store in DIR/POLICY/sim.db")  # fmt: skip
    args = ap.parse_args()
    settings = apply_overrides(Settings(), args.set)
    catalog = shipped_catalog()
    workload = read_workload(args.workload, catalog)
    opts = SimOptions(gpus=args.gpus, gpus_per_node=args.gpus_per_node, seed=args.seed)
    print(f"{args.workload} ({len(workload)} jobs), {args.gpus} GPUs, seed {args.seed}, "
          f"batch {args.batch}, set {args.set or '-'}")  # fmt: skip
    print("| policy | avg JCT h | reallocations | GPU-count changes (grows) | undone next "
          "round (grows undone) | shared job-rounds | solve s/round mean, max |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.policy.split(","):
        fixed = args.batch == "fixed" or (
            args.batch == "paper" and not adapts_batch(name, settings)
        )
        with tempfile.TemporaryDirectory(prefix="icefrog-stability-") as scratch:
            folder = scratch
            if args.keep is not None:
                folder = str(args.keep / name)
                Path(folder).mkdir(parents=True, exist_ok=True)
            engine = Engine(
                workload, make_policy(name), settings=settings,
                options=replace(opts, fixed_batch=fixed), catalog=catalog, store_dir=folder,
            )  # fmt: skip
            result = engine.run()
            moves = count_moves(read_rows(Path(folder) / "sim.db"))
        jcts = [j.finish - j.submit for j in result.jobs if j.finish is not None]
        avg = statistics.fmean(jcts) / 3600 if jcts else float("nan")
        realloc = sum(j.reallocations for j in result.jobs)
        solve = [r.solve_s for r in result.rounds]
        undo = moves.undone / moves.changes if moves.changes else 0.0
        print(
            f"| {name} | {avg:.2f} | {realloc} | {moves.changes} ({moves.grows}) "
            f"| {moves.undone} ({undo:.0%}; {moves.grows_undone}) "
            f"| {moves.shared_rounds} of {moves.running_rounds} "
            f"| {statistics.fmean(solve) if solve else 0:.3f}, {max(solve, default=0):.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
