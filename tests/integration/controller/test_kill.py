"""Kill tests: SIGKILL the controller at a step point, restart it, and check the cluster
converges to the plan with no job lost, duplicated or left held, and the store agrees.

The plan (stand-in policy): job A runs on 1 GPU and needs 2 (checkpoint, requeue, update,
release), job B is held and starts on 1 GPU (update, release). The controller runs under
``kill_runner`` (the points are named there): after any reconcile step, inside
``release_now`` (between ``scontrol release`` and ``StartTime=now``), while decision.json is
written, during a drain of the report inbox, and a second time while it recovers from the
first kill. A move to a shared GPU is killed the same way, also between a resubmission's
sbatch and the scancel of the job it replaces.
"""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.protocol import Envelope, parse_decision
from icefrog_slurm.runfiles import DECISION_FILE
from icefrog_slurm.security import drop_report, sign
from icefrog_slurm.settings import Settings
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.store.sql import SqlStore
from tests.integration.controller import kill_runner
from tests.integration.controller.kill_runner import RECONCILE_STEPS, killer, watch_commands
from tests.integration.controller.support import (
    OffsetClock,
    backend,
    converge,
    inbox_drain,
    live_tagged,
    make_controller,
    make_settings,
    make_store,
    running,
    submit_job,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]
STEP_POINTS = 12  # A: signal; B: update, release; A: requeue_hold, update, release (x2)
ONCE = pytest.mark.one_slurm_version
"""A kill point whose recovery is the controller's own (its store, its log, its files):
run against the first Slurm version only. Each version runs the points right after a
Slurm command the recovery must read back from that Slurm (signal, requeue_hold, release
of a requeued job, release without StartTime=now, a resubmission's sbatch)."""


def _points(points: list[Any], every_version: set[Any]) -> list[Any]:
    """``points`` as parameters, those not in ``every_version`` marked :data:`ONCE` (a
    tuple is one test's several arguments)."""
    return [
        p
        if p in every_version
        else pytest.param(*(p if isinstance(p, tuple) else (p,)), marks=ONCE)
        for p in points
    ]


@pytest.fixture
def tag() -> str:
    """This test's prefix of icefrog keys (other sessions share the cluster)."""
    return f"kill-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def cluster(tag: str) -> Iterator[SlurmCliBackend]:
    be = backend()
    yield be
    for j in be._jobs().values():  # this test's jobs only
        if not j.finished and j.tag is not None and j.tag.key.startswith(tag):
            be.cancel(job_id=j.job_id)


@dataclass
class TwoJobs:
    """Job A running on 1 GPU (it needs 2), job B held; the controller's config file."""

    settings: Settings
    config: Path
    store: SqlStore
    tag: str
    a: int
    sid_a: str
    dir_a: Path
    b: int
    sid_b: str
    dir_b: Path


def two_jobs(tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend, tag: str) -> TwoJobs:
    settings = make_settings(tmp_path, checkpoint_timeout_s=15.0)
    config = tmp_path / "icefrog.toml"
    config.write_text(
        f'[state]\ndir = "{settings.state.dir}"\n[inbox]\npoll_s = 0.5\n'
        "[controller]\nreconcile_poll_s = 0.3\ncheckpoint_timeout_s = 15.0\n"
    )
    store: SqlStore = make_store(settings)
    a, sid_a, dir_a = submit_job(store, cluster, job_dir, f"{tag}-a", held=False, min_gpus=2)
    running(cluster, sid_a)
    b, sid_b, dir_b = submit_job(store, cluster, job_dir, f"{tag}-b", min_gpus=1)
    return TwoJobs(settings, config, store, tag, a, sid_a, dir_a, b, sid_b, dir_b)


def killed(config: Path, at: str, nth: int = 1) -> None:
    """Run the controller (``icefrog controller`` under ``kill_runner``) until it kills
    itself at the ``nth`` point matching ``at``. It runs in a forked child of this process,
    whose imports it shares: a fresh interpreter spent more time importing than the
    controller did working. What it prints goes to this test's captured output."""
    args = ["--at", at, "--nth", str(nth), "--", "--config", str(config),
            "--max-ticks", "200", "--policy", "standin"]  # fmt: skip
    child = multiprocessing.get_context("fork").Process(target=kill_runner.main, args=(args,))
    child.start()
    child.join(90)
    if child.exitcode is None:
        child.kill()
        child.join()
    assert child.exitcode == -9, f"exit code {child.exitcode}"  # it died at that point


def restarted_converges(jobs: TwoJobs, cluster: SlurmCliBackend) -> None:
    """A restarted controller converges: A on 2 GPUs, B on 1, each once, none held; the
    store has no open intent and the same Slurm jobs; each job has this round's decision."""
    settings = jobs.settings
    store = SqlStore(settings.store.url)
    converge(make_controller(settings, store, StandInPolicy(), OffsetClock()))
    assert running(cluster, jobs.sid_a).gres == Gres("gpu", 2)
    assert running(cluster, jobs.sid_b).gres == Gres("gpu", 1)
    for key in (f"{jobs.tag}-a", f"{jobs.tag}-b"):
        live = live_tagged(cluster, key)
        assert len(live) == 1 and not live[0].held, live  # none lost, doubled or held
    with jobs.store.transaction() as tx:
        assert tx.open_intents() == []
        assert tx.job(jobs.a).slurm_job_ids == (jobs.sid_a,)
        assert tx.job(jobs.b).slurm_job_ids == (jobs.sid_b,)
        last = tx.round()
    assert last is not None
    for run_dir, gpus, starts in ((jobs.dir_a, 2, 2), (jobs.dir_b, 1, 1)):
        # A started, then once more after its move; B once: nothing requeued without need
        assert len((run_dir / "starts").read_text().splitlines()) == starts
        decision = parse_decision((run_dir / DECISION_FILE).read_text())
        assert (decision.round, decision.gpus) == (last.round_no, gpus)
        assert not list(run_dir.glob(".decision*"))  # no temp file left by a killed write
    store.close()
    jobs.store.close()


@pytest.mark.parametrize("step", _points(list(range(1, STEP_POINTS + 1)), {1, 7, 11}))
def test_killed_at_any_step_converges_after_restart(
    step: int, tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend, tag: str
) -> None:
    jobs = two_jobs(tmp_path, job_dir, cluster, tag)
    killed(jobs.config, RECONCILE_STEPS, step)
    if step > STEP_POINTS - 2:  # killed after A's release: restart once A runs again
        running(cluster, jobs.sid_a)
    restarted_converges(jobs, cluster)


@pytest.mark.parametrize("nth", [1, 2])  # B's release (held job), then A's (requeued job)
def test_killed_between_release_and_start_now_converges(
    nth: int, tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend, tag: str
) -> None:
    jobs = two_jobs(tmp_path, job_dir, cluster, tag)
    killed(jobs.config, "run:scontrol release", nth)
    restarted_converges(jobs, cluster)


@ONCE
def test_killed_while_writing_a_decision_converges(
    tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend, tag: str
) -> None:
    jobs = two_jobs(tmp_path, job_dir, cluster, tag)
    killed(jobs.config, "decision:temp")
    temps = [*jobs.dir_a.glob(".decision*"), *jobs.dir_b.glob(".decision*")]
    assert len(temps) == 1  # killed between the temp file and its rename
    restarted_converges(jobs, cluster)


@ONCE
@pytest.mark.parametrize(("first", "second"), [(2, 1), (4, 2), (7, 3)])
def test_killed_again_while_recovering_converges(
    first: int, second: int, tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend, tag: str
) -> None:
    jobs = two_jobs(tmp_path, job_dir, cluster, tag)
    killed(jobs.config, RECONCILE_STEPS, first)
    killed(jobs.config, RECONCILE_STEPS, second)  # the restarted one, while recovering
    a = cluster.poll(job_ids=[jobs.sid_a])[jobs.sid_a]
    if a.state == "PENDING" and not a.held:  # released: the next one finds it restarted
        running(cluster, jobs.sid_a)
    restarted_converges(jobs, cluster)


REPORTS = 4


@ONCE
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_killed_during_a_drain_loses_and_doubles_no_report(
    nth: int, tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend, tag: str
) -> None:
    jobs = two_jobs(tmp_path, job_dir, cluster, tag)
    inbox = Path(jobs.settings.inbox.dir)
    inbox_drain(jobs.settings, jobs.store)  # (makes the inbox, as the daemon does)
    for seq in range(1, REPORTS + 1):
        payload = {"epoch": seq, "samples_done": 100 * seq, "effective_samples_done": 90.0 * seq}
        envelope = Envelope(1, "progress", jobs.sid_a, f"{jobs.tag}-a", seq, 1000.0 + seq, payload)
        drop_report(inbox, sign(envelope))
    killed(jobs.config, "drain:commit", nth)
    left = [p for p in inbox.rglob("*.json") if p.is_file()]
    assert 0 < len(left) < REPORTS + 1, left  # killed mid-drain: some reports still there

    settings = jobs.settings
    store = SqlStore(settings.store.url)
    ctl = make_controller(
        settings, store, StandInPolicy(), OffsetClock(), drain=inbox_drain(settings, store)
    )
    converge(ctl)
    assert [p for p in inbox.rglob("*.json") if p.is_file()] == []  # every report handled
    with jobs.store.transaction() as tx:
        assert all(
            tx.accepted_digest(slurm_job_id=jobs.sid_a, seq=s) for s in range(1, REPORTS + 1)
        )
        assert tx.accepted_count(job_id=jobs.a) == REPORTS  # each once
        assert tx.rejected_reports() == []
        assert tx.job(jobs.a).progress.epoch == REPORTS
    store.close()
    restarted_converges(jobs, cluster)


# signal, requeue_hold, resubmit (x2: done, logged), link, cancel (x2), release (x2)
MOVE_POINTS = 11
MOVE_KILLS = [(RECONCILE_STEPS, n) for n in range(1, MOVE_POINTS + 1)] + [("run:sbatch", 1)]
# The move is the same steps for both kinds of shared GRES: mps is killed inside the
# resubmission only (after the new job is made, before it is linked)
MOVE_KILLS_BY_KIND = [(at, nth, "shard") for at, nth in MOVE_KILLS] + [
    (RECONCILE_STEPS, 3, "mps"),
    ("run:sbatch", 1, "mps"),
]


def _move_child(url: str, state_dir: str, job: int, at: str, nth: int, sharing: str) -> None:
    """In a forked child: a controller deciding a shared GPU for ``job``, killing itself
    at the ``nth`` point matching ``at`` (kill_runner's names)."""
    from tests.integration.controller.support import FixedPolicy

    settings = make_settings(Path(state_dir).parent, sharing, checkpoint_timeout_s=15.0)
    hook = killer(at, nth)
    watch_commands(hook)
    policy = FixedPolicy({job: (1, True, ("node4",))})
    ctl = make_controller(settings, SqlStore(url), policy, OffsetClock())
    ctl.reconciler.after_step = hook
    ctl.run(max_ticks=200)


@pytest.mark.parametrize(
    ("at", "nth", "sharing"),
    _points(
        MOVE_KILLS_BY_KIND,
        {k for k in MOVE_KILLS_BY_KIND if k[2] == "mps"}
        | {(RECONCILE_STEPS, 5, "shard"), ("run:sbatch", 1, "shard")},
    ),
    indirect=["sharing"],
)
def test_killed_while_moving_to_a_shared_gpu_converges_after_restart(
    at: str,
    nth: int,
    sharing: str,
    tmp_path: Path,
    job_dir: Path,
    cluster: SlurmCliBackend,
    tag: str,
) -> None:
    """(``run:sbatch``: the new job exists, the old one is not cancelled yet.)"""
    from tests.integration.controller.support import FixedPolicy

    settings = make_settings(tmp_path, sharing, checkpoint_timeout_s=15.0)
    store = make_store(settings)
    key = tag
    job, sid, _ = submit_job(store, cluster, job_dir, key, held=False)
    running(cluster, sid)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(
        target=_move_child,
        args=(settings.store.url, settings.state.dir, job, at, nth, sharing),
    )
    child.start()
    child.join(60)
    assert child.exitcode == -9

    policy = FixedPolicy({job: (1, True, ("node4",))})
    converge(make_controller(settings, SqlStore(settings.store.url), policy, OffsetClock()))
    live = live_tagged(cluster, key)
    assert len(live) == 1 and not live[0].held, live  # none lost, doubled or held
    with store.transaction() as tx:
        assert tx.open_intents() == []
        assert tx.job(job).slurm_job_ids == (sid, live[0].job_id)  # the chain, kept
    shared = Gres("shard", 1) if sharing == "shard" else Gres("mps", 50)  # not predicted: half
    assert running(cluster, live[0].job_id).gres == shared
    store.close()


@pytest.mark.parametrize("then", ["whole", "stop"])
def test_killed_after_a_resubmission_s_sbatch_then_a_new_plan_leaves_no_stray_job(
    then: str, tmp_path: Path, job_dir: Path, cluster: SlurmCliBackend, tag: str
) -> None:
    """Killed between a move's sbatch (a shard job made as the owner) and its link; the
    restarted controller's first round plans the job back on a whole GPU, or stops it:
    the job made before the kill is found by its signed tag, not left held for ever."""
    from tests.integration.controller.support import FixedPolicy

    settings = make_settings(tmp_path, "shard", checkpoint_timeout_s=15.0)
    store = make_store(settings)
    job, sid, _ = submit_job(store, cluster, job_dir, tag, held=False)
    running(cluster, sid)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(
        target=_move_child,
        args=(settings.store.url, settings.state.dir, job, "run:sbatch", 1, "shard"),
    )
    child.start()
    child.join(60)
    assert child.exitcode == -9
    assert len(live_tagged(cluster, tag)) == 2  # the old job, held, and the new one

    clock = OffsetClock()
    clock.next_round(settings)  # the restart comes after the round period: a new plan
    policy = FixedPolicy({job: (1, False, ("node4",))} if then == "whole" else {})
    converge(make_controller(settings, SqlStore(settings.store.url), policy, clock))
    live = live_tagged(cluster, tag)
    assert len(live) == 1, live  # neither job left behind
    with store.transaction() as tx:
        assert tx.open_intents() == []
        assert tx.job(job).slurm_job_ids[-1] == live[0].job_id
    if then == "whole":
        assert running(cluster, live[0].job_id).gres == Gres("gpu", 1)
    else:
        assert live[0].held  # it waits, as the plan says
    store.close()
