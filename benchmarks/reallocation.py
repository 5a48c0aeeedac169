"""What a reallocation costs a running job on a real Slurm cluster, from the controller's
decision to the job's first optimizer step on its new allocation, and where the time goes.

    export SLURM_CONF=$(bash slurm_conf/dev/cluster.sh conf)   # a cluster that is up
    .venv/bin/python -m benchmarks.reallocation
    .venv/bin/python -m benchmarks.reallocation --model cnn --resizes 5 \\
        --plan 2:node1 1:node1 --reconcile-poll 2 --release-gap 2

The real controller (``Controller.run``: its loop, the SQLite store, the signed-report inbox,
the Slurm CLI backend) runs in a thread, with a scripted policy: the job gets the first
allocation of ``--plan``, and each time it has made ``--steps`` optimizer steps on its
allocation the benchmark moves it to the next one (cycling) and makes a round due (a clock
moved forward, as a round period ending). The job is ``examples/train_digits.py`` (the
demo's models) submitted with ``icefrog submit`` (per-GPU batch 32, the launcher, torchrun
with gloo on CPU), run through ``benchmarks/job_restart.py``'s worker, whose rank 0 records
wall-clock marks in each run (its own file a run). Slurm's start of the new run comes from
slurmctld's log (milliseconds) when this process can read it, else from ``scontrol show
job``'s StartTime (whole seconds). Each resize prints, in seconds:

- decision -> signal: the round recorded -> reconcile sends USR1 (``scancel --batch``;
  the controller's commands are timed by its audit log, when each was issued)
- signal -> handler: Slurm delivers it; the launcher passes TERM to torchrun, torchrun to
  the trainer, whose handler runs
- to boundary, checkpoint write: the step in progress ends; rank 0 writes the checkpoint
  (a run whose epoch ends first reads the new decision there and stops after that epoch's
  checkpoint: its row says "epoch end", and its stop may come before the signal)
- -> requeued: -> the controller's ``scontrol requeuehold`` (its next look at the
  job's checkpoint marker, every ``controller.reconcile_poll_s``; the job's processes end
  meanwhile, or are ended by the requeue)
- old run ends: -> slurmctld logs the requeue done (``Requeuing JobId``): the old run's
  processes have ended (the interpreters' teardown, torchrun's) and slurmd said so; 0
  when the log cannot be read
- -> released: -> ``scontrol release`` + ``StartTime=now`` (the controller's next look,
  at least ``controller.release_gap_s`` after the requeue; after the ``update`` of the
  job's GRES and nodes)
- -> Slurm start: -> slurmctld allocated the new run (its scheduling pass)
- -> script: -> the training script's first line (slurmd starts the batch script, ``icefrog
  launch``, torchrun and its worker processes, the interpreters)
- imports, set-up, restore, first step: as ``benchmarks/job_restart.py``
- total: decision -> first optimizer step of the new run

and the median of each over the resizes, in four parts: stop (decision -> checkpoint
written), requeue and scheduling (-> Slurm start), process start (-> restore begins),
restore and first step; and in two: the waits on the controller and Slurm (decision ->
signal, signal -> handler, -> requeued, -> released, -> Slurm start), and the job's
processes at work (the rest, the old run's end included: CPU-bound here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from benchmarks import REPO
from icefrog_slurm.controller.daemon import Controller, TickReport
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.slurm.identity import TAG_SECRET, TagSigner
from icefrog_slurm.slurm.select import make_cluster
from icefrog_slurm.store.inbox import ReportInbox, slurm_jobs_of
from icefrog_slurm.store.migrate import upgrade
from icefrog_slurm.store.sql import SqlStore

WORKER = REPO / "benchmarks" / "job_restart.py"
JOB_NAME = "realloc-bench"
PARTS = (
    "decision -> signal", "signal -> handler", "to boundary", "checkpoint write", "-> requeued",
    "old run ends", "-> released", "-> Slurm start", "-> script", "imports", "set-up",
    "restore", "first step", "total",
)  # fmt: skip
GROUPS = ("stop", "requeue, scheduling", "process start", "restore, first step")
WAITS = ("decision -> signal", "signal -> handler", "-> requeued", "-> released", "-> Slurm start")
"""The parts that wait on the controller or Slurm; the others are the job's processes at work
(CPU-bound here)."""
_STAMP = r"^\[(\d{4}-\d\d-\d\dT[\d:]{8}\.\d+)\] "
_ALLOCATED = re.compile(_STAMP + r"(?:sched: Allocate|backfill: Started) JobId=(\d+)\b")
"""slurmctld.log: the main scheduler's or the backfill's start of a job"""
_REQUEUED = re.compile(_STAMP + r"Requeuing JobId=(\d+)\b")
"""slurmctld.log: a requeued job whose run has ended (its processes gone), pending again"""


class Stop(Exception):
    """Raised by the clock's sleep to end the controller's loop."""


class BenchClock:
    """The wall clock (the job's marks and its checkpoint marker's time are compared with
    it). The controller sleeps on it between two ticks: the sleep wakes early when the
    benchmark makes a round due, runs ``between`` (never inside a tick), and ends the loop
    when told."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self.stopping = False
        self.between: Callable[[], None] = lambda: None

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()
        if self.stopping:
            raise Stop
        self.between()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self.stopping = True
        self._wake.set()


class Rounds:
    """Rounds when the benchmark says: the controller runs with a round period no job
    outlives, shortened to nothing for the one tick that makes the next round (set between
    two ticks, so that a tick reads one period throughout)."""

    def __init__(self, settings: Settings, clock: BenchClock) -> None:
        self.settings, self.clock = settings, clock
        self.controller: Controller | None = None
        self.pending = False
        clock.between = self._apply

    def due(self) -> None:
        self.pending = True
        self.clock.wake()

    def _apply(self) -> None:
        if self.pending and self.controller is not None:
            self.pending = False
            c = replace(self.settings.controller, round_period_s=1e-6)
            self.controller.settings = replace(self.settings, controller=c)

    def made(self) -> None:
        assert self.controller is not None
        self.controller.settings = self.settings


class CyclePolicy:
    """Every job gets ``current`` (GPUs, nodes) at per-GPU batch 32, nothing frozen: the
    benchmark is about enacting a reallocation, not about choosing one."""

    name = "reallocation-bench"

    def __init__(self, current: tuple[int, tuple[str, ...]]) -> None:
        self.current = current

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        gpus, nodes = self.current
        return PolicyResult(
            allocations={
                j.id: Allocation(job_id=j.id, gpus=gpus, batch=32, frozen=0, nodes=nodes)
                for j in snapshot.jobs
            }
        )


class Decisions:
    """Wall-clock times at which the controller's rounds were recorded."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds
        self.times: list[float] = []
        self.lock = threading.Lock()

    def tick(self, report: TickReport) -> None:
        if report.plan.new_round:  # recorded when the tick's transaction committed
            self.rounds.made()
            with self.lock:
                self.times.append(report.plan.time + report.tick_s)

    def first(self, after: float) -> float:
        with self.lock:
            times = [t for t in self.times if t >= after]
        if not times:
            raise SystemExit("reallocation: no round recorded")
        return min(times)


def commands(store: SqlStore, after: float) -> dict[str, float]:
    """When the controller issued each Slurm command (its audit log) first after ``after``."""
    with store.transaction() as tx:
        done = [a for a in tx.actions() if a.time >= after and a.outcome == "ok"]
    out: dict[str, float] = {}
    for a in sorted(done, key=lambda a: a.time):
        out.setdefault(a.action, a.time)
    missing = {"signal", "requeue_hold", "release"} - set(out)
    if missing:
        raise SystemExit(f"reallocation: the controller logged no {sorted(missing)}")
    return out


def slurm(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise SystemExit(f"reallocation: {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def slurm_start(sid: str, after: float, log_file: Path | None) -> float:
    """When slurmctld allocated job ``sid`` after ``after``: its log's line (milliseconds),
    else ``scontrol show job``'s StartTime (whole seconds)."""
    logged = logged_at(log_file, _ALLOCATED, sid, after - 1.0)
    if logged is not None:
        return logged
    m = re.search(r"\bStartTime=(\S+)", slurm("scontrol", "show", "job", "-o", sid))
    if m is None:
        raise SystemExit(f"reallocation: no StartTime for job {sid}")
    return _local(m.group(1))


def logged_at(log_file: Path | None, line: re.Pattern[str], sid: str, after: float) -> float | None:
    """The time of slurmctld's first ``line`` about job ``sid`` at or after ``after``."""
    if log_file is None:
        return None
    for text in log_file.read_text(errors="replace").splitlines():
        m = line.match(text)
        if m and m.group(2) == sid and (t := _local(m.group(1))) >= after:
            return t
    return None


def _local(stamp: str) -> float:
    whole, _, frac = stamp.partition(".")
    return time.mktime(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{frac or 0}")


def ctld_log() -> Path | None:
    m = re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", slurm("scontrol", "show", "config"), re.M)
    path = Path(m.group(1)) if m else None
    return path if path is not None and os.access(path, os.R_OK) else None


def runs(out: Path) -> list[dict[str, float]]:
    """Rank 0's marks of each run so far, oldest first."""
    found = [_read_marks(p) for p in out.glob("marks-*.json")]
    return sorted((m for m in found if "started" in m), key=lambda m: m["started"])


def more_runs(out: Path, than: int) -> bool:
    return len(runs(out)) > than


def _read_marks(path: Path) -> dict[str, float]:
    try:
        marks: dict[str, float] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return marks


def registered(store: SqlStore, sid: str) -> bool:
    with store.transaction() as tx:
        return tx.job_by_slurm_id(sid) is not None


def wait_for(check: Callable[[], bool], timeout_s: float, what: str, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            tail = "".join(p.read_text() for p in sorted(logs.glob("slurm-*.out")))[-3000:]
            raise SystemExit(f"reallocation: {what} not seen in {timeout_s:.0f} s\n{tail}")
        time.sleep(0.05)


def parse_plan(items: list[str]) -> list[tuple[int, tuple[str, ...]]]:
    plan = []
    for item in items:
        gpus, _, nodes = item.partition(":")
        if not gpus.isdigit() or int(gpus) < 1 or not re.fullmatch(r"[\w,-]+", nodes):
            raise SystemExit(f"reallocation: --plan takes GPUS:NODE[,NODE], not {item!r}")
        plan.append((int(gpus), tuple(nodes.split(","))))
    if len(plan) < 2:
        raise SystemExit("reallocation: --plan needs at least two allocations")
    return plan


def split(
    decision: float, actions: dict[str, float], old: dict[str, float], new: dict[str, float]
) -> dict[str, float]:
    a = actions
    # a run stopped by the signal checkpoints at its next step boundary; one whose epoch
    # ended first read the new decision (decision.json) there and stopped after that
    # epoch's checkpoint: its stop may precede the signal (negative parts)
    ckpt, ckpted = old.get("checkpoint", old["save"]), old.get("checkpointed", old["saved"])
    handler = min(old.get("signalled", ckpt), ckpt)
    parts = {
        "decision -> signal": a["signal"] - decision,
        "signal -> handler": handler - a["signal"],
        "to boundary": ckpt - handler,
        "checkpoint write": ckpted - ckpt,
        "-> requeued": a["requeue_hold"] - ckpted,
        "old run ends": a["ended"] - a["requeue_hold"],
        "-> released": a["release"] - a["ended"],
        "-> Slurm start": a["start"] - a["release"],
        "-> script": new["started"] - a["start"],
        "imports": new["imported"] - new["started"],
        "set-up": new["restore"] - new["imported"],
        "restore": new["restored"] - new["restore"],
        "first step": new["first step"] - new["restored"],
        "total": new["first step"] - decision,
    }
    parts["stop"] = ckpted - decision
    parts["requeue, scheduling"] = a["start"] - ckpted
    parts["by signal"] = float("checkpoint" in old)
    parts["process start"] = new["restore"] - a["start"]
    parts["restore, first step"] = new["first step"] - new["restore"]
    parts["controller, Slurm"] = sum(parts[p] for p in WAITS)
    parts["job processes"] = parts["total"] - parts["controller, Slurm"]
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="cnn")
    parser.add_argument("--resizes", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps on an allocation")
    parser.add_argument(
        "--plan", nargs="+", default=["2:node1", "1:node1"], help="GPUS:NODES, cycled"
    )
    parser.add_argument("--reconcile-poll", type=float, default=None, help="seconds")
    parser.add_argument("--release-gap", type=float, default=None, help="seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--verbose", action="store_true", help="print each resize's events")
    args = parser.parse_args()
    plan = parse_plan(args.plan)
    if not os.environ.get("SLURM_CONF") or "UP" not in slurm("scontrol", "ping"):
        raise SystemExit("reallocation: set SLURM_CONF to a local cluster that is up")
    work = Path(tempfile.mkdtemp(prefix="icefrog-realloc-"))
    os.chmod(work, 0o755)
    try:
        results = bench(args, plan, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(results, args)


def bench(
    args: argparse.Namespace, plan: list[tuple[int, tuple[str, ...]]], work: Path
) -> list[dict[str, float]]:
    controller_raw: dict[str, object] = {
        "round_period_s": 100000.0,  # rounds only when the benchmark makes them due
        "reallocation_overhead_s": 0.0,
    }
    if args.reconcile_poll is not None:
        controller_raw["reconcile_poll_s"] = args.reconcile_poll
    if args.release_gap is not None:
        controller_raw["release_gap_s"] = args.release_gap
    settings = settings_from_mapping(
        {
            "state": {"dir": str(work / "state")},
            "controller": controller_raw,
            "inbox": {"poll_s": 1.0},
        }
    )
    (work / "state").mkdir()
    logging.basicConfig(  # the controller's log, as the daemon's (--keep to read it)
        filename=work / "controller.log", level=logging.INFO, format="%(asctime)s %(message)s"
    )
    config = work / "icefrog.toml"
    config.write_text(f'[state]\ndir = "{work / "state"}"\n')
    upgrade(settings.store.url)
    store = SqlStore(settings.store.url)
    cluster = make_cluster("cli", signer=TagSigner.from_file(work / "state" / TAG_SECRET))
    inbox = ReportInbox.from_settings(
        settings.inbox, store=store, slurm_jobs=slurm_jobs_of(cluster)
    )
    inbox.prepare()
    clock = BenchClock()
    rounds = Rounds(settings, clock)
    decisions = Decisions(rounds)
    policy = CyclePolicy(plan[0])
    controller = Controller(
        settings=settings, policy=policy, cluster=cluster, store=store, clock=clock,
        files=FsJobFiles(), drain=inbox.drain, on_tick=decisions.tick,
    )  # fmt: skip
    rounds.controller = controller

    def loop() -> None:
        with contextlib.suppress(Stop):
            controller.run()

    thread = threading.Thread(target=loop, name="controller", daemon=True)
    thread.start()
    jobdir, out = work / "job", work / "marks"
    out.mkdir()
    os.chmod(out, 0o777)
    log_file = ctld_log()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    submitted = subprocess.run(
        [
            sys.executable, "-m", "icefrog_slurm", "submit", "--config", str(config),
            "--workdir", str(jobdir), "--job-name", JOB_NAME, "--gpus", "1-4",
            "--batch", "32", "--max-epochs", "100000", "--",
            str(WORKER), "--worker", "--per-process", "--model", args.model,
            "--out", str(out), "--steps", str(args.steps),
        ],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    if submitted.returncode != 0:
        raise SystemExit(f"reallocation: icefrog submit failed: {submitted.stderr}")
    sid = submitted.stdout.split()[-1]
    results: list[dict[str, float]] = []
    try:
        # the controller knows the job once it drained its register report from the inbox
        wait_for(lambda: registered(store, sid), 60, "the job's registration", jobdir)
        rounds.due()  # the first round starts it
        wait_for(lambda: any("ready" in r for r in runs(out)), 300, "the first run", jobdir)
        for i in range(1, args.resizes + 1):
            policy.current = plan[i % len(plan)]
            flipped = time.time()
            before = len(runs(out))
            rounds.due()
            wait_for(partial(more_runs, out, before), 300, f"resize {i}'s new run", jobdir)
            wait_for(lambda: "first step" in runs(out)[-1], 300, f"resize {i}", jobdir)
            decision = decisions.first(flipped)
            actions = commands(store, decision)
            actions["start"] = slurm_start(sid, actions["release"], log_file)
            ended = logged_at(log_file, _REQUEUED, sid, actions["requeue_hold"] - 1.0)
            actions["ended"] = actions["requeue_hold"] if ended is None else ended
            old, new = runs(out)[-2:]
            results.append(split(decision, actions, old, new))
            if args.verbose:
                show(decision, actions, old, new)
            print(f"resize {i} to {plan[i % len(plan)]}: {results[-1]['total']:.2f} s", flush=True)
            wait_for(lambda: "ready" in runs(out)[-1], 300, f"resize {i}'s steps", jobdir)
    finally:
        subprocess.run(["scancel", sid], check=False)
        clock.stop()
        thread.join(timeout=30)
        store.close()
    return results


def show(
    decision: float, actions: dict[str, float], old: dict[str, float], new: dict[str, float]
) -> None:
    """Every event of a resize, in seconds after its decision."""
    marks = [(t, f"controller {k}") for k, t in actions.items() if k not in ("start", "ended")]
    marks += [(actions["ended"], "Slurm: old run ended"), (actions["start"], "Slurm start")]
    marks += [(t, f"old run {k}") for k, t in old.items() if k != "pid" and t >= decision]
    marks += [(t, f"new run {k}") for k, t in new.items() if k != "pid"]
    for t, what in sorted(marks):
        print(f"  {t - decision:8.2f}  {what}")


def print_table(results: list[dict[str, float]], args: argparse.Namespace) -> None:
    where = ctld_log()
    print(
        f"\nseconds a resize, model {args.model}, per-GPU batch 32, plan {' '.join(args.plan)}; "
        f"Slurm start from {'slurmctld.log' if where else 'StartTime (whole seconds)'}"
    )
    header = ["resize", *PARTS]
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * len(PARTS))
    for i, r in enumerate(results, 1):
        name = f"{i}" if r["by signal"] else f"{i} (epoch end)"
        print(f"| {name} | " + " | ".join(f"{r[p]:.2f}" for p in PARTS) + " |")
    both = ("controller, Slurm", "job processes")
    med = {p: statistics.median(r[p] for r in results) for p in (*PARTS, *GROUPS, *both)}
    print("| median | " + " | ".join(f"{med[p]:.2f}" for p in PARTS) + " |")
    print("\nmedian by part: " + ", ".join(f"{g} {med[g]:.2f} s" for g in GROUPS))
    print("median by kind: " + ", ".join(f"{g} {med[g]:.2f} s" for g in both))
    print(f"median total (decision -> first step on the new allocation): {med['total']:.2f} s")


if __name__ == "__main__":
    main()
