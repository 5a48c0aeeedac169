"""Per-job estimates the ICEFROG policy feeds the IceShare solver (spec section 9, steps 2-4).

For each job of a snapshot, from what the job reported:

- its throughput model: a :class:`~icefrog_slurm.core.fit.ProfileHistory` fitted to its
  unshared profile samples (eq 4-7, 14) with the model of its declared parallelism
  (``parallel_fit.fitter_for``: DDP eq 4-7, SDP eq 9-10, PP/HP eq 11-13; with
  ``policy.large_model_models = false`` every job gets the DDP model, the paper's
  ablation); a job with no sample yet gets the *prior*: the model fitted to assumed
  samples predicted from its declared per-layer FLOPs and parameter bytes and the GPU
  model (``slurm.gpu_model``; ``core.throughput.prior_iteration_time``), unfrozen, at its
  smallest legal GPU count (smallest and largest batch), its smallest count of several GPUs
  on one node and its smallest count of several nodes (smallest batch);
- psi from its latest per-layer gradient variances (eq 3); with none yet, freezing is not
  offered (only l = 0, psi = 1): its cost cannot be judged;
- which frozen depths the Layer Tuner may choose from (``freezing``): every legal one
  (``"penalty"``, ICEFROG: eq 15 picks l by E each round), or only the depth of the job's
  FreezeOut schedule at its training progress (``"freezeout"``, ``core/freezeout.py``:
  the baselines' "+" and ICEFROG's ablation), the schedule tuned once per job by
  effective progress at its requested GPU count when its first statistics arrive; with
  ``"penalty"``, a job whose target metric stalled (``policy.freeze_patience_epochs``,
  :func:`~icefrog_slurm.core.tta.stalled`) while it held frozen layers is offered only
  l = 0 from then on (psi cannot see a frozen prefix that caps the metric);
- with ``explore`` (ICEFROG's estimator; the baselines keep their own rules) at most twice
  the largest GPU count the job has measured (AdaptDL's rule, :func:`exploration_cap`), so
  a count the model mispredicts is reached in steps, measured and corrected;
- the sharing predictor (eq 8's regressions) from samples that measured utilization and
  memory; before the job reported any sample, with ``sharing.before_samples``, its declared
  tables (``core.sharing.DeclaredLoad``), so a waiting job may start on a shared GPU; with samples
  but none of them measuring its load, the job is not offered a shared GPU. The shared
  option's (m, l) is its own: the Layer Tuner's best among the configurations whose
  predicted load fits one job's part of a GPU (``core.sharing.shared_throughput``);
- for every legal GPU count a (``min_gpus..max_gpus``, a multiple of the job's allocation
  unit and a legal count of its parallelism, at most a node or whole nodes, at most the
  capacity) the Layer Tuner's best (m, l) (eq 15) and
  ``T_acc(a) = T_age + P / max E(a, s, m, l)`` (eq 16; P from the declared budget and,
  past half of it, the job's validation reports: :func:`remaining_samples`), plus
  the same for one shared GPU at lambda = ``sharing.speed_factor`` for a DDP job in units
  of one GPU (large models keep their GPUs busy and are not packed, spec section 7); an
  option that changes a running job's allocation is charged
  ``controller.reallocation_overhead_s``. A job that declares a global batch B is
  offered, at a GPUs, only the per-GPU batch it will really train with
  (``JobSpec.batch_candidates``: m = ceil(B/a) clipped to its range, the rule the
  simulated jobs and the trainer follow); its T is that of (a, m) in samples/s
  (accumulating gradients keeps the samples/s of m).
- with ``policy.batch_scaling`` (ICEFROG's batch-elasticity ablation; the baselines build
  their estimator with it off) the tuner maximises goodput, E x the statistical efficiency
  of the global batch a x m (``core/goodput.py``, from the same gradient statistics), for
  a job whose global batch is free, so E and T_acc are in base-batch samples.

Models are cached per job and refitted only when a new configuration is measured; the
model's throughput grids (and the shared option's, with the configurations that do not fit
zeroed) are cached until a sample arrives or the model changes, so new gradient
statistics re-tune a job without predicting again. A round's jobs are tuned together
(:meth:`Estimator.candidates_for`): each job is prepared alone (model, psi, grids), then
the options of all of them are tuned in one pass, those of one shape stacked into one
array (their statistics summed, their efficiency grids and the Layer Tuner's argmax,
:func:`_tune`), the same choices and floats as one job at a time; no job's arrays are
padded to another's size, and a job whose estimate fails waits alone.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from icefrog_slurm.core.fit import ProfileHistory
from icefrog_slurm.core.freezeout import FreezeOut, tune_freezeout
from icefrog_slurm.core.goodput import efficiency_of_sums, trainable_sums
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallel_fit import fitter_for
from icefrog_slurm.core.parallelism import DDP, Kind, Parallelism
from icefrog_slurm.core.penalty import PenaltyTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.sharing import (
    DeclaredLoad,
    Load,
    LoadModel,
    SharingPredictor,
    fit_sharing,
    shared_throughput,
)
from icefrog_slurm.core.throughput import GPU_MODELS, GpuModel, nodes_for, prior_iteration_time
from icefrog_slurm.core.tta import remaining_work, stalled, time_to_accuracy
from icefrog_slurm.core.tuner import (
    FloatArray,
    ThroughputModel,
    TunerChoice,
    TuneRow,
    legal_frozen,
    measured_or_predicted_grid,
    measured_or_predicted_grids,
    powers_of_two,
    spread_depths,
    tune_grid,
    tune_rows,
)
from icefrog_slurm.domain.snapshot import JobSnapshot
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.protocol import GradStats, JobSpec
from icefrog_slurm.settings import Freezing, Settings

log = logging.getLogger(__name__)

BYTES_PER_GB = 1e9


Efficiencies = Callable[[Iterable[int], Mapping[int, Sequence[int]]], dict[int, FloatArray | None]]
"""(GPU counts, their per-GPU batches) -> each count's efficiency grid (batch scaling)."""


@dataclass(frozen=True)
class Candidate:
    """One way to run a job: the tuner's choice at ``gpus`` (shared or not) and its TTA."""

    gpus: int
    shared: bool
    choice: TunerChoice
    tta_s: float
    load: Load | None = None  # predicted (util, memory bytes) for a shared candidate


@dataclass
class _Cached:
    samples: int  # how many of the job's samples the history holds
    history: ProfileHistory
    prior: bool  # the history holds only the prior sample
    modelled: Parallelism  # the parallelism whose model the history fits
    layers: LayerTable | None = None  # the layer table the history fits (a spec's own)
    model: ThroughputModel | None = None  # the last fitted model
    stale: bool = True  # a configuration arrived since ``model`` was fitted
    # The tuner's choices by (gpus, shared), valid while ``tuned_for`` is unchanged.
    tuned: dict[tuple[int, bool], TunerChoice | None] = field(default_factory=dict)
    tuned_for: tuple[object, ...] = ()
    version: int = 0  # bumped whenever ``model`` changes
    # The throughput grids by (gpus, batches, frozen depths), valid while ``grids_for`` (the
    # samples and the model) is unchanged: new gradient statistics re-tune, not re-predict.
    grids: dict[tuple[int, tuple[int, ...], tuple[int, ...]], FloatArray] = field(
        default_factory=dict
    )
    grids_for: tuple[object, ...] = ()
    # The sharing regressions (eq 8), fitted when a shared option is first considered
    # after ``sharing_for`` samples (-1: not yet).
    sharing: SharingPredictor | None = None
    sharing_for: int = -1
    # The shared option's throughput grid with the configurations that do not fit zeroed,
    # valid while what it came from (``shared_for``) is unchanged: new gradient statistics
    # re-tune the shared option without predicting its load again.
    shared_grid: FloatArray | None = None
    shared_for: tuple[object, ...] = ()


@dataclass
class _Prepared:
    """One job between :meth:`Estimator._prepare` and :func:`_finish`: what its candidates
    need, and the options still to tune (:func:`_tune`), each (its (gpus, shared), batches,
    throughput grid alone, lambda), with the job's frozen depths, their psi, its current
    depth and, with batch scaling, its per-layer statistics and base batch."""

    job: JobSnapshot
    cached: _Cached
    layers: LayerTable
    configs: list[tuple[int, bool]]
    remaining: float  # P (eq 16)
    age: float  # T_age
    todo: list[tuple[tuple[int, bool], tuple[int, ...], FloatArray, float]] = field(
        default_factory=list
    )
    frozen: tuple[int, ...] = ()
    psi: FloatArray = field(default_factory=lambda: np.ones(0))
    current_frozen: int | None = None
    scaling: tuple[tuple[float, ...], tuple[float, ...], int] | None = None


class Estimator:
    """Builds every job's candidates; keeps each job's fitted models between rounds.

    A fit costs 0.01-0.1 s a job (``fit_ddp_model``'s least squares), so a round refits at
    most ``fit_budget`` models (call :meth:`new_round` first): first the jobs that measured
    themselves but have no fitted model yet (the prior is far less accurate than any fit),
    then the others in the order the policy asks (oldest first). A job left over keeps its
    last fitted model, or the prior when it has none, until a later round; its measured
    configurations are used as measured anyway.
    """

    def __init__(
        self,
        freezing: Freezing | None = None,
        batch_scaling: bool | None = None,
        *,
        explore: bool | None = False,
    ) -> None:
        self._cache: dict[int, _Cached] = {}
        self._explore = explore  # at most twice the largest measured count; None: the setting
        self._budget = -1  # fits left this round; -1: unlimited
        self._first: set[int] = set()  # jobs fitted first this round (new_round)
        self._priors: dict[tuple[object, ...], ThroughputModel] = {}
        self._gpu = GPU_MODELS["a800"]  # the GPU model of the settings last seen
        self._freezing = freezing  # None: the setting policy.freezing
        self._batch_scaling = batch_scaling  # None: the setting policy.batch_scaling
        self._schedules: dict[int, FreezeOut | None] = {}  # FreezeOut, tuned once a job
        self._layers: dict[int, tuple[JobSpec, LayerTable]] = {}
        self._tables: dict[tuple[object, ...], LayerTable] = {}  # one object per equal table
        self._prior_of: dict[int, tuple[tuple[object, ...], ThroughputModel]] = {}
        self._unfrozen: set[int] = set()  # jobs whose metric stalled while frozen
        self._failing: set[int] = set()  # jobs whose estimate failed: not fitted first

    def new_round(self, *, fit_budget: int | None, jobs: Sequence[JobSnapshot] = ()) -> None:
        """Start a round that fits at most ``fit_budget`` models (None: no limit). Given the
        round's ``jobs``, the budget goes first to those that measured themselves but have no
        fitted model yet (new, or back from the prior; oldest first), then to the jobs whose
        models are stale, in the order their candidates are asked for."""
        self._budget = -1 if fit_budget is None else fit_budget
        self._first = set()
        if fit_budget is None:
            return
        for job in sorted(jobs, key=lambda j: (j.job.submit_time, j.id)):
            if len(self._first) >= fit_budget:
                break
            cached = self._cache.get(job.id)
            fitted = cached is not None and not cached.prior and cached.model is not None
            if job.id in self._failing:
                continue
            if not fitted and any(not s.shared for s in job.view.samples):
                self._first.add(job.id)
        self._budget = fit_budget - len(self._first)

    def candidates_for(
        self,
        jobs: Sequence[JobSnapshot],
        *,
        now: float,
        gpus_per_node: int,
        capacity: int,
        settings: Settings,
    ) -> list[tuple[tuple[Candidate, ...], str]]:
        """:meth:`candidates` of each job, in order, the options of all of them tuned in one
        pass (:func:`_tune`), each job isolated: when estimating one job raises (an empty
        or invalid layer table, a fit that fails), the error is logged (:meth:`_failed`)
        and ``((), "EstimateFailed: ...")`` comes back for it, so it waits with that
        reason while the round goes on for every other job."""
        out: list[tuple[tuple[Candidate, ...], str]] = []
        ready: dict[int, _Prepared] = {}  # by position in ``jobs``
        for at, job in enumerate(jobs):
            out.append(((), ""))
            try:
                ready[at] = self._prepare(job, now, gpus_per_node, capacity, settings)
            except Exception as exc:  # one job's bad input must not abandon the round
                out[at] = ((), self._failed(job, exc))
        try:
            _tune(list(ready.values()))
        except Exception:  # one job's options broke the pass: each job's alone, isolated
            log.exception("the round's tuning pass failed: each job is tuned alone")
            for at, prepared in list(ready.items()):
                try:
                    _tune([prepared])
                except Exception as exc:
                    out[at] = ((), self._failed(prepared.job, exc))
                    del ready[at]
        for at, prepared in ready.items():
            try:
                out[at] = (_finish(prepared, settings), "")
            except Exception as exc:
                out[at] = ((), self._failed(prepared.job, exc))
            else:
                self._failing.discard(prepared.job.id)
        return out

    def _failed(self, job: JobSnapshot, exc: Exception) -> str:
        """Log why the job's estimate failed; the reason it waits. Its choices, grids and
        sharing fits are dropped (they may be half made); its samples and fitted model are
        kept, so the next round does not fit it again from nothing, and it no longer goes
        first for the round's fits (:meth:`new_round`): a job whose estimate fails every
        round cannot take the fit budget from the others."""
        cached = self._cache.get(job.id)
        if cached is not None:
            cached.tuned, cached.tuned_for, cached.grids, cached.grids_for = {}, (), {}, ()
            cached.sharing, cached.sharing_for = None, -1
            cached.shared_grid, cached.shared_for = None, ()
        self._failing.add(job.id)
        reason = f"EstimateFailed: {type(exc).__name__}: {exc}"
        log.warning("job %d (%s): %s", job.id, job.job.name, reason)
        return reason

    def candidates(
        self,
        job: JobSnapshot,
        *,
        now: float,
        gpus_per_node: int,
        capacity: int,
        settings: Settings,
    ) -> tuple[Candidate, ...]:
        """One job's candidates (module docstring); an error in its estimate is raised."""
        prepared = self._prepare(job, now, gpus_per_node, capacity, settings)
        _tune([prepared])
        return _finish(prepared, settings)

    def _prepare(
        self, job: JobSnapshot, now: float, gpus_per_node: int, capacity: int, settings: Settings
    ) -> _Prepared:
        """Everything of a job's candidates but the tuning of its options not tuned yet:
        its model (fitted within the round's budget), psi, the frozen depths it may take,
        its configurations and their throughput grids, P and its age."""
        spec = job.job.spec
        layers = self._layer_table(job.id, spec)
        self._gpu = GPU_MODELS[settings.slurm.gpu_model]
        cached = self._models(job, layers, gpus_per_node, modelled_parallelism(spec, settings))
        stats = job.view.grad_stats
        psi: Callable[[int], float]
        penalty: PenaltyTable | None = None
        freezing = self._freezing or settings.policy.freezing
        if stats is not None and len(stats.grad_var) == layers.num_layers:
            penalty = PenaltyTable(stats.grad_var)
            psi = penalty.psi
            current_frozen: int | None = stats.frozen
            frozen = spread_depths(
                legal_frozen(layers, layers.max_frozen_from_fraction(spec.max_frozen_fraction)),
                keep=current_frozen,
            )
            if freezing == "penalty" and self._stalled_frozen(job, stats, settings):
                frozen = (0,)
        else:
            psi, frozen, current_frozen = (lambda _l: 1.0), (0,), None
        model = self._model(job, cached, layers, gpus_per_node)
        measured = cached.history.measured()
        if len(frozen) > 1 and freezing == "freezeout":
            asked = spec.batch_candidates(requested_count(job))
            frozen = self._freezeout_depth(job, frozen, psi, asked, measured, model, layers)
        scaling = self._scaling_stats(spec, stats, layers, settings)
        key = (len(job.view.samples), stats, cached.version, model is cached.model, frozen,
               scaling is None)  # fmt: skip
        if cached.tuned_for != key:
            cached.tuned, cached.tuned_for = {}, key
        predicted_by = (len(job.view.samples), cached.version, model is cached.model, layers)
        if cached.grids_for != predicted_by:
            cached.grids, cached.grids_for = {}, predicted_by
        explore = settings.policy.exploration if self._explore is None else self._explore
        top = exploration_cap(job) if explore else capacity
        configs = _configurations(job, gpus_per_node, top, capacity, settings, cached, layers)
        age = max(0.0, now - job.job.submit_time)
        prepared = _Prepared(job, cached, layers, configs, remaining_samples(job), age)
        # one per-GPU batch with a global batch; the missing grids in one model evaluation
        batches = {g: spec.batch_candidates(g) for g, shared in configs}
        untuned = dict.fromkeys(g for g, shared in configs if (g, shared) not in cached.tuned)
        missing = [(g, batches[g]) for g in untuned if (g, batches[g], frozen) not in cached.grids]
        if missing:
            grids = measured_or_predicted_grids(
                configs=missing,
                frozen_candidates=frozen,
                measured=measured,
                model=model,
                layers=layers,
            )
            for (g, at), grid in zip(missing, grids, strict=True):
                cached.grids[g, at, frozen] = grid
        if not untuned:
            return prepared
        prepared.frozen, prepared.current_frozen = frozen, current_frozen
        prepared.scaling = scaling
        prepared.psi = np.array([1.0] * len(frozen) if penalty is None else penalty.psis(frozen))
        for g in untuned:  # the unshared options
            if (g, False) not in cached.tuned and (g, False) in configs:
                grid = cached.grids[g, batches[g], frozen]
                prepared.todo.append(((g, False), batches[g], grid, 1.0))
        if (1, True) in configs and (1, True) not in cached.tuned:  # its own (m, l)
            loads = _loads(job, cached, layers, settings)
            if loads is None:
                cached.tuned[1, True] = None
            else:
                lam, sharing = settings.sharing.speed_factor, settings.sharing
                grid = cached.grids[1, batches[1], frozen]
                made_of = (cached.grids_for, loads, batches[1], frozen, lam, sharing,
                           settings.slurm.gpu_mem_gb)  # fmt: skip
                if cached.shared_grid is None or cached.shared_for != made_of:
                    cached.shared_grid, _, _ = shared_throughput(
                        batch_sizes=batches[1], frozen_candidates=frozen, throughput=grid,
                        loads=loads, layers=layers, lam=lam,
                        gpu_memory=settings.slurm.gpu_mem_gb * BYTES_PER_GB,
                        memory_safety=sharing.memory_safety,
                        jobs_per_gpu=sharing.max_jobs_per_gpu,
                    )  # fmt: skip
                    cached.shared_for = made_of
                prepared.todo.append(((1, True), batches[1], cached.shared_grid, lam))
        return prepared

    def _stalled_frozen(self, job: JobSnapshot, stats: GradStats, settings: Settings) -> bool:
        """Whether the job is to train unfrozen (``policy.freeze_patience_epochs``): its
        target metric stalled while it held frozen layers, now or in an earlier round."""
        if job.id in self._unfrozen:
            return True
        spec = job.job.spec
        if stats.frozen > 0 and stalled(
            target_metrics(job),
            patience=settings.policy.freeze_patience_epochs,
            higher_is_better=spec.target_op == ">=",
        ):
            self._unfrozen.add(job.id)
            log.info(
                "job %d (%s): %s stalled for %d epochs with %d layers frozen: trains unfrozen",
                job.id, job.job.name, spec.target_metric,
                settings.policy.freeze_patience_epochs, stats.frozen,
            )  # fmt: skip
            return True
        return False

    def _scaling_stats(
        self, spec: JobSpec, stats: GradStats | None, layers: LayerTable, settings: Settings
    ) -> tuple[tuple[float, ...], tuple[float, ...], int] | None:
        """With batch scaling on (``policy.batch_scaling``, or as constructed), for a job
        whose global batch is free and whose gradient statistics have come: its per-layer
        variances and squared norms and its base batch, from which the tuner's efficiency
        grids come (:func:`_tune`). None otherwise (E alone)."""
        on = settings.policy.batch_scaling if self._batch_scaling is None else self._batch_scaling
        if not on or spec.global_batch > 0 or stats is None:
            return None
        if not len(stats.grad_var) == len(stats.grad_sqr) == layers.num_layers:
            return None
        return stats.grad_var, stats.grad_sqr, spec.min_gpus * spec.min_batch

    def _freezeout_depth(
        self,
        job: JobSnapshot,
        frozen: tuple[int, ...],
        psi: Callable[[int], float],
        batches: tuple[int, ...],
        measured: Mapping[tuple[int, int, int], float],
        model: ThroughputModel,
        layers: LayerTable,
    ) -> tuple[int, ...]:
        """The one depth FreezeOut offers now: its schedule (tuned on this job's first call
        with statistics, at its requested GPU count) at the job's training progress."""
        spec = job.job.spec
        total = max(1.0, float(spec.max_epochs) * spec.samples_per_epoch)
        progress = min(1.0, job.job.progress.samples_done / total)
        if job.id not in self._schedules:
            grid = measured_or_predicted_grid(
                gpus=requested_count(job),
                batch_sizes=batches,
                frozen_candidates=frozen,
                measured=measured,
                model=model,
                layers=layers,
            )
            column = {k: j for j, k in enumerate(frozen)}

            def best_e(k: int) -> float:
                j = column[k]
                choice = tune_grid(
                    batch_sizes=batches,
                    frozen_candidates=(k,),
                    psi=np.array([psi(k)]),
                    throughput=grid[:, j : j + 1],
                )
                return 0.0 if choice is None else choice.effective_progress

            self._schedules[job.id] = tune_freezeout(
                candidates=frozen, num_layers=layers.num_layers, effective_progress=best_e
            )
        schedule = self._schedules[job.id]
        depth = 0 if schedule is None else schedule.frozen(progress, frozen, layers.num_layers)
        return (depth,)

    def schedule(self, job_id: int) -> FreezeOut | None:
        """The FreezeOut schedule tuned for a job (None: not tuned yet, or no freezing)."""
        return self._schedules.get(job_id)

    def _layer_table(self, job_id: int, spec: JobSpec) -> LayerTable:
        """The job's layer table, built once while its spec is unchanged (a snapshot holds a
        fresh but equal spec each round)."""
        known = self._layers.get(job_id)
        if known is not None and known[0] == spec:
            return known[1]
        key = (spec.layer_flops, spec.layer_param_bytes, spec.layer_boundaries)
        layers = self._tables.get(key)
        if layers is None:
            layers = self._tables[key] = LayerTable(*key)
        self._layers[job_id] = (spec, layers)
        return layers

    def _model(
        self, job: JobSnapshot, cached: _Cached, layers: LayerTable, gpus_per_node: int
    ) -> ThroughputModel:
        """The job's fitted model, refitted when stale and the round's budget allows (first
        for the jobs :meth:`new_round` picked)."""
        if cached.model is not None and not cached.stale:
            return cached.model
        if cached.prior:
            cached.model = self._prior_model(job, layers, gpus_per_node, cached.modelled)
            cached.stale = False
            cached.version += 1
            return cached.model
        if job.id in self._first or self._budget != 0:
            if job.id in self._first:
                self._first.discard(job.id)
            else:
                self._budget -= self._budget > 0
            cached.model, cached.stale = cached.history.model(), False
            cached.version += 1
            return cached.model
        if cached.model is not None:
            return cached.model  # refitted in a later round
        return self._prior_model(job, layers, gpus_per_node, cached.modelled)

    def _prior_model(
        self, job: JobSnapshot, layers: LayerTable, gpus_per_node: int, modelled: Parallelism
    ) -> ThroughputModel:
        """The prior's model, fitted once for each (layer table, samples, node size, model);
        a job's is looked up again only when its spec or the settings change."""
        mine = (job.job.spec, gpus_per_node, modelled, self._gpu)
        known = self._prior_of.get(job.id)
        if known is not None and known[0] == mine:
            return known[1]
        samples = _prior(job.job.spec, modelled, layers, gpus_per_node, self._gpu)
        key = (layers, samples, gpus_per_node, modelled)
        if key not in self._priors:
            history = _history(layers, gpus_per_node, modelled)
            history.add(samples)
            self._priors[key] = history.model()
        self._prior_of[job.id] = (mine, self._priors[key])
        return self._priors[key]

    def _models(
        self, job: JobSnapshot, layers: LayerTable, gpus_per_node: int, modelled: Parallelism
    ) -> _Cached:
        samples = job.view.samples
        cached = self._cache.get(job.id)
        measured = any(not s.shared for s in samples)
        if (
            cached is None
            or (cached.prior and measured)
            or cached.modelled != modelled
            or cached.layers is not layers  # registered again with other layers
        ):
            history = _history(layers, gpus_per_node, modelled)
            cached = _Cached(0, history, prior=not measured, modelled=modelled, layers=layers)
            if not measured:
                history.add(_prior(job.job.spec, modelled, layers, gpus_per_node, self._gpu))
            self._cache[job.id] = cached
        if cached.samples != len(samples) or cached.samples == 0:
            cached.stale |= cached.history.add(_in_spec(job.job.spec, samples[cached.samples :]))
            cached.samples = len(samples)
        return cached

    def forget(self, keep: set[int]) -> None:
        """Drop the models of jobs that are gone, and the layer tables and prior models no
        job uses any more (a job registered again with other layers leaves its old ones)."""
        for job_id in set(self._cache) - keep:
            del self._cache[job_id]
        for job_id in set(self._schedules) - keep:
            del self._schedules[job_id]
        for job_id in set(self._layers) - keep:
            del self._layers[job_id]
        for job_id in set(self._prior_of) - keep:
            del self._prior_of[job_id]
        self._unfrozen &= keep
        self._failing &= keep
        live = {id(layers) for _, layers in self._layers.values()}
        self._tables = {k: t for k, t in self._tables.items() if id(t) in live}
        used = {id(model) for _, model in self._prior_of.values()}
        self._priors = {k: m for k, m in self._priors.items() if id(m) in used}


def requested_count(job: JobSnapshot) -> int:
    """The GPUs the job's Slurm job asks for (1 for a shard or mps job), its smallest legal
    count when unknown."""
    state = job.slurm
    if state is not None and state.gres is not None:
        if state.gres.shared:
            return 1
        return state.gres.count * max(state.num_nodes, 1)
    spec = job.job.spec
    return spec.parallelism.legal_gpu_counts(spec.min_gpus, spec.max_gpus)[0]


def target_metrics(job: JobSnapshot) -> list[tuple[int, float]]:
    """The job's validation reports of its target metric: (epoch, value), oldest first."""
    name = job.job.spec.target_metric
    return [(m.epoch, m.value) for m in job.view.metrics if m.name == name]


def remaining_samples(job: JobSnapshot) -> float:
    """P of eq 16 for a job: :func:`~icefrog_slurm.core.tta.remaining_work` from its declared
    budget, its progress and its validation reports of the target metric."""
    spec, progress = job.job.spec, job.job.progress
    return remaining_work(
        budget=float(spec.max_epochs) * spec.samples_per_epoch,
        done=progress.effective_samples_done,
        samples_done=float(progress.samples_done),
        samples_per_epoch=spec.samples_per_epoch,
        metrics=target_metrics(job),
        target=spec.target_value,
        higher_is_better=spec.target_op == ">=",
    )


def modelled_parallelism(spec: JobSpec, settings: Settings) -> Parallelism:
    """The parallelism whose model estimates the job: its own, or with
    ``policy.large_model_models = false`` DDP for every job (the paper's ablation)."""
    if settings.policy.large_model_models:
        return spec.parallelism
    return Parallelism(Kind.DDP, unit=spec.parallelism.unit)


def _history(layers: LayerTable, gpus_per_node: int, modelled: Parallelism) -> ProfileHistory:
    """A history fitting ``modelled``'s model; a large model's fit starts from one sample
    (the prior holds what the samples cannot inform yet), as the DDP fit does."""
    fitter = fitter_for(modelled, layers, gpus_per_node=gpus_per_node, min_samples=1)
    return ProfileHistory(layers, gpus_per_node=gpus_per_node, fitter=fitter)


@functools.lru_cache(maxsize=1024)
def _prior(
    spec: JobSpec, modelled: Parallelism, layers: LayerTable, gpn: int, gpu: GpuModel
) -> tuple[ProfileSample, ...]:
    """Assumed samples from the declared tables (``prior_iteration_time``), unfrozen: the
    smallest legal count at the smallest and the largest batch, the smallest count of several
    GPUs within a node and the smallest of whole nodes (two or more) at the smallest batch.
    Remembered for the last declarations seen: jobs of one declaration share them."""
    batches = powers_of_two(spec.min_batch, spec.max_batch)
    counts = spec.parallelism.legal_gpu_counts(spec.min_gpus, spec.max_gpus)
    first = counts[0]
    within = [g for g in counts if first < g <= gpn][:1]
    across = [g for g in counts if g > gpn and g % gpn == 0 and g > first][:1]
    configs = [(first, batches[0]), (first, batches[-1])]
    configs += [(g, batches[0]) for g in (*within, *across)]
    out = []
    for gpus, batch in dict.fromkeys(configs):
        t_iter = prior_iteration_time(
            layers, gpu, modelled, gpus=gpus, batch=batch, nodes=nodes_for(gpus, gpn)
        )
        out.append(ProfileSample(
            gpus=gpus, batch=batch, frozen=0, shared=False, t_fwd_s=0.0, t_bwd_s=0.0,
            t_sync_s=0.0, t_iter_s=t_iter,
            samples_per_s=modelled.global_batch(gpus, batch) / t_iter,
        ))  # fmt: skip
    return tuple(out)


def _loads(
    job: JobSnapshot, cached: _Cached, layers: LayerTable, settings: Settings
) -> LoadModel | None:
    """What judges the job's load on a shared GPU: its fitted regressions (eq 8, fitted
    here, once a change of its samples, for the jobs a shared option is considered for);
    before it reported any sample, with ``sharing.before_samples``, its declared tables
    (``core.sharing.DeclaredLoad``); else None (it cannot be judged)."""
    samples = job.view.samples
    if cached.sharing_for != len(samples):
        try:
            cached.sharing = fit_sharing(samples, layers)
        except IcefrogError:
            cached.sharing = None
        cached.sharing_for = len(samples)
    if cached.sharing is not None:
        return cached.sharing
    return None if samples or not settings.sharing.before_samples else DeclaredLoad()


def _tune(prepared: Sequence[_Prepared]) -> None:
    """Tune the options the prepared jobs have not tuned yet, all at once: the jobs with
    batch scaling, those of one shape (global batches asked about, frozen depths, layers)
    together, get their trainable statistics summed in one evaluation and their efficiency
    grids in another; then one :func:`tune_rows` pass over every option. Each choice goes to
    its job's cache. The same choices and floats as one job at a time, and no job's arrays
    are padded to another's size."""
    effs: dict[int, list[FloatArray | None]] = {}
    shapes: dict[tuple[int, int, int], list[_Prepared]] = {}
    for p in prepared:
        if p.scaling is not None and p.todo:
            width = sum(len(batches) for _, batches, _, _ in p.todo)
            shapes.setdefault((width, len(p.frozen), len(p.scaling[0])), []).append(p)
    for members in shapes.values():
        scaling = [p.scaling for p in members if p.scaling is not None]
        var, sqr = trainable_sums(
            np.array([v for v, _, _ in scaling], dtype=float),
            np.array([q for _, q, _ in scaling], dtype=float),
            np.array([p.frozen for p in members], dtype=np.int64),
        )
        batch = np.array(
            [[g * m for (g, _), batches, _, _ in p.todo for m in batches] for p in members],
            dtype=float,
        )
        base = np.array([b for _, _, b in scaling], dtype=float)
        every = efficiency_of_sums(var=var, sqr=sqr, global_batches=batch, base_batch=base)
        for grid, p in zip(every, members, strict=True):
            mine, start = effs.setdefault(id(p), []), 0
            for _, batches, _, _ in p.todo:
                mine.append(grid[start : start + len(batches)])
                start += len(batches)
    rows, keys = [], []
    for p in prepared:
        mine = effs.get(id(p)) or [None] * len(p.todo)
        for (key, batches, grid, lam), eff in zip(p.todo, mine, strict=True):
            rows.append(TuneRow(batches, p.frozen, p.psi, grid, eff, lam, p.current_frozen))
            keys.append((p.cached, key))
    for (cached, key), choice in zip(keys, tune_rows(rows), strict=True):
        cached.tuned[key] = choice
    for p in prepared:
        p.todo = []


def _finish(prepared: _Prepared, settings: Settings) -> tuple[Candidate, ...]:
    """The job's candidates from its tuned options: T_acc of each (eq 16), a move charged
    the reallocation overhead, a shared one with its predicted load."""
    job, cached, layers = prepared.job, prepared.cached, prepared.layers
    out: list[Candidate] = []
    for gpus, shared in prepared.configs:
        best = cached.tuned[gpus, shared]
        if best is None:
            continue
        tta = time_to_accuracy(
            age_s=prepared.age,
            remaining=prepared.remaining,
            effective_progress=best.effective_progress,
        )
        cur = job.current
        if cur.gpus and (cur.gpus, cur.shared) != (gpus, shared):
            tta += settings.controller.reallocation_overhead_s
        if not math.isfinite(tta) or tta <= 0:
            continue
        loads = _loads(job, cached, layers, settings) if shared else None
        load = None
        if loads is not None:
            load = loads.predict(batch=best.batch, frozen=best.frozen, layers=layers)
        out.append(Candidate(gpus, shared, best, tta, load))
    return tuple(out)


def _in_spec(spec: JobSpec, samples: Sequence[ProfileSample]) -> list[ProfileSample]:
    """The samples of configurations the job's declaration allows (a legal GPU count, or one
    shared GPU; a per-GPU batch in its range; at most its layers frozen): a user's report of
    others would only add configurations for every fit of the job to read."""
    counts = _legal_counts(spec.parallelism, spec.min_gpus, spec.max_gpus)
    layers = len(spec.layer_flops)
    return [
        s
        for s in samples
        if (s.gpus in counts or (s.shared and s.gpus == 1))
        and spec.min_batch <= s.batch <= spec.max_batch
        and 0 <= s.frozen <= layers
    ]


@functools.lru_cache(maxsize=256)
def _legal_counts(parallelism: Parallelism, lo: int, hi: int) -> frozenset[int]:
    return frozenset(parallelism.legal_gpu_counts(lo, hi))


def exploration_cap(job: JobSnapshot) -> int:
    """The most GPUs a job may be offered when exploring (AdaptDL's rule, ``max_replicas =
    max(2 x max_profiled_replicas, 1)``): twice the largest GPU count it has measured
    (unshared), and its smallest legal count before it measured any. A prediction for a
    count far beyond what was measured is not trusted; one within twice it is tried,
    measured, and corrected by the refit."""
    spec = job.job.spec
    measured = max((s.gpus for s in job.view.samples if not s.shared), default=0)
    first = spec.parallelism.legal_gpu_counts(spec.min_gpus, spec.max_gpus)
    return max(2 * measured, first[0] if first else spec.min_gpus)


def _configurations(
    job: JobSnapshot,
    gpn: int,
    cap: int,
    capacity: int,
    settings: Settings,
    cached: _Cached,
    layers: LayerTable,
) -> list[tuple[int, bool]]:
    spec = job.job.spec
    top = min(spec.max_gpus, capacity, cap)
    counts = spec.parallelism.legal_gpu_counts(spec.min_gpus, top) if top >= spec.min_gpus else ()
    out = [(g, False) for g in counts if g <= gpn or g % gpn == 0]
    if (
        spec.accepts_shared
        and spec.parallelism == DDP
        and spec.min_gpus == 1
        and settings.sharing.max_jobs_per_gpu >= 2
        and _loads(job, cached, layers, settings) is not None
        and capacity >= 1
    ):
        out.append((1, True))
    return out
