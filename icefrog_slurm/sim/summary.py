"""summary.json and the plots of ``icefrog simulate``.

Per job: name, task, submit, start, finish, JCT, reached target, GPU-hours, hours on a
shared GPU, reallocations. Totals: average JCT (of the jobs that finished), JCT by size
class (the task's class in the catalog), makespan (first submission to last finish), GPU-
hours, hours on a shared GPU and the jobs that ever shared one, scheduling rounds and solver
time per round (mean and max: the policy's own ``solve_s``, else the tick's time), simulation
wall time; under ``run``, what reruns it (the command line, the workload's path and sha256, the
seed, the settings in force, the version and commit, the versions of Python, numpy, scipy and
python-mip). Plots (matplotlib, the optional
``sim`` extra; skipped with a note when absent), each policy in its own colour, in
``--plot-format`` png, svg or pdf: ``jct_cdf`` (JCT CDF of every policy), ``gpus_in_use``
(one panel a policy, with the capacity line) and ``frozen_fraction`` (one panel a policy:
frozen layers / layers of up to four jobs that froze, the longest-running, over the hours
since each started).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from icefrog_slurm.sim.catalog import Catalog
from icefrog_slurm.sim.engine import SimResult
from icefrog_slurm.sim.jobs import JobOutcome

SAMPLE_JOBS = 4  # jobs a policy shown in the frozen-fraction plot (``sample_frozen``)
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
"""One colour a policy, the same in every plot (Okabe-Ito: told apart with colour-blindness)."""


def summarize(result: SimResult, catalog: Catalog) -> dict[str, Any]:
    """The summary document of one run (module docstring)."""
    jobs: list[dict[str, Any]] = []
    for j in result.jobs:
        jct = None if j.finish is None else j.finish - j.submit
        jobs.append(
            {
                "name": j.name, "task": j.task, "size": catalog.get(j.task).size_class,
                "submit": j.submit, "start": j.start, "finish": j.finish, "jct_s": jct,
                "reached_target": j.reached_target, "gpu_hours": j.gpu_seconds / 3600,
                "shared_hours": j.shared_seconds / 3600, "reallocations": j.reallocations,
            }
        )  # fmt: skip
    done = [d for d in jobs if d["jct_s"] is not None]
    by_size: dict[str, list[float]] = {}
    for d in done:
        by_size.setdefault(d["size"], []).append(d["jct_s"])
    solve = [r.solve_s if r.solve_s > 0 else r.tick_s for r in result.rounds]
    finishes = [d["finish"] for d in done]
    first = min((j.submit for j in result.jobs), default=0.0)
    return {
        "policy": result.policy,
        "options": {
            "gpus": result.options.gpus, "gpus_per_node": result.options.gpus_per_node,
            "seed": result.options.seed, "freeze": result.options.freeze,
            "share": result.options.share, "fixed_batch": result.options.fixed_batch,
            "profile_noise": result.options.profile_noise,
            "share_noise": result.options.share_noise,
            "gpu_model": result.options.gpu_model,
        },
        "totals": {
            "jobs": len(jobs), "finished": len(done),
            "reached_target": sum(bool(d["reached_target"]) for d in done),
            "avg_jct_s": statistics.fmean(d["jct_s"] for d in done) if done else None,
            "jct_by_size_s": {k: statistics.fmean(v) for k, v in sorted(by_size.items())},
            "jobs_by_size": {k: len(v) for k, v in sorted(by_size.items())},
            "makespan_s": (max(finishes) - first) if finishes else None,
            "gpu_hours": sum(d["gpu_hours"] for d in jobs),
            "shared_hours": sum(d["shared_hours"] for d in jobs),
            "jobs_shared": sum(d["shared_hours"] > 0 for d in jobs),
            "reallocations": sum(d["reallocations"] for d in jobs),
            "rounds": len(result.rounds),
            "solver_s_mean": statistics.fmean(solve) if solve else 0.0,
            "solver_s_max": max(solve, default=0.0),
            "ticks": result.ticks, "wall_s": result.wall_s,
        },
        "jobs": jobs,
    }  # fmt: skip


def write_summary(
    out: Path,
    summaries: Mapping[str, dict[str, Any]],
    *,
    run: Mapping[str, Any] | None = None,
    several: bool = False,
    pending: Sequence[str] = (),
) -> Path:
    """summary.json: one policy's document, or ``{"policies": {name: document}}`` (always
    with ``several``); with ``run`` (what reruns it: ``commands.simulate.rerun_record``)
    under the key ``run``, and with ``pending`` (the policies still to run) under
    ``pending``. Written to a temporary file renamed over it: a reader never sees half."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    one = len(summaries) == 1 and not several
    doc: dict[str, Any] = (
        dict(next(iter(summaries.values()))) if one else {"policies": dict(summaries)}
    )
    if run is not None:
        doc["run"] = dict(run)
    if pending:
        doc["pending"] = list(pending)
    tmp = path.with_name(f".summary.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def write_plots(
    out: Path, results: Sequence[SimResult], catalog: Catalog, *, fmt: str = "png"
) -> list[Path]:
    """The three plots in ``fmt`` (png, svg or pdf); an empty list without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    colours = {r.policy: COLOURS[i % len(COLOURS)] for i, r in enumerate(results)}
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        jcts = sorted((j.finish - j.submit) / 3600 for j in r.jobs if j.finish is not None)
        if jcts:
            ax.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post",
                    label=r.policy, color=colours[r.policy])  # fmt: skip
    ax.set(xscale="log", xlabel="JCT (hours)", ylabel="fraction of jobs", title="JCT CDF")
    ax.grid(alpha=0.3)
    _legend(ax)
    paths.append(_save(fig, out / f"jct_cdf.{fmt}"))
    fig, axes = _panels(plt, len(results))
    for ax, r in zip(axes, results, strict=True):
        ax.step([t / 3600 for t, _ in r.usage], [g for _, g in r.usage], where="post",
                color=colours[r.policy], label="in use")  # fmt: skip
        ax.axhline(r.options.gpus, color="black", linestyle="--", linewidth=1, label="capacity")
        ax.set(ylabel="GPUs", ylim=(0, r.options.gpus * 1.08), title=r.policy)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=7)
    axes[-1].set_xlabel("time (hours)")
    fig.suptitle("GPUs in use")
    paths.append(_save(fig, out / f"gpus_in_use.{fmt}"))
    fig, axes = _panels(plt, len(results), sharex=False)
    for ax, r in zip(axes, results, strict=True):
        for job, trace in sample_frozen(r):
            layers = catalog.layers(job.task).num_layers
            begun = job.start if job.start is not None else trace[0][0]
            ax.step([(t - begun) / 3600 for t, _ in trace], [k / layers for _, k in trace],
                    where="post", label=f"{job.name} ({job.task})")  # fmt: skip
        if not r.frozen:
            ax.text(0.5, 0.5, "no job froze a layer", ha="center", va="center",
                    transform=ax.transAxes)  # fmt: skip
        ax.set(ylabel="frozen fraction", ylim=(0, 1), title=r.policy)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=6, loc="upper right")
    axes[-1].set_xlabel("hours since the job started")
    fig.suptitle(f"Frozen layers / layers (the {SAMPLE_JOBS} longest jobs that froze)")
    paths.append(_save(fig, out / f"frozen_fraction.{fmt}"))
    return paths


def sample_frozen(r: SimResult) -> list[tuple[JobOutcome, list[tuple[float, int]]]]:
    """Up to SAMPLE_JOBS jobs that froze layers, the longest-running first (one a task
    before a second of the same task), each with its (time, frozen layers) trace carried to
    its finish."""
    froze = sorted(
        (j for j in r.jobs if j.name in r.frozen),
        key=lambda j: -((j.finish or r.end_time) - (j.start or j.submit)),
    )
    picked: list[JobOutcome] = []
    for j in froze:  # one a task first
        if len(picked) < SAMPLE_JOBS and all(p.task != j.task for p in picked):
            picked.append(j)
    picked += [j for j in froze if j not in picked][: SAMPLE_JOBS - len(picked)]
    out = []
    for j in picked:
        trace = list(r.frozen[j.name])
        end = j.finish if j.finish is not None else r.end_time
        if end > trace[-1][0]:
            trace.append((end, trace[-1][1]))
        out.append((j, trace))
    return out


def _panels(plt: Any, n: int, *, sharex: bool = True) -> tuple[Any, list[Any]]:
    """One panel a policy, stacked (sharing the time axis unless told)."""
    fig, axes = plt.subplots(max(n, 1), 1, figsize=(7, 1.9 * max(n, 1) + 0.6), sharex=sharex,
                             squeeze=False)  # fmt: skip
    return fig, list(axes[:, 0])


def _legend(ax: Any, **kw: Any) -> None:
    if ax.get_legend_handles_labels()[0]:  # no empty legend (and no warning)
        ax.legend(**kw)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
