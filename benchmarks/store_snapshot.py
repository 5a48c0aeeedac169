"""How long the state store's part of a controller tick takes with many jobs.

Fills a fresh database with JOBS active jobs (each with profile samples, per-layer gradient
statistics of several epochs, metrics and a history of INTENTS done intents), then times:
``store.snapshot()`` (a fresh read: every row read and decoded, each job's last done intent
included), the snapshot a tick reads in its own transaction once nothing changed since the
last (the store's cache, store/snapcache.py, re-reads only changed rows),
and one tick transaction (that snapshot, a round with an allocation for every job and an
intent for a tenth of them). Prints the figures; asserts nothing.

    .venv/bin/python -m benchmarks.store_snapshot                 # SQLite
    .venv/bin/python -m benchmarks.store_snapshot --postgres      # a throwaway Postgres
    .venv/bin/python -m benchmarks.store_snapshot --url URL       # an existing database
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import update

from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.protocol import GradStats, MetricReport
from icefrog_slurm.store.migrate import upgrade
from icefrog_slurm.store.models import IntentRow
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import sample, spec


@contextmanager
def database(args: argparse.Namespace) -> Iterator[str]:
    if args.url:
        yield args.url
    elif args.postgres:
        from tests.support.postgres import running_server

        with running_server() as server:
            server.janitor("bench").init()
            yield server.url("bench")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{Path(tmp) / 'bench.db'}"


def fill(
    store: SqlStore,
    args: argparse.Namespace,
    *,
    slurm_ids: Sequence[str] = (),
    owner_uid: int | None = None,
) -> list[int]:
    """``args.jobs`` active jobs with their samples, statistics and metrics; their Slurm ids
    are ``slurm_ids`` when given (else 10000, 10001, ...), their owners ``owner_uid`` (else
    50 users in turn)."""
    layers = args.layers
    job_spec = spec(
        layer_flops=(1.0,) * layers, layer_param_bytes=(1.0,) * layers, layer_boundaries=()
    )
    ids = []
    with store.transaction() as tx:
        for j in range(args.jobs):
            slurm_id = slurm_ids[j] if slurm_ids else str(10000 + j)
            job_id = tx.create_job(
                name=f"job{j}",
                owner_uid=1000 + j % 50 if owner_uid is None else owner_uid,
                owner_user="u",
                slurm_job_id=slurm_id,
                spec=job_spec,
                now=0.0,
            )
            measured = [sample(1 + i % 4, i % layers) for i in range(args.samples)]
            tx.add_profile_samples(job_id=job_id, slurm_job_id=slurm_id, samples=measured, now=1.0)
            for e in range(args.epochs):
                stats = GradStats(e, 0, (1.0,) * layers, (2.0,) * layers)
                tx.put_grad_stats(job_id=job_id, stats=stats, now=2.0)
                tx.put_metric(job_id=job_id, metric=MetricReport(e, "val_acc", 0.1 * e), now=2.0)
            ids.append(job_id)
        target = {"gres": "gpu:1", "num_nodes": 1, "nodes": ["node1"]}
        for k in range(args.intents):  # each job's history of moves, all done
            action = ("start", "change", "stop", "requeue")[k % 4]
            tx.add_intents(intents=[(j, action, {"target": target}) for j in ids], now=3.0 + k)
        tx._s.execute(update(IntentRow).values(status="done"))
    return ids


def timed(fn: Callable[[], object], repeat: int, cpu: list[float] | None = None) -> float:
    """The median wall time of ``repeat`` calls; with ``cpu``, their median process CPU time
    (which other load does not inflate) is appended to it."""
    out, used = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append(time.perf_counter() - t0)
        used.append(time.process_time() - c0)
    if cpu is not None:
        cpu.append(statistics.median(used))
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("--postgres", action="store_true")
    p.add_argument("--jobs", type=int, default=2400)
    p.add_argument("--layers", type=int, default=50)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--intents", type=int, default=20, help="done intents a job (its history)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with database(args) as url:
        upgrade(url)
        store = SqlStore(url)
        t0 = time.perf_counter()
        ids = fill(store, args)
        fill_s = time.perf_counter() - t0
        if store.engine.dialect.name == "postgresql":  # table statistics, as autovacuum keeps
            with store.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
        snap_s = timed(store.snapshot, args.repeat)

        def cached() -> None:
            with store.transaction(consistent=True) as tx:
                tx.snapshot()

        cached()  # the first read fills the store's cache
        cached_s = timed(cached, args.repeat)
        rounds = iter(range(1, 10**6))

        def tick() -> None:
            with store.transaction() as tx:
                snap = tx.snapshot()
                n = next(rounds)
                allocs = [Allocation(v.job.id, 1, 64, 0) for v in snap.jobs]
                tx.record_round(
                    round_no=n, now=n, policy="bench", capacity_gpus=960, allocations=allocs
                )
                for job_id in ids[::10]:
                    tx.add_intent(
                        action="resize", params={"gpus": 2}, now=n, job_id=job_id, round_no=n
                    )

        tick_cpu: list[float] = []
        tick_s = timed(tick, args.repeat, tick_cpu)
        store.close()
    print(
        f"backend={url.split(':', 1)[0]} jobs={args.jobs} layers={args.layers} "
        f"epochs={args.epochs} samples/job={args.samples}"
    )
    print(f"fill (one transaction): {fill_s:.2f} s")
    print(f"snapshot: median {snap_s:.3f} s of {args.repeat}")
    print(f"snapshot in a tick, nothing changed (cached): median {cached_s:.3f} s")
    print(
        f"tick transaction (snapshot + round of {len(ids)} allocations + {len(ids[::10])} "
        f"intents, commit): median {tick_s:.3f} s of {args.repeat} (CPU {tick_cpu[0]:.3f} s)"
    )


if __name__ == "__main__":
    main()
