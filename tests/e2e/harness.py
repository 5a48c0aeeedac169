"""What the end-to-end tests share: the real controller (SQLite store, signed-report inbox,
Slurm CLI backend) wired to a policy the test picks, on the local cluster, with a clock
moved forward to make a round due only when the job has a checkpoint (so no round lands
while the job checkpoints), ``icefrog`` as a subprocess, and the loop that ticks the
controller until the job has finished."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.domain.plan import Policy, PolicyResult
from icefrog_slurm.domain.records import Allocation, JobRecord, JobView
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
from icefrog_slurm.store import migrate
from icefrog_slurm.store.inbox import ReportInbox, slurm_jobs_of
from icefrog_slurm.store.sql import SqlStore
from tests.integration.conftest import REPO
from tests.integration.controller.support import OffsetClock

DIGITS = REPO / "examples" / "train_digits.py"
JOB_ENV = {"OMP_NUM_THREADS": "1"}
"""What a submitted job's environment adds: one OpenMP thread per training process, as
torchrun gives each of several. Unset, a one-process run starts one per core, and on a
loaded two-core machine its epoch took 15-25x as long (40-65 s, 2.6 s on two processes)."""


class TwoStepPolicy:
    """A scripted policy: every job gets ``first`` (GPUs, nodes) until it has reported an
    epoch, then ``then``, at batch 32 with nothing frozen. The e2e tests are about
    enacting an allocation, not about which one a policy prefers."""

    name = "e2e-two-step"

    def __init__(self, first: tuple[int, tuple[str, ...]], then: tuple[int, tuple[str, ...]]):
        self.first, self.then = first, then

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        out = {}
        for j in snapshot.jobs:
            gpus, nodes = self.first if j.job.progress.epoch < 1 else self.then
            out[j.id] = Allocation(job_id=j.id, gpus=gpus, batch=32, frozen=0, nodes=nodes)
        return PolicyResult(allocations=out)


def icefrog(
    *args: str, timeout: float = 60, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


@dataclass
class Rig:
    settings: Settings
    config: Path  # icefrog.toml for the CLI (submit, sacct)
    store: SqlStore
    cluster: SlurmCliBackend
    clock: OffsetClock
    controller: Controller

    def view(self) -> JobView:
        """The only icefrog job in the store, with its measurements."""
        with self.store.transaction() as tx:
            (view,) = tx.snapshot(include_finished=True).jobs
        return view

    def job(self) -> JobRecord:
        return self.view().job

    def run_until_finished(self, timeout_s: float, new_round_at_epoch: int = 1) -> JobRecord | None:
        """Tick until the job has finished (returned) or ``timeout_s`` passed (None). Once
        the job has reported ``new_round_at_epoch`` epochs (a checkpoint exists), one new
        round is made due: the one whose decision moves it."""
        deadline = time.monotonic() + timeout_s
        moved = False
        while time.monotonic() < deadline:
            self.controller.tick_once()
            job = self.job()
            if job.state == "finished":
                return job
            if not moved and job.progress.epoch >= new_round_at_epoch:
                self.clock.next_round(self.settings)
                moved = True
            time.sleep(0.5)
        return None

    def submit_digits(self, workdir: Path, name: str, model: str, target: str = "0.95") -> str:
        """A real digits job (examples/train_digits.py) on 1-2 GPUs to val_acc >= target,
        slowed a little (``--step-delay``: on an idle machine, or a Slurm that starts a
        released job at once, it could reach its target before the round that moves it)."""
        return self.submit(
            workdir, "--gpus", "1-2", "--batch", "16", "--target", f"val_acc>={target}",
            "--max-epochs", "40", "--job-name", name, "--", str(DIGITS), "--model", model,
            "--step-delay", "0.02",
        )  # fmt: skip

    def submit(self, workdir: Path, *options: str) -> str:
        """``icefrog submit`` into this rig's inbox (``options`` end with ``-- train.py
        ARGS``), with ``JOB_ENV`` in the job's environment; the Slurm job id."""
        done = icefrog(
            "submit", "--workdir", str(workdir), "--config", str(self.config),
            "--partition", "gpu", *options, extra_env=JOB_ENV,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[-1]


@contextmanager
def rig(job_dir: Path, policy: Policy, extra: dict[str, object] | None = None) -> Iterator[Rig]:
    """A controller with ``policy`` on a fresh store under ``job_dir`` (rounds only when the
    test calls :meth:`Rig.next_round`)."""
    state = job_dir / "state"
    raw: dict[str, object] = {
        "state": {"dir": str(state)},
        "controller": {"round_period_s": 1000.0, "checkpoint_timeout_s": 60.0,
                       "reconcile_poll_s": 0.5, "reallocation_overhead_s": 0.0},
        "inbox": {"poll_s": 0.5},
    }  # fmt: skip
    raw.update(extra or {})
    settings = settings_from_mapping(raw)
    state.mkdir()
    config = job_dir / "icefrog.toml"
    config.write_text(f'[state]\ndir = "{state}"\n')
    migrate.upgrade(settings.store.url)
    store = SqlStore(settings.store.url)
    cluster = SlurmCliBackend(CliSettings(timeout_s=10, attempts=2, backoff_s=0.2))

    inbox = ReportInbox(
        store=store, inbox_dir=settings.inbox.dir, archive_dir=settings.inbox.archive_dir,
        slurm_jobs=slurm_jobs_of(cluster), max_reports=1000,
    )  # fmt: skip
    inbox.prepare()
    clock = OffsetClock()
    controller = Controller(
        settings=settings, policy=policy, cluster=cluster, store=store,
        clock=clock, files=FsJobFiles(), drain=inbox.drain,
    )  # fmt: skip
    try:
        yield Rig(settings, config, store, cluster, clock, controller)
    finally:
        store.close()


def logs_of(workdir: Path) -> str:
    """Every Slurm output file of the job's runs, oldest first."""
    return "".join(p.read_text() for p in sorted(workdir.glob("slurm-*.out")))
