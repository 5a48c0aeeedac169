"""``icefrog simulate``: run a workload through the production controller, simulated.

    icefrog simulate --workload w.csv --gpus 48 --gpus-per-node 4 --policy all --seed 1 \\
        --out results/ [--no-freeze] [--no-share] [--no-large-models] \\
        [--config FILE] [--set SECTION.KEY=VALUE ...] [--profile-noise SD] [--share-noise SD] \\
        [--plot-format png|svg|pdf] [--gpu-model a800|v100] [--quiet]

Each policy runs the same workload on the same hidden truth (seeded by ``--seed``) with the
engine of ``icefrog_slurm/sim/engine.py``; ``all`` is ICEFROG, Lucid+, Optimus+, Pollux+
and ``slurm``, plain Slurm (FIFO with EASY backfill on the requested GPUs at the requested
batch: ``policies/plain_slurm.py``; its time limits: :func:`slurm_time_limits`). Writes
``summary.json`` (one policy's document, or ``{"policies": {...}}`` for several, and under
``run`` what reruns it: :func:`rerun_record`; with several, rewritten as each policy
finishes, with ``pending`` naming those still to run until the last is done) and, with
matplotlib installed (extra ``sim``), the plots ``jct_cdf``, ``gpus_in_use`` and
``frozen_fraction`` in ``--plot-format``. Progress on stderr (``sim/progress.py``: a bar
on a terminal, plain lines in a log) unless ``--quiet``. Settings (round period,
reallocation overhead, sharing) come from ``--config`` when given, else the defaults, with
each ``--set SECTION.KEY=VALUE`` on top (checked by the same loader: an unknown key or a bad
value exits 2 naming it);
``--profile-noise`` / ``--share-noise`` set the noise on the profiled times / on the peak
memory and utilisation the jobs report (the noise ablation of spec section 15; defaults:
the truth's constants); ``--no-large-models`` sets
``[policy] large_model_models = false`` on top (the DDP model for every job, the paper's
ablation; the LLaMA jobs keep their allocation unit). ``--batch paper`` (default): as in the paper's
evaluation (spec section 12) jobs keep the workload's global batch under every policy but
Pollux+, which adapts it (its point); ``fixed`` / ``tuned`` apply one rule to all.
``--gpu-model`` picks the calibration: ``a800`` (default, the paper's cluster: Pollux's
V100 measurements moved by stated factors) or ``v100`` (the measurements as fitted, and
Pollux's applications finishing as AdaptDL's simulator finishes them: ``sim/calibration.py``).
Bad arguments exit with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import icefrog_slurm
from icefrog_slurm.domain.plan import Policy
from icefrog_slurm.errors import InputError
from icefrog_slurm.evaluation.runs import sha256_of, source_commit
from icefrog_slurm.protocol import fixed_per_gpu_batch
from icefrog_slurm.settings import Settings, apply_overrides, load_settings
from icefrog_slurm.sim.calibration import GPU_MODELS, shipped_calibration
from icefrog_slurm.sim.catalog import Catalog, shipped_catalog
from icefrog_slurm.sim.engine import Engine, SimOptions, SimResult
from icefrog_slurm.sim.jobs import MAX_WORK_FACTOR
from icefrog_slurm.sim.progress import Progress
from icefrog_slurm.sim.summary import summarize, write_plots, write_summary
from icefrog_slurm.sim.truth import (
    MEMORY_NOISE,
    PROFILE_TIME_NOISE,
    UTIL_NOISE,
    TaskTruth,
    build_truths,
)
from icefrog_slurm.sim.workload import TraceJob, read_workload
from icefrog_slurm.userfiles import path_arg

POLICIES: dict[str, tuple[str, str]] = {
    "icefrog": ("icefrog_slurm.policies.icefrog", "IcefrogPolicy"),
    "lucid+": ("icefrog_slurm.policies.lucid_plus", "LucidPlusPolicy"),
    "optimus+": ("icefrog_slurm.policies.optimus_plus", "OptimusPlusPolicy"),
    "pollux+": ("icefrog_slurm.policies.pollux_plus", "PolluxPlusPolicy"),
    "slurm": ("icefrog_slurm.policies.plain_slurm", "PlainSlurmPolicy"),
    "standin": ("icefrog_slurm.policies.standin", "StandInPolicy"),
}
ALL = ("icefrog", "lucid+", "optimus+", "pollux+", "slurm")
PLOT_FORMATS = ("png", "svg", "pdf")
SLURM = "slurm"  # plain Slurm: always the requested batch, time limits for its backfill


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", required=True, type=path_arg, help="workload CSV")
    parser.add_argument("--gpus", type=int, default=48, help="GPUs in the cluster (48)")
    parser.add_argument("--gpus-per-node", type=int, default=4, help="GPUs a node (4)")
    parser.add_argument("--policy", default="all", help=f"{'|'.join(POLICIES)}|all")
    parser.add_argument("--seed", type=int, default=0, help="seed of the hidden truth (0)")
    parser.add_argument("--out", required=True, type=path_arg, help="folder for the results")
    parser.add_argument("--no-freeze", action="store_true", help="no job freezes layers")
    parser.add_argument("--no-share", action="store_true", help="no job shares a GPU")
    parser.add_argument(
        "--no-large-models",
        action="store_true",
        help="estimate every job with the DDP model ([policy] large_model_models = false: "
        "the paper's ablation)",
    )
    parser.add_argument(
        "--batch",
        choices=("paper", "fixed", "tuned"),
        default="paper",
        help="global batch: the workload's, fixed, for every policy but pollux+ (and icefrog "
        "with policy.batch_scaling) (paper, spec section 12); fixed for all; or the batch "
        "each policy decides for all (tuned)",
    )
    parser.add_argument("--config", type=path_arg, help="controller settings TOML (defaults)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting on top of --config (repeatable), e.g. "
        "sharing.speed_factor=0.7 or controller.round_period_s=600",
    )
    parser.add_argument(
        "--profile-noise",
        type=float,
        default=PROFILE_TIME_NOISE,
        metavar="SD",
        help="sd of the log noise on each profiled time the jobs report (throughput-model "
        f"noise ablation; default {PROFILE_TIME_NOISE})",
    )
    parser.add_argument(
        "--share-noise",
        type=float,
        default=None,
        metavar="SD",
        help="sd of the noise on reported peak memory (log) and GPU utilisation (absolute, "
        f"0..1), the sharing predictor's inputs (default {MEMORY_NOISE} and {UTIL_NOISE})",
    )
    parser.add_argument(
        "--plot-format",
        choices=PLOT_FORMATS,
        default="png",
        help="file format of the plots (png; svg and pdf are vector)",
    )
    parser.add_argument(
        "--gpu-model",
        default="a800",
        help=f"the GPUs simulated: {' or '.join(GPU_MODELS)} (a800: the paper's cluster; v100: "
        "Pollux's measurements as measured and Pollux's completion rule)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def make_policy(name: str) -> Policy:
    """A fresh policy by its command-line name; InputError when unknown or not installed."""
    if name not in POLICIES:
        raise InputError(f"--policy: unknown {name!r}; choose from {', '.join(POLICIES)}, all")
    module, cls = POLICIES[name]
    try:
        factory: Callable[[], Policy] = getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as exc:
        raise InputError(f"--policy {name}: not available in this build ({exc})") from None
    return factory()


def sim_options(args: argparse.Namespace) -> SimOptions:
    """The simulation options the arguments ask for, checked (InputError naming the option)."""
    options = SimOptions(
        gpus=args.gpus, gpus_per_node=args.gpus_per_node, seed=args.seed,
        freeze=not args.no_freeze, share=not args.no_share,
        profile_noise=args.profile_noise, share_noise=args.share_noise,
        gpu_model=args.gpu_model,
    )  # fmt: skip
    options.check()
    return options


def sim_settings(args: argparse.Namespace) -> Settings:
    """The settings in force: ``--config`` (else the defaults), each ``--set`` on top, then
    ``--no-large-models`` (InputError naming a bad key or value)."""
    settings = load_settings(args.config) if args.config else Settings()
    settings = apply_overrides(settings, args.set)
    if args.no_large_models:
        settings = replace(settings, policy=replace(settings.policy, large_model_models=False))
    return settings


def run(args: argparse.Namespace) -> int:
    options = sim_options(args)
    if not args.workload.is_file():
        what = "is a folder" if args.workload.is_dir() else "no such file"
        raise InputError(f"--workload {args.workload}: {what}")
    _make_folder(args.out)
    settings = sim_settings(args)
    policies = _policies(args.policy)
    catalog = shipped_catalog()
    workload = read_workload(args.workload, catalog)
    record = rerun_record(args, settings)  # before anything runs: the workload as read
    truths = build_truths(catalog, shipped_calibration(options.gpu_model), seed=options.seed)
    check_requests(args.workload, workload, [p.name for p in policies], options, catalog, truths)
    results: list[SimResult] = []
    summaries: dict[str, dict[str, Any]] = {}
    for policy in policies:
        if policy.name == SLURM:
            from icefrog_slurm.policies.plain_slurm import PlainSlurmPolicy  # as make_policy

            assert isinstance(policy, PlainSlurmPolicy)
            policy.time_limits = slurm_time_limits(workload, truths, options, settings)
        fixed = args.batch == "fixed" or (
            args.batch == "paper" and not adapts_batch(policy.name, settings)
        )
        opts = replace(options, fixed_batch=fixed or policy.name == SLURM)
        engine = Engine(
            workload, policy, settings=settings, options=opts, catalog=catalog, truths=truths
        )
        progress = None if args.quiet else Progress(policy.name, len(workload), sys.stderr)
        results.append(engine.run(progress))
        if progress is not None:
            end = results[-1]
            progress.close(end.end_time, sum(j.finish is not None for j in end.jobs))
        summaries[results[-1].policy] = summarize(results[-1], catalog)
        pending = [p.name for p in policies[len(results) :]]
        if pending:  # what is done is kept if a later policy is interrupted
            write_summary(args.out, summaries, run=record, several=True, pending=pending)
    path = write_summary(args.out, summaries, run=record, several=len(policies) > 1)
    plots = write_plots(args.out, results, catalog, fmt=args.plot_format)
    for name, s in summaries.items():
        t = s["totals"]
        jct = "-" if t["avg_jct_s"] is None else f"{t['avg_jct_s'] / 3600:.2f} h"
        print(
            f"{name}: {t['finished']}/{t['jobs']} jobs finished, average JCT {jct}, "
            f"makespan {(t['makespan_s'] or 0) / 3600:.2f} h, simulated in {t['wall_s']:.1f} s"
        )
    note = "" if plots else " (no plots: install the `sim` extra for matplotlib)"
    print(f"wrote {path}{note}")
    return 0


def _make_folder(out: Path) -> None:
    """The results folder, made and written to (a file made and removed) before anything
    runs: a file in its way or a folder that takes no files fails at once."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot make the folder: {exc.strerror or exc}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None


ON_REQUEST = ("lucid+", SLURM)
"""The policies that start a job only on the GPUs it requests (its Slurm job's GPUs): a
request they cannot place waits for ever."""


def check_requests(
    path: Path,
    workload: Sequence[TraceJob],
    policies: Sequence[str],
    options: SimOptions,
    catalog: Catalog,
    truths: Mapping[str, TaskTruth],
) -> None:
    """InputError naming the workload's row when a policy of ``ON_REQUEST`` among
    ``policies`` could never start a job: one asking for more than ``--gpus``, or (Lucid+,
    which runs a job on its requested count only when the job may run on it) one whose
    request, as its Slurm job asks for it (whole nodes past one), is not a count the job
    registers (the other policies choose a job's GPUs within its range)."""
    strict = [p for p in policies if p in ON_REQUEST]
    if not strict:
        return
    for job in workload:
        where = f"{path}:{job.row}: num_replicas {job.gpus}"
        if job.gpus > options.gpus:
            raise InputError(
                f"{where}: more GPUs than --gpus {options.gpus}; {' and '.join(strict)} "
                f"start{'s' if len(strict) == 1 else ''} a job only on the GPUs it requests, "
                "so it would never start"
            )
        if "lucid+" not in strict:
            continue
        per_node = min(job.gpus, options.gpus_per_node)
        asked = per_node * max(1, -(-job.gpus // per_node))  # as Engine._submit asks Slurm
        spec = catalog.get(job.task).job_spec(catalog.layers(job.task))
        app = truths[job.task].pollux_app if job.task in truths else None
        if app is not None:
            spec = app.job_spec(spec)
        counts = spec.parallelism.legal_gpu_counts(spec.min_gpus, spec.max_gpus)
        if asked not in counts:
            nodes = f" ({asked} on whole nodes of {per_node})" if asked != job.gpus else ""
            raise InputError(
                f"{where}{nodes}: {job.task} runs on {_counts(counts)} GPUs here; lucid+ "
                "starts a job only on the GPUs it requests, so it would never start"
            )


def _counts(counts: Sequence[int]) -> str:
    """Legal GPU counts (a range in steps of the unit) as a reader says them."""
    if len(counts) < 2:
        return str(counts[0]) if counts else "no"
    step = counts[1] - counts[0]
    return f"{counts[0]}-{counts[-1]}" + (f" in steps of {step}" if step > 1 else "")


def adapts_batch(policy: str, settings: Settings) -> bool:
    """Whether, under ``--batch paper``, a policy picks its jobs' global batch: Pollux+
    always (spec section 12), ICEFROG with ``policy.batch_scaling`` (spec section 15)."""
    return policy == "pollux+" or (policy == "icefrog" and settings.policy.batch_scaling)


def _policies(choice: str) -> list[Policy]:
    """The chosen policy, or every one of ALL that this build has (a note for the rest)."""
    if choice != "all":
        return [make_policy(choice)]
    out = []
    for name in ALL:
        try:
            out.append(make_policy(name))
        except InputError as exc:
            print(f"skipping {exc}", file=sys.stderr)
    return out


def slurm_time_limits(
    workload: Sequence[TraceJob],
    truths: Mapping[str, TaskTruth],
    options: SimOptions,
    settings: Settings,
) -> dict[str, float]:
    """Each job's Slurm time limit (s) for ``--policy slurm``'s backfill: the workload has
    none, so the user is taken to know the run time exactly (EASY backfill's best case):
    the job's time alone on its requested GPUs and nodes at its own global batch, nothing
    frozen, per the truth (without the hidden per-job factor, mean one), its work capped as
    the simulated job caps it, plus one start's ``controller.reallocation_overhead_s``."""
    limits = {}
    for job in workload:
        truth = truths[job.task]
        spec = truth.task
        per_node = min(job.gpus, options.gpus_per_node)
        nodes = max(1, -(-job.gpus // per_node))
        gpus = per_node * nodes  # what the Slurm job asks for (``Engine._submit``)
        batch = fixed_per_gpu_batch(job.batch_size, gpus, spec.min_batch, spec.max_batch)
        cap = MAX_WORK_FACTOR * spec.max_epochs * spec.samples_per_epoch
        work = min(truth.samples_to_target(job.batch_size), cap)
        rate = truth.throughput(gpus=gpus, batch=batch, frozen=0, nodes=nodes)
        limits[job.name] = settings.controller.reallocation_overhead_s + work / rate
    return limits


def rerun_record(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """What summary.json keeps to rerun this simulation: the command line (every option
    spelled out), the workload's path and sha256, the seed, the settings in force (after
    ``--config`` and every ``--set``), the package version, the git commit of a source
    checkout (None where there is none) and the versions of Python and of the libraries
    the figures depend on (:func:`dependency_versions`)."""
    argv = [
        "icefrog", "simulate", "--workload", str(args.workload), "--gpus", str(args.gpus),
        "--gpus-per-node", str(args.gpus_per_node), "--policy", args.policy,
        "--seed", str(args.seed), "--out", str(args.out), "--batch", args.batch,
        "--profile-noise", repr(args.profile_noise), "--gpu-model", args.gpu_model,
    ]  # fmt: skip
    if args.share_noise is not None:
        argv += ["--share-noise", repr(args.share_noise)]
    if args.config:
        argv += ["--config", str(args.config)]
    for kv in args.set:
        argv += ["--set", kv]
    flags = ("no_freeze", "no_share", "no_large_models")
    argv += [f"--{f.replace('_', '-')}" for f in flags if getattr(args, f)]
    argv += ["--plot-format", args.plot_format]
    commit = source_commit()
    return {
        "argv": argv,
        "workload": {"path": str(args.workload), "sha256": sha256_of(args.workload)},
        "seed": args.seed,
        "sets": list(args.set),
        "config": None if args.config is None else str(args.config),
        "settings": _set_values(asdict(settings)),
        "version": icefrog_slurm.__version__,
        "commit": None if commit == "?" else commit,
        "versions": dependency_versions(),
    }


DEPENDENCIES = ("numpy", "scipy", "mip")
"""The distributions a simulation's figures depend on (mip: python-mip, the MIP solver)."""


def dependency_versions() -> dict[str, str | None]:
    """Python's version and each of DEPENDENCIES' (None where it is not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in DEPENDENCIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _set_values(table: Mapping[str, Any]) -> dict[str, Any]:
    """The settings as their TOML would spell them (a key left unset is left out), so
    ``settings_from_mapping`` reads them back."""
    return {
        k: _set_values(v) if isinstance(v, Mapping) else v
        for k, v in table.items()
        if v is not None
    }
