"""Builders for the controller's integration tests: a migrated SQLite store, held icefrog
jobs on the real local cluster, a policy that decides what a test says, and a clock that
a test can move forward to make a round due."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.domain.cluster import Gres, IcefrogTag, SlurmJobState
from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
from icefrog_slurm.slurm.identity import TAG_SECRET, TagSigner
from icefrog_slurm.slurm.port import SubmitRequest
from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import SqlStore
from tests.integration.conftest import wait_for
from tests.integration.store.helpers import spec

SCRIPT = """#!/bin/bash
# A stand-in training job: USR1 = checkpoint now (write the marker, note it in
# ./checkpoints) and exit. Each start removes the marker (as the launcher does: a restart
# has not checkpointed yet) and appends the GPU variables Slurm gave it to ./env (its
# Slurm id first).
trap 'touch "$PWD/checkpointed"; echo "$SLURM_JOB_ID" >> "$PWD/checkpoints"; exit 0' USR1
rm -f "$PWD/checkpointed"
echo "start $SLURM_JOB_ID restarts=${SLURM_RESTART_COUNT:-0}" >> "$PWD/starts"
gpu_env=$(env | grep -E '^(CUDA_VISIBLE_DEVICES|CUDA_MPS_[A-Z_]*)=' | tr '\n' ' ')
echo "$SLURM_JOB_ID $gpu_env" >> "$PWD/env"
sleep 600 &
wait
"""


PEAK_MEM = 2.0**33
"""The predicted peak memory FixedPolicy gives a shared job it predicts (8 GiB)."""


class OffsetClock:
    """The real clock plus an offset a test moves forward (to make a round due)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.5))

    def next_round(self, settings: Settings) -> None:
        self.offset += settings.controller.round_period_s + 1


@dataclass
class FixedPolicy:
    """Decides what the test says: job id -> (gpus, shared, nodes); others wait. ``utils``:
    job id -> the predicted GPU utilisation of a shared job (an ``mps`` job's share), which
    comes with a predicted peak memory of ``PEAK_MEM`` (its MPS memory limit / 1.1)."""

    decisions: dict[int, tuple[int, bool, tuple[str, ...]]] = field(default_factory=dict)
    name: str = "fixed"
    utils: dict[int, float] = field(default_factory=dict)

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        out = {}
        for j in snapshot.jobs:
            gpus, shared, nodes = self.decisions.get(j.id, (0, False, ()))
            out[j.id] = Allocation(
                job_id=j.id, gpus=gpus, batch=32 if gpus else 0, frozen=0, shared=shared,
                nodes=nodes, predicted_util=self.utils.get(j.id) if shared else None,
                predicted_mem_bytes=PEAK_MEM if shared and j.id in self.utils else None,
            )  # fmt: skip
        return PolicyResult(allocations=out)


def make_settings(tmp: Path, sharing: str = "shard", **controller: float) -> Settings:
    """The tests' settings; ``sharing``: the GRES a shared job asks for (``shard``, ``mps``)."""
    return settings_from_mapping(
        {
            "state": {"dir": str(tmp / "state")},
            "sharing": {"gres": sharing},
            "controller": {
                "round_period_s": 300.0,
                "checkpoint_timeout_s": 20.0,
                "reconcile_poll_s": 0.3,
                **controller,
            },
            "inbox": {"poll_s": 0.5},
        }
    )


def make_store(settings: Settings) -> SqlStore:
    Path(settings.state.dir).mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.store.url)
    return SqlStore(settings.store.url)


def backend(signer: TagSigner | None = None) -> SlurmCliBackend:
    return SlurmCliBackend(CliSettings(timeout_s=10, attempts=2, backoff_s=0.2), signer=signer)


def state_signer(settings: Settings) -> TagSigner:
    """The daemon's tag signer (its secret in the state folder): a restarted controller, or
    one in a forked child, recognises the resubmissions of the one before it."""
    return TagSigner.from_file(Path(settings.state.dir) / TAG_SECRET)


def submit_job(
    store: SqlStore,
    cluster: SlurmCliBackend,
    base: Path,
    key: str,
    *,
    gres: Gres | None = None,
    held: bool = True,
    **spec_changes: object,
) -> tuple[int, str, Path]:
    """An icefrog job: its run dir, a Slurm job (held, or already released) and its record."""
    run_dir = base / key
    run_dir.mkdir()
    run_dir.chmod(0o755)  # its owner's alone, whatever the umask: decision.json goes there
    script = run_dir / "job.sh"
    script.write_text(SCRIPT)
    sid = cluster.submit_held(
        request=SubmitRequest(
            script=str(script),
            tag=IcefrogTag(key=key),
            name=f"it-{key}",
            gres=gres or Gres("gpu", 1),
            partition="gpu",
            output=str(run_dir / "out-%j.txt"),
            workdir=str(run_dir),
        )
    )
    if not held:
        cluster.release(job_id=sid)
    with store.transaction() as tx:
        job_id = tx.create_job(
            name=key,
            owner_uid=os.getuid(),
            owner_user="root",
            slurm_job_id=sid,
            spec=spec(**spec_changes),
            now=time.time(),
        )
    return job_id, sid, run_dir


def make_controller(
    settings: Settings,
    store: SqlStore,
    policy: object,
    clock: OffsetClock,
    drain: Callable[[], object] | None = None,
) -> Controller:
    return Controller(
        settings=settings,
        policy=policy,  # type: ignore[arg-type]
        cluster=backend(state_signer(settings)),
        store=store,
        clock=clock,
        files=FsJobFiles(),
        drain=drain,
    )


def inbox_drain(settings: Settings, store: SqlStore) -> Callable[[], object]:
    """The report inbox's drain, wired as the daemon wires it."""
    from icefrog_slurm.store.inbox import ReportInbox, slurm_jobs_of

    inbox = ReportInbox.from_settings(
        settings.inbox, store=store, slurm_jobs=slurm_jobs_of(backend())
    )
    inbox.prepare()
    return inbox.drain


def converge(controller: Controller, timeout: float = 60.0) -> None:
    """Tick until a tick finds nothing left to do."""

    def idle() -> bool:
        report = controller.tick_once()
        if report.reconcile.busy:
            time.sleep(0.3)
            return False
        return True

    wait_for("the controller to converge", idle, timeout=timeout, every=0.0)


def state_of(cluster: SlurmCliBackend, sid: str) -> SlurmJobState:
    return cluster.poll(job_ids=[sid])[sid]


def running(cluster: SlurmCliBackend, sid: str, timeout: float = 30.0) -> SlurmJobState:
    def check() -> SlurmJobState | None:
        s = cluster.poll(job_ids=[sid]).get(sid)
        return s if s is not None and s.state == "RUNNING" else None

    return wait_for(f"job {sid} running", check, timeout=timeout)


def chain(store: SqlStore, job_id: int) -> tuple[str, ...]:
    with store.transaction() as tx:
        return tx.job(job_id).slurm_job_ids


def live_tagged(cluster: SlurmCliBackend, key: str) -> list[SlurmJobState]:
    return [
        j
        for j in cluster._jobs().values()
        if j.tag is not None and j.tag.key == key and not j.finished
    ]


def cancel_all(cluster: SlurmCliBackend, sids: Mapping[str, object] | list[str]) -> None:
    for sid in sids:
        cluster.cancel(job_id=str(sid))
