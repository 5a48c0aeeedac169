"""How long a controller tick takes: its own work, with Slurm's calls excluded or included.

``store`` mode (default): a fresh database (SQLite, or a throwaway Postgres with
``--postgres``) holds JOBS active jobs (profile samples, per-layer gradient statistics,
metrics; ``benchmarks/store_snapshot.py``'s filler) on NODES x 4 GPUs. The cluster is the
simulator's in-memory Slurm (``SimCluster``: instant answers), so the figures are the
controller's own work: the tick transaction (snapshot, policy, record: ``tick_s``) and the
reconcile pass (its store writes and the state machine). Three ticks: the first round (every
job held, models fitted for the first time), a pass with nothing due, and a second round.

``slurm`` mode: the real local cluster (``slurm_conf/dev/cluster.sh``, 4 nodes x 4 GPUs)
with ``--jobs`` held icefrog jobs; the same three ticks with every Slurm call included
(squeue poll, sinfo + squeue capacity, scontrol update/release for the jobs started).

    .venv/bin/python -m benchmarks.controller --jobs 2400 --nodes 240          # SQLite
    .venv/bin/python -m benchmarks.controller --jobs 2400 --nodes 240 --postgres
    .venv/bin/python -m benchmarks.controller --jobs 120 --nodes 12            # 48 GPUs
    .venv/bin/python -m benchmarks.controller --mode slurm --jobs 100
    .venv/bin/python -m benchmarks.controller --cprofile P   # P-first-round.prof, ...
    .venv/bin/python -m benchmarks.controller --max-fits 64  # a larger refit budget
    .venv/bin/python -m benchmarks.controller --set policy.batch_scaling=false  # any setting
    .venv/bin/python -m benchmarks.controller --new-stats   # every job's statistics moved
    .venv/bin/python -m benchmarks.controller --split       # where an icefrog round's time goes

Read a profile with ``python -c "import pstats; pstats.Stats('P-second-round.prof')
.sort_stats('cumulative').print_stats(30)"``; its times are CPU times, and the profiler
roughly doubles them.

"cpu": the process CPU time of the tick's own work and of the reconcile pass (the
machine's other load does not count in it), beside their wall times.

``--split``: after each tick, the wall time spent in each of the parts ``SPLIT`` names (a
timer around each function; a part's time includes the parts under it).

``--new-stats``: before the second round every job reports new gradient statistics for its
epoch in progress (as a job does within a long epoch, or at the end of a short one), so
that round estimates every job again instead of reusing last round's tuning.

Prints the figures; asserts nothing. Targets for a tick's own work: at 2400 jobs on 960
GPUs, 1 s for a steady round and 3 s for the first round after a start; at 120 jobs on 48
GPUs, 1 s for the first round (docs/controller.md has the figures).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.store_snapshot import database, fill
from icefrog_slurm.commands.controller import POLICIES, make_policy
from icefrog_slurm.controller.daemon import Controller, TickReport
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.protocol import Decision, GradStats
from icefrog_slurm.settings import (
    Settings,
    SolverSettings,
    apply_overrides,
    settings_from_mapping,
)
from icefrog_slurm.sim.cluster import SimCluster
from icefrog_slurm.slurm.port import SubmitRequest
from icefrog_slurm.store.migrate import upgrade
from icefrog_slurm.store.sql import SqlStore

BENCH_UID = 1000  # the owner of every job, in the store and in the simulated Slurm


def sim_cluster(nodes: int) -> SimCluster:
    """The simulator's in-memory Slurm (instant answers, so the figures are the controller's
    own work) on ``nodes`` 4-GPU nodes. A job asked to checkpoint exits at once (as the
    trainer does after its checkpoint)."""
    cluster = SimCluster(nodes=nodes, gpus_per_node=4, shards_per_gpu=2, partition="gpu",
                         user_id=BENCH_UID)  # fmt: skip
    cluster.on_signal = lambda sid: cluster.complete(job_id=sid)
    return cluster


def held_jobs(cluster: SimCluster, jobs: int) -> list[str]:
    """Submit ``jobs`` held icefrog jobs (gpu:1); their Slurm ids."""
    return [
        cluster.submit_held(
            request=SubmitRequest(
                script="job.sh",
                tag=IcefrogTag(f"bench-{i}"),
                name=f"bench-{i}",
                gres=Gres("gpu", 1),
                partition="gpu",
            )
        )
        for i in range(jobs)
    ]


class NoFiles:
    """Decision files are not part of the figure (one small write a job a round)."""

    def write_decision(self, *, run_dir: str, decision: Decision, owner_uid: int) -> None:
        return None

    def checkpoint_marked(self, *, run_dir: str, since: float, owner_uid: int) -> bool:
        return False


class StepClock:
    """Real time shifted by ``offset`` (a round is made due by moving it forward)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset

    def sleep(self, seconds: float) -> None:
        return None


ESTIMATE = "icefrog_slurm.policies.estimate"
# (label, module, class or "" for a module function, function): what --split times
SPLIT = (
    ("the store's snapshot", "icefrog_slurm.store.tx", "SqlStoreTx", "snapshot"),
    ("the policy", "icefrog_slurm.policies.icefrog", "IcefrogPolicy", "decide"),
    ("  the estimator", ESTIMATE, "Estimator", "candidates_for"),
    ("    fits and priors", ESTIMATE, "Estimator", "_model"),
    ("    throughput grids", ESTIMATE, "", "measured_or_predicted_grids"),
    ("    sharing regressions", ESTIMATE, "", "_loads"),
    ("    the shared option's grids", ESTIMATE, "", "shared_throughput"),
    ("    psi", "icefrog_slurm.core.penalty", "PenaltyTable", "psis"),
    ("    the tuning pass", ESTIMATE, "", "_tune"),
    ("  solve and placement", "icefrog_slurm.policies.icefrog", "", "solve_and_place"),
)


class Split:
    """Wall-clock timers around the functions ``SPLIT`` names (installed for the process)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        for label, module, owner, name in SPLIT:
            where: Any = importlib.import_module(module)
            if owner:
                where = getattr(where, owner)
            setattr(where, name, self._timed(label, getattr(where, name)))

    def _timed(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[label] += time.perf_counter() - started

        return timed

    def show(self) -> None:
        for label, *_ in SPLIT:
            if label in self.spent:
                print(f"      {label:<32} {self.spent[label] * 1000:8.1f} ms")
        self.spent.clear()


def settings_for(tmp: str, args: argparse.Namespace) -> Settings:
    settings = settings_from_mapping(
        {
            "state": {"dir": tmp},
            "solver": {
                "partition_gpus": args.partition_gpus,
                "time_limit_s": 10.0,
                "max_fits_per_round": args.max_fits,
            },
        }
    )
    return apply_overrides(settings, args.set)


def show(label: str, r: TickReport, total: float, cpu: float) -> None:
    rc = r.reconcile
    print(
        f"  {label:<14} tick {r.tick_s * 1000:8.1f} ms (cpu {r.tick_cpu_s * 1000:7.1f})"
        f" | reconcile {(total - r.tick_s) * 1000:8.1f} ms (cpu {(cpu - r.tick_cpu_s) * 1000:7.1f})"
        f" ({rc.commands} Slurm calls, {rc.done} done) | solve "
        f"{'-' if r.plan.solve_s is None else f'{r.plan.solve_s * 1000:.1f} ms'}"
        f" | {len(r.plan.jobs)} jobs, {sum(j.allocation.gpus for j in r.plan.jobs)} GPUs given"
    )


def three_ticks(
    ctl: Controller,
    clock: StepClock,
    settings: Settings,
    cprofile: str = "",
    before_second: Callable[[], None] | None = None,
    split: Split | None = None,
) -> None:
    """The three ticks; with ``cprofile``, each one's profile (CPU time, as
    ``time.process_time`` counts it) goes to ``cprofile-<label>.prof``. ``before_second``
    runs before the second round, outside its timing."""
    for label in ("first round", "nothing due", "second round"):
        if label == "second round":
            clock.offset += settings.controller.round_period_s + 1
            if before_second is not None:
                before_second()
        profile = cProfile.Profile(time.process_time) if cprofile else None
        t0, c0 = time.perf_counter(), time.process_time()
        if profile is not None:
            profile.enable()
        report = ctl.tick_once()
        if profile is not None:
            profile.disable()
            profile.dump_stats(f"{cprofile}-{label.replace(' ', '-')}.prof")
        show(label, report, time.perf_counter() - t0, time.process_time() - c0)
        if split is not None:
            split.show()


def store_mode(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp, database(args) as url:
        upgrade(url)
        store = SqlStore(url)
        # jobs submitted 10 minutes ago: no moves done yet (the store benchmark times a
        # snapshot with a history of them)
        args.layers, args.samples, args.epochs, args.intents = 20, 8, 3, 0
        cluster = sim_cluster(args.nodes)
        t0 = time.perf_counter()
        ids = fill(store, args, slurm_ids=held_jobs(cluster, args.jobs), owner_uid=BENCH_UID)
        took = time.perf_counter() - t0
        print(f"filled {args.jobs} jobs in {took:.1f} s ({url.split(':')[0]})")
        settings = settings_for(tmp, args)
        clock = StepClock(600.0 - time.time())  # the filler submits at t=0: 10 minutes ago
        ctl = Controller(
            settings=settings,
            policy=make_policy(args.policy),
            cluster=cluster,
            store=store,
            clock=clock,
            files=NoFiles(),
        )
        print(f"{args.jobs} jobs, {args.nodes * 4} GPUs, policy {args.policy}, Slurm excluded:")

        def new_stats() -> None:
            epoch, layers = args.epochs - 1, args.layers
            stats = GradStats(epoch, 0, (1.5,) * layers, (1.8,) * layers)
            with store.transaction() as tx:
                for job_id in ids:
                    tx.put_grad_stats(job_id=job_id, stats=stats, now=clock.now())

        three_ticks(ctl, clock, settings, args.cprofile, new_stats if args.new_stats else None,
                    Split() if args.split else None)  # fmt: skip
        store.close()


def slurm_mode(args: argparse.Namespace) -> None:
    from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
    from tests.integration.store.helpers import spec

    cluster = SlurmCliBackend()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "run").mkdir()
        script = Path(tmp, "run", "job.sh")
        script.write_text("#!/bin/bash\nsleep 600 & wait\n")
        settings = settings_for(tmp, args)
        upgrade(settings.store.url)
        store = SqlStore(settings.store.url)
        sids = []
        try:
            for i in range(args.jobs):
                sid = cluster.submit_held(
                    request=SubmitRequest(
                        script=str(script),
                        tag=IcefrogTag(f"bench-{i}"),
                        name=f"bench-{i}",
                        gres=Gres("gpu", 1),
                        partition="gpu",
                        output="/dev/null",
                        workdir=str(script.parent),
                    )
                )
                sids.append(sid)
                with store.transaction() as tx:
                    tx.create_job(
                        name=f"bench-{i}",
                        owner_uid=0,
                        owner_user="root",
                        slurm_job_id=sid,
                        spec=spec(max_gpus=1),
                        now=time.time(),
                    )
            clock = StepClock()
            ctl = Controller(
                settings=settings,
                policy=make_policy(args.policy),
                cluster=cluster,
                store=store,
                clock=clock,
                files=FsJobFiles(),
            )
            print(
                f"{args.jobs} jobs, local cluster (16 GPUs), policy {args.policy}, Slurm included:"
            )
            three_ticks(ctl, clock, settings, args.cprofile)
        finally:
            for sid in sids:
                cluster.cancel(job_id=sid)
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("store", "slurm"), default="store")
    parser.add_argument("--jobs", type=int, default=2400)
    parser.add_argument("--nodes", type=int, default=240, help="4-GPU nodes (store mode)")
    parser.add_argument("--policy", choices=POLICIES, default="icefrog")
    parser.add_argument("--partition-gpus", type=int, default=48, help="solver partitions")
    parser.add_argument("--postgres", action="store_true", help="a throwaway Postgres")
    parser.add_argument("--url", default="", help="an existing database (store mode)")
    parser.add_argument("--cprofile", default="", help="PREFIX: each tick's CPU profile")
    parser.add_argument(
        "--new-stats", action="store_true", help="new statistics for every job before round 2"
    )
    parser.add_argument(
        "--split", action="store_true", help="the wall time of each part of a round (SPLIT)"
    )
    parser.add_argument(
        "--max-fits",
        type=int,
        default=SolverSettings().max_fits_per_round,
        help="solver.max_fits_per_round (default: the setting's)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting (repeatable), as icefrog simulate --set",
    )
    args = parser.parse_args()
    (slurm_mode if args.mode == "slurm" else store_mode)(args)


if __name__ == "__main__":
    main()
