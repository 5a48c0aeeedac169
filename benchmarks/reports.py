"""How long ``icefrog squeue``, ``sacct`` and ``show job`` take over a big store.

Fills a fresh database with JOBS jobs (a tenth finished, the rest running), ROUNDS rounds
that each decide every job (the GPU count changes every 7th round), and one metric an
epoch; then times each command end to end through the real CLI (``main([...])``, output
thrown away): squeue (the latest decision of every active job), sacct over every job
(the whole decision history of each: GPU-hours, restarts) and show job. Prints the
figures; asserts nothing.

    .venv/bin/python -m benchmarks.reports                 # SQLite
    .venv/bin/python -m benchmarks.reports --postgres      # a throwaway Postgres
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

from benchmarks.store_snapshot import database, timed
from icefrog_slurm.cli import main as icefrog
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.protocol import MetricReport
from icefrog_slurm.store.migrate import upgrade
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import spec


def fill(store: SqlStore, args: argparse.Namespace) -> list[int]:
    with store.transaction() as tx:
        ids = [
            tx.create_job(
                name=f"job{j}",
                owner_uid=1000 + j % 50,
                owner_user=f"user{j % 50}",
                slurm_job_id=str(10000 + j),
                spec=spec(),
                now=0.0,
            )
            for j in range(args.jobs)
        ]
        for job_id in ids:
            tx.set_state(job_id=job_id, state="running", now=1.0)
    for r in range(1, args.rounds + 1):
        with store.transaction() as tx:
            allocs = [
                Allocation(j, 1 + (r // 7 + j) % 4, 64, r % 3, nodes=("n1",), psi=0.9, share=1.0)
                for j in ids
            ]
            tx.record_round(
                round_no=r, now=300.0 * r, policy="bench", capacity_gpus=960, allocations=allocs
            )
            if r % 10 == 0:
                for j in ids:
                    tx.put_metric(
                        job_id=j, metric=MetricReport(r // 10, "val_acc", 0.01 * r), now=300.0 * r
                    )
    with store.transaction() as tx:
        for job_id in ids[::10]:
            tx.set_state(job_id=job_id, state="finished", now=300.0 * args.rounds)
    return ids


def run_cli(argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert icefrog(argv) == 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("--postgres", action="store_true")
    p.add_argument("--jobs", type=int, default=2400)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with database(args) as url:
        upgrade(url)
        store = SqlStore(url)
        t0 = time.perf_counter()
        ids = fill(store, args)
        fill_s = time.perf_counter() - t0
        store.close()
        db = ["--db", url]
        figures = {
            "squeue": timed(lambda: run_cli(["squeue", *db]), args.repeat),
            "sacct -S 1970-01-02 (every job)": timed(
                lambda: run_cli(["sacct", *db, "-S", "1970-01-02"]), args.repeat
            ),
            "sacct -j ID": timed(lambda: run_cli(["sacct", *db, "-j", str(ids[5])]), args.repeat),
            "show job ID": timed(lambda: run_cli(["show", "job", str(ids[5]), *db]), args.repeat),
        }
    print(
        f"backend={url.split(':', 1)[0]} jobs={args.jobs} rounds={args.rounds} "
        f"allocation rows={args.jobs * args.rounds}"
    )
    print(f"fill: {fill_s:.1f} s")
    for name, seconds in figures.items():
        print(f"{name}: median {seconds:.3f} s of {args.repeat}")


if __name__ == "__main__":
    main()
