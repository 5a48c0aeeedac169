"""How long a controller tick takes: its own work, with Slurm's calls excluded or included.

``store`` mode (default): a fresh database (SQLite, or a throwaway Postgres with
``--postgres``) holds JOBS active jobs (profile samples, per-layer gradient statistics,
metrics; ``benchmarks/store_snapshot.py``'s filler) on NODES x 4 GPUs. The cluster is an
in-memory stand-in for Slurm (instant answers), so the figures are the controller's own
work: the tick transaction (snapshot, policy, record: ``tick_s``) and the reconcile pass
(its store writes and the state machine). Three ticks: the first round (every job held,
models fitted for the first time), a pass with nothing due, and a second round.

``slurm`` mode: the real local cluster (``slurm_conf/dev/cluster.sh``, 4 nodes x 4 GPUs)
with ``--jobs`` held icefrog jobs; the same three ticks with every Slurm call included
(squeue poll, sinfo + squeue capacity, scontrol update/release for the jobs started).

    PYTHONPATH=. python benchmarks/controller.py --jobs 2400 --nodes 240          # SQLite
    PYTHONPATH=. python benchmarks/controller.py --jobs 2400 --nodes 240 --postgres
    PYTHONPATH=. python benchmarks/controller.py --jobs 120 --nodes 12            # 48 GPUs
    PYTHONPATH=. python benchmarks/controller.py --mode slurm --jobs 100

Prints the figures; asserts nothing. Target: a tick's own work under 1 % of the 300 s
round period at 48 GPUs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path

from benchmarks.store_snapshot import database, fill
from icefrog_slurm.commands.controller import POLICIES, make_policy
from icefrog_slurm.controller.daemon import Controller, TickReport
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.domain.cluster import (
    Gres,
    IcefrogTag,
    NodeCapacity,
    PartitionCapacity,
    SlurmJobState,
)
from icefrog_slurm.protocol import Decision
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.slurm.parse import expand_hostlist
from icefrog_slurm.slurm.port import GresAllocation, SlurmJobDetail, SubmitRequest
from icefrog_slurm.store.migrate import upgrade
from icefrog_slurm.store.sql import SqlStore


class MemoryCluster:
    """Slurm as a dict: instant answers, so a benchmark times the controller alone. A job
    asked to checkpoint exits at once (as the trainer does after its checkpoint)."""

    def __init__(self, nodes: int, job_ids: Collection[str]) -> None:
        self.nodes = tuple(f"node{i + 1}" for i in range(nodes))
        self.jobs = {
            sid: SlurmJobState(
                sid,
                "PENDING",
                Gres("gpu", 1),
                1,
                "",
                "JobHeldUser",
                1,
                0,
                "gpu",
                f"icefrog:{sid}",
                IcefrogTag(sid),
            )
            for sid in job_ids
        }

    def _set(self, sid: str, **kw: object) -> None:
        self.jobs[sid] = replace(self.jobs[sid], **kw)  # type: ignore[arg-type]

    def poll(self, *, job_ids: Collection[str]) -> Mapping[str, SlurmJobState]:
        return {i: self.jobs[i] for i in job_ids if i in self.jobs}

    def partition_capacity(self, *, partition: str) -> PartitionCapacity:
        return PartitionCapacity(partition, tuple(NodeCapacity(n, 4, 0) for n in self.nodes), ())

    def update_pending(
        self,
        *,
        job_id: str,
        gres: Gres | None = None,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> None:
        self._set(job_id, gres=gres, num_nodes=num_nodes or 1, nodelist=",".join(nodes or ()))

    def release_now(self, *, job_id: str) -> None:
        self._set(job_id, state="RUNNING", reason="None")

    def release(self, *, job_id: str) -> None:
        self.release_now(job_id=job_id)

    def signal_batch(self, *, job_id: str, signal: str = "USR1") -> None:
        self._set(job_id, state="COMPLETED")

    def requeue_hold(self, *, job_id: str) -> None:
        self._set(job_id, state="PENDING", reason="job requeued in held state")

    def hold(self, *, job_id: str) -> None:
        self._set(job_id, reason="JobHeldUser")

    def cancel(self, *, job_id: str) -> None:
        self._set(job_id, state="CANCELLED")

    def find_successor(self, *, job_id: str, owner_uid: int) -> str | None:
        return None

    def resubmit(
        self,
        *,
        job_id: str,
        owner_uid: int,
        gres: Gres,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> str:
        new = str(max(int(i) for i in self.jobs) + 1)
        self.jobs[new] = replace(self.jobs[job_id], job_id=new, gres=gres)
        self.cancel(job_id=job_id)
        return new

    def job_detail(self, *, job_id: str) -> SlurmJobDetail:
        j = self.jobs[job_id]
        return SlurmJobDetail(
            job_id,
            job_id,
            0,
            0,
            j.state,
            j.reason,
            0,
            j.gres,
            1,
            None,
            None,
            "gpu",
            "/nonexistent",
            None,
            None,
            None,
            j.comment,
            j.tag,
        )

    def gres_allocation(self, *, job_id: str) -> tuple[GresAllocation, ...]:
        return ()

    def hostnames(self, *, nodelist: str) -> tuple[str, ...]:
        return tuple(expand_hostlist(nodelist))

    def submit_held(self, *, request: SubmitRequest) -> str:
        raise NotImplementedError


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


def settings_for(tmp: str, args: argparse.Namespace) -> Settings:
    return settings_from_mapping(
        {
            "state": {"dir": tmp},
            "solver": {"partition_gpus": args.partition_gpus, "time_limit_s": 10.0},
        }
    )


def show(label: str, r: TickReport, total: float) -> None:
    rc = r.reconcile
    print(
        f"  {label:<14} tick {r.tick_s * 1000:8.1f} ms"
        f" | reconcile {(total - r.tick_s) * 1000:8.1f} ms"
        f" ({rc.commands} Slurm calls, {rc.done} done) | solve "
        f"{'-' if r.plan.solve_s is None else f'{r.plan.solve_s * 1000:.1f} ms'}"
        f" | {len(r.plan.jobs)} jobs, {sum(j.allocation.gpus for j in r.plan.jobs)} GPUs given"
    )


def three_ticks(ctl: Controller, clock: StepClock, settings: Settings) -> None:
    for label in ("first round", "nothing due", "second round"):
        if label == "second round":
            clock.offset += settings.controller.round_period_s + 1
        t0 = time.perf_counter()
        report = ctl.tick_once()
        show(label, report, time.perf_counter() - t0)


def store_mode(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp, database(args) as url:
        upgrade(url)
        store = SqlStore(url)
        args.layers, args.samples, args.epochs = 20, 8, 3
        t0 = time.perf_counter()
        fill(store, args)
        took = time.perf_counter() - t0
        print(f"filled {args.jobs} jobs in {took:.1f} s ({url.split(':')[0]})")
        with store.transaction() as tx:
            sids = [j.slurm_job_id for j in tx.jobs()]
        settings = settings_for(tmp, args)
        clock = StepClock(600.0 - time.time())  # the filler submits at t=0: 10 minutes ago
        ctl = Controller(
            settings=settings,
            policy=make_policy(args.policy),
            cluster=MemoryCluster(args.nodes, sids),
            store=store,
            clock=clock,
            files=NoFiles(),
        )
        print(f"{args.jobs} jobs, {args.nodes * 4} GPUs, policy {args.policy}, Slurm excluded:")
        three_ticks(ctl, clock, settings)
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
            three_ticks(ctl, clock, settings)
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
    args = parser.parse_args()
    (slurm_mode if args.mode == "slurm" else store_mode)(args)


if __name__ == "__main__":
    main()
