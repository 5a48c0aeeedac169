"""The simulation engine: the production ``Controller`` driven over simulated time.

The edges are swapped, nothing else (architecture rule 2): a :class:`SimClock`, the
in-memory :class:`~icefrog_slurm.sim.cluster.SimCluster` behind ``ClusterPort``, the real
``SqlStore`` on a throw-away SQLite file behind ``StorePort``, and :class:`SimJobFiles` that
hand ``decision.json`` to the simulated job and answer whether it checkpointed. The policy is
any ``Policy``; the controller's tick and reconcile are the production ones.

A step of the loop: jobs whose submission time has come are submitted held and registered
(as ``icefrog submit`` and the ``register`` report do); ``Controller.tick_once()`` runs;
Slurm's scheduler pass starts released jobs; the world advances to the next event (the next
round, or ``reconcile_poll_s`` while reconcile waits for checkpoints; jobs arriving in
between are submitted at the next tick, as the production daemon sees them):
every running job trains per the truth (:mod:`~icefrog_slurm.sim.jobs`) and its reports go
into the store through the same ``SqlStoreTx`` calls the inbox makes for verified reports.
A job asked to checkpoint (USR1) checkpoints at once; the reallocation overhead is paid
when it restarts.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from icefrog_slurm.controller.daemon import Controller, TickReport
from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.domain.plan import Policy
from icefrog_slurm.errors import InputError
from icefrog_slurm.limits import MAX_CLUSTER_GPUS, MAX_GPUS_PER_NODE, MAX_SEED
from icefrog_slurm.protocol import Decision
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim.calibration import check_gpu_model, shipped_calibration
from icefrog_slurm.sim.catalog import Catalog, shipped_catalog
from icefrog_slurm.sim.cluster import SimCluster
from icefrog_slurm.sim.jobs import Config, JobOutcome, Reports, SimJob
from icefrog_slurm.sim.truth import (
    MEMORY_NOISE,
    PROFILE_TIME_NOISE,
    UTIL_NOISE,
    ProfileNoise,
    TaskTruth,
    build_truths,
)
from icefrog_slurm.sim.workload import TraceJob
from icefrog_slurm.slurm.port import SubmitRequest
from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import SqlStore

SIM_UID = 1000
MIN_ROUND_S = 1.0
"""Shortest simulated round (a shorter one makes a simulation of days take forever)."""
MIN_POLL_S = 0.1
"""Shortest simulated wait while reconcile waits for checkpoints."""
MAX_STEP_S = 86400.0
"""Longest simulated round or reconcile wait (and never past ``max_sim_s``): a longer one
leaves every job's times to a clock that cannot count in seconds any more."""
MAX_NOISE_SD = 2.0
"""Largest noise sd of ``--profile-noise`` / ``--share-noise`` (on a log scale a factor
e^2 a sd; far larger ones drive profiled times to zero)."""


class SimClock:
    """Simulated time; ``sleep`` just moves it on."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)


class SimJobFiles:
    """``JobFiles`` for simulated jobs: run dir -> the job; the marker is the job's own
    checkpoint time."""

    def __init__(self) -> None:
        self.jobs: dict[str, SimJob] = {}

    def write_decision(self, *, run_dir: str, decision: Decision, owner_uid: int) -> None:
        job = self.jobs.get(run_dir)
        if job is None:
            raise OSError(f"no simulated job runs in {run_dir}")
        job.on_decision(decision)

    def checkpoint_marked(self, *, run_dir: str, since: float, owner_uid: int) -> bool:
        job = self.jobs.get(run_dir)
        return job is not None and job.checkpoint_at is not None and job.checkpoint_at >= since


@dataclass(frozen=True)
class SimOptions:
    """How to simulate: cluster shape, switches and limits."""

    gpus: int = 48
    gpus_per_node: int = 4
    seed: int = 0
    freeze: bool = True  # jobs may freeze layers (max_frozen_fraction from the catalog)
    share: bool = True  # jobs accept a shared GPU
    fixed_batch: bool = False  # jobs declare the workload's batch as their global batch
    max_sim_s: float = 60 * 86400.0  # stop (jobs unfinished) after this much simulated time
    profile_noise: float = PROFILE_TIME_NOISE  # sd of log noise on each profiled time
    share_noise: float | None = None  # sd on peak memory (log) and utilisation; None: truth's
    gpu_model: str = "a800"  # the calibration's GPUs (calibration.GPU_MODELS)

    def check(self) -> None:
        """InputError naming the option out of range (the command-line names)."""
        if not 1 <= self.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise InputError(
                f"--gpus-per-node: must be within [1, {MAX_GPUS_PER_NODE}], "
                f"got {self.gpus_per_node}"
            )
        if not 1 <= self.gpus <= MAX_CLUSTER_GPUS or self.gpus % self.gpus_per_node:
            raise InputError(
                f"--gpus {self.gpus}: must be a multiple of --gpus-per-node {self.gpus_per_node} "
                f"within [1, {MAX_CLUSTER_GPUS}]"
            )
        check_gpu_model(self.gpu_model)
        if not 0 <= self.seed <= MAX_SEED:
            raise InputError(f"--seed: must be within [0, {MAX_SEED}], got {self.seed}")
        for name, sd in (
            ("--profile-noise", self.profile_noise),
            ("--share-noise", self.share_noise),
        ):
            if sd is not None and not 0 <= sd <= MAX_NOISE_SD:  # nan fails too
                raise InputError(f"{name}: must be within [0, {MAX_NOISE_SD:g}], got {sd}")

    def noise(self) -> ProfileNoise:
        """The noise on the jobs' profile samples (the throughput-model noise ablation)."""
        memory = MEMORY_NOISE if self.share_noise is None else self.share_noise
        util = UTIL_NOISE if self.share_noise is None else self.share_noise
        return ProfileNoise(time=self.profile_noise, memory=memory, util=util)


@dataclass
class Round:
    time: float
    solve_s: float
    tick_s: float


@dataclass
class SimResult:
    """What a run produced (summary.json and the plots are made from it)."""

    policy: str
    options: SimOptions
    jobs: list[JobOutcome]
    rounds: list[Round]
    usage: list[tuple[float, int]]  # (time, GPUs in use)
    frozen: dict[str, list[tuple[float, int]]]  # job name -> (time, frozen layers)
    wall_s: float = 0.0
    ticks: int = 0
    end_time: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class Engine:
    """One simulation of one workload under one policy (module docstring)."""

    def __init__(
        self,
        workload: Sequence[TraceJob],
        policy: Policy,
        *,
        settings: Settings,
        options: SimOptions,
        catalog: Catalog | None = None,
        truths: dict[str, TaskTruth] | None = None,
        store_dir: str | None = None,
    ) -> None:
        options.check()  # before anything starts
        check_steps(settings, options)
        self.noise = options.noise()
        self.catalog = catalog or shipped_catalog()
        self.truths = truths or build_truths(
            self.catalog, shipped_calibration(options.gpu_model), seed=options.seed
        )
        self.settings, self.options, self.policy = settings, options, policy
        first = min((j.submit_s for j in workload), default=0.0)
        if options.gpu_model == "v100":  # Pollux's simulator: rounds at multiples of its period
            first -= first % settings.controller.round_period_s
        self.clock = SimClock(first)
        self.files = SimJobFiles()
        self.cluster = SimCluster(
            nodes=options.gpus // options.gpus_per_node,
            gpus_per_node=options.gpus_per_node,
            shards_per_gpu=settings.slurm.shards_per_gpu,
            mps_per_gpu=settings.slurm.mps_per_gpu,
            partition=settings.slurm.partition,
            user_id=SIM_UID,
            on_signal=self._on_signal,
        )
        self._tmp = None if store_dir else tempfile.TemporaryDirectory(prefix="icefrog-sim-")
        folder = Path(store_dir) if store_dir else Path(self._tmp.name if self._tmp else ".")
        url = f"sqlite:///{folder / 'sim.db'}"
        migrate.upgrade(url)
        self.store = SqlStore(url)
        self.store.without_fsync()  # a throw-away database (measured in docs/evaluation.md)
        self.controller = Controller(
            settings=settings,
            policy=policy,
            cluster=self.cluster,
            store=self.store,
            clock=self.clock,
            files=self.files,
        )
        self.pending = sorted(workload, key=lambda j: (j.submit_s, j.name))
        self.jobs: list[SimJob] = []
        self.running: list[SimJob] = []  # submitted and not done, in submission order
        self.by_slurm: dict[str, SimJob] = {}
        self.job_ids: dict[str, int] = {}
        self._store_ids: dict[str, int] = {}

    # ----- the loop ----------------------------------------------------------------------
    def run(self, progress: Callable[[float, int, int], None] | None = None) -> SimResult:
        """Simulate until every job ended (or ``max_sim_s``); ``progress(now, done, total)``
        is called after each round."""
        result = SimResult(self.policy.name, self.options, [], [], [], {})
        started = time.perf_counter()
        total = len(self.pending)
        start = self.clock.now()
        last_round = -float("inf")
        try:
            while not self._all_done(total) and self.clock.now() - start < self.options.max_sim_s:
                self._arrivals()
                report = self.controller.tick_once()
                result.ticks += 1
                if report.plan.new_round:
                    last_round = report.plan.time
                    result.rounds.append(
                        Round(report.plan.time, report.plan.solve_s or 0.0, report.tick_s)
                    )
                    if progress is not None:
                        progress(self.clock.now(), sum(j.done for j in self.jobs), total)
                self.cluster.schedule()
                until = self._next_time(report, last_round)
                if not until > self.clock.now():  # a float clock this large cannot move
                    raise InputError(f"simulated time cannot advance past {until:g} s")
                self._advance(until, result)
        finally:
            self.close()
        result.jobs = [j.outcome for j in self.jobs] + [
            JobOutcome(name=j.name, task=self.catalog.resolve(j.task), submit=j.submit_s)
            for j in self.pending
        ]
        result.frozen = {j.job.name: j.frozen_trace for j in self.jobs if j.frozen_trace}
        result.wall_s = time.perf_counter() - started
        result.end_time = self.clock.now()
        return result

    def close(self) -> None:
        """Release the store and its throw-away folder (``run`` does it when it ends)."""
        self.store.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _all_done(self, total: int) -> bool:
        return not self.pending and not self.running and len(self.jobs) == total

    def _next_time(self, report: TickReport, last_round: float) -> float:
        now = self.clock.now()
        c = self.settings.controller
        if report.reconcile.busy:
            step = c.reconcile_poll_s
        else:
            step = max(last_round + c.round_period_s - now, c.reconcile_poll_s)
        return now + step

    # ----- jobs arriving -----------------------------------------------------------------
    def _arrivals(self) -> None:
        now = self.clock.now()
        while self.pending and self.pending[0].submit_s <= now:
            self._submit(self.pending.pop(0), now)

    def _submit(self, job: TraceJob, now: float) -> None:
        name = self.catalog.resolve(job.task)
        truth = self.truths.get(name)
        if truth is None:
            raise InputError(f"workload job {job.name}: task {name} has no calibrated truth")
        task = self.catalog.get(name)
        spec = task.job_spec(self.catalog.layers(name))
        if self.options.fixed_batch:  # the job declares the workload's global batch
            spec = replace(spec, global_batch=job.batch_size)
        if truth.pollux_app is not None:  # v100: the application as Pollux's simulator has it
            spec = truth.pollux_app.job_spec(spec)
        if not self.options.freeze:
            spec = replace(spec, max_frozen_fraction=0.0)
        if not self.options.share:
            spec = replace(spec, accepts_shared=False)
        seed = self.options.seed * 1_000_003 + len(self.jobs)
        sim = SimJob(
            job,
            truth,
            spec,
            seed=seed,
            overhead_s=self.settings.controller.reallocation_overhead_s,
            noise=self.noise,
        )
        per_node = min(job.gpus, self.options.gpus_per_node)
        request = SubmitRequest(
            script="",
            tag=IcefrogTag(job.name),
            name=job.name,
            gres=Gres("gpu", per_node),
            num_nodes=max(1, -(-job.gpus // per_node)),
            workdir=sim.run_dir,
        )
        sim.slurm_id = self.cluster.submit_held(request=request)
        with self.store.transaction() as tx:
            job_id = tx.create_job(
                name=job.name,
                owner_uid=SIM_UID,
                owner_user="sim",
                slurm_job_id=sim.slurm_id,
                spec=spec,
                now=job.submit_s,
            )
        self._store_ids[job.name] = job_id
        self.files.jobs[sim.run_dir] = sim
        self.jobs.append(sim)
        self.running.append(sim)
        self.by_slurm[sim.slurm_id] = sim

    def _on_signal(self, slurm_id: str) -> None:
        job = self._current_job(slurm_id)
        if job is not None:
            job.checkpoint_at = self.clock.now()

    def _current_job(self, slurm_id: str) -> SimJob | None:
        job = self.by_slurm.get(slurm_id)
        if job is None:  # a resubmitted Slurm job not seen yet: same name, same job
            name = self.cluster.job_detail(job_id=slurm_id).name
            job = next((j for j in self.jobs if j.job.name == name), None)
            if job is not None:
                self.by_slurm[slurm_id] = job
                job.slurm_id = slurm_id
        return job

    # ----- the world moving ----------------------------------------------------------------
    def _advance(self, until: float, result: SimResult) -> None:
        now = self.clock.now()
        self._sync_configs(now)
        result.usage.append((now, self.cluster.gpus_in_use()))
        reports: list[tuple[SimJob, Reports]] = []
        finished: list[tuple[SimJob, float]] = []
        for job in self.running:
            if job.config is None:
                continue
            rep, end = job.step(now, until, self._speed(job))
            reports.append((job, rep))
            if end is not None:
                finished.append((job, end))
        self._store_reports(reports, until)
        for job, _end in finished:
            self.cluster.complete(job_id=job.slurm_id)
            job.set_config(None, until)
        self.running = [j for j in self.running if not j.done]
        self.clock.t = until

    def _sync_configs(self, now: float) -> None:
        """Each job's allocation as Slurm holds it now, with its decision's batch/frozen."""
        for job in self.running:
            held = self._held(job)
            if not held:
                job.set_config(None, now)
                continue
            d = job.decision
            shared = bool(self.cluster.gpu_sharers(*held[0])) and len(held) == 1
            batch, global_batch = job.batch_for(len(held), None if d is None else d.batch)
            frozen = d.frozen if d is not None else 0
            nodes = len({n for n, _ in held})
            cfg = Config(len(held), nodes, batch, frozen, shared, held, global_batch)
            job.set_config(cfg, now)

    def _held(self, job: SimJob) -> tuple[tuple[str, int], ...]:
        """GPUs the job's current Slurm job holds; follows a resubmission (gpu <-> shard:
        the old job cancelled, its successor tagged ``prev=``) to the new Slurm job."""
        held = self.cluster.holdings(job.slurm_id)
        if held:
            return held
        state = self.cluster.poll(job_ids=[job.slurm_id]).get(job.slurm_id)
        if state is not None and state.state == "CANCELLED":
            new = self.cluster.find_successor(job_id=job.slurm_id, owner_uid=SIM_UID)
            if new is not None:
                self.by_slurm[new] = job
                job.slurm_id = new
                return self.cluster.holdings(new)
        return ()

    def _speed(self, job: SimJob) -> float:
        cfg = job.config
        if cfg is None or not cfg.shared:
            return 1.0
        node, index = cfg.gpu_key[0]
        partners = []
        for sid in self.cluster.gpu_sharers(node, index):
            other = self.by_slurm.get(sid)
            if other is not None and other is not job and other.config is not None:
                partners.append((other.truth, other.config.batch, other.config.frozen))
        return job.truth.shared_speed(
            batch=cfg.batch, frozen=cfg.frozen, partners=partners, kind=self.settings.sharing.gres
        )

    def _store_reports(self, reports: list[tuple[SimJob, Reports]], now: float) -> None:
        """Apply the jobs' reports as the inbox applies verified ones."""
        if not any(r.samples or r.progress or r.finished for _, r in reports):
            return
        with self.store.transaction() as tx:
            for job, rep in reports:
                job_id = self._store_ids[job.job.name]
                if rep.samples:
                    tx.add_profile_samples(
                        job_id=job_id, slurm_job_id=job.slurm_id, samples=rep.samples, now=now
                    )
                if rep.grad_stats is not None:
                    tx.put_grad_stats(job_id=job_id, stats=rep.grad_stats, now=now)
                if rep.metric is not None:
                    tx.put_metric(job_id=job_id, metric=rep.metric, now=now)
                if rep.progress is not None:
                    tx.set_progress(job_id=job_id, progress=rep.progress, sent_time=now)
                if rep.finished is not None:
                    tx.mark_finished(job_id=job_id, report=rep.finished, now=now)


def check_steps(settings: Settings, options: SimOptions) -> None:
    """Rounds and reconcile polls long enough that a simulation of ``max_sim_s`` ends, and
    short enough that it counts time: within [MIN_ROUND_S, MAX_STEP_S] and [MIN_POLL_S,
    MAX_STEP_S] s, neither past ``max_sim_s``; an InputError naming the setting."""
    c = settings.controller
    longest = min(MAX_STEP_S, options.max_sim_s)
    for key, value, least in (
        ("round_period_s", c.round_period_s, MIN_ROUND_S),
        ("reconcile_poll_s", c.reconcile_poll_s, MIN_POLL_S),
    ):
        if not least <= value <= longest:  # nan fails too
            raise InputError(
                f"controller.{key}: the simulator needs {least:g} to {longest:g} s, got {value:g}"
            )
