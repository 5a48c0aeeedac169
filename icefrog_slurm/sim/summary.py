"""summary.json and the plots of ``icefrog simulate``.

Per job: name, task, submit, start, finish, JCT, reached target, GPU-hours, reallocations.
Totals: average JCT (of the jobs that finished), JCT by size class (the task's class in the
catalog), makespan (first submission to last finish), scheduling rounds and solver time per
round (mean and max: the policy's own ``solve_s``, else the tick's time), simulation wall
time. Plots (matplotlib, the optional ``sim`` extra; skipped with a note when absent): JCT
CDF per policy, GPUs in use over time, frozen layers over time for sample jobs.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from icefrog_slurm.sim.catalog import Catalog
from icefrog_slurm.sim.engine import SimResult

SAMPLE_JOBS = 4  # jobs shown in the frozen-layers plot


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
                "reallocations": j.reallocations,
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
        },
        "totals": {
            "jobs": len(jobs), "finished": len(done),
            "reached_target": sum(bool(d["reached_target"]) for d in done),
            "avg_jct_s": statistics.fmean(d["jct_s"] for d in done) if done else None,
            "jct_by_size_s": {k: statistics.fmean(v) for k, v in sorted(by_size.items())},
            "jobs_by_size": {k: len(v) for k, v in sorted(by_size.items())},
            "makespan_s": (max(finishes) - first) if finishes else None,
            "gpu_hours": sum(d["gpu_hours"] for d in jobs),
            "reallocations": sum(d["reallocations"] for d in jobs),
            "rounds": len(result.rounds),
            "solver_s_mean": statistics.fmean(solve) if solve else 0.0,
            "solver_s_max": max(solve, default=0.0),
            "ticks": result.ticks, "wall_s": result.wall_s,
        },
        "jobs": jobs,
    }  # fmt: skip


def write_summary(out: Path, summaries: Mapping[str, dict[str, Any]]) -> Path:
    """summary.json: one policy's document, or ``{"policies": {name: document}}``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    doc = next(iter(summaries.values())) if len(summaries) == 1 else {"policies": summaries}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def write_plots(out: Path, results: Sequence[SimResult]) -> list[Path]:
    """The three plots; an empty list when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        jcts = sorted((j.finish - j.submit) / 3600 for j in r.jobs if j.finish is not None)
        if jcts:
            ax.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], label=r.policy)
    ax.set(xscale="log", xlabel="JCT (hours)", ylabel="fraction of jobs", title="JCT CDF")
    _legend(ax)
    paths.append(_save(fig, out / "jct_cdf.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.step([t / 3600 for t, _ in r.usage], [g for _, g in r.usage], label=r.policy)
    ax.set(xlabel="time (hours)", ylabel="GPUs in use", title="GPUs in use")
    _legend(ax)
    paths.append(_save(fig, out / "gpus_in_use.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        for name, trace in list(r.frozen.items())[:SAMPLE_JOBS]:
            ax.step([t / 3600 for t, _ in trace], [k for _, k in trace], where="post",
                    label=f"{r.policy}: {name}")  # fmt: skip
    ax.set(xlabel="time (hours)", ylabel="frozen layers", title="Frozen layers (sample jobs)")
    _legend(ax, fontsize=6)
    paths.append(_save(fig, out / "frozen_layers.png"))
    return paths


def _legend(ax: Any, **kw: Any) -> None:
    if ax.get_legend_handles_labels()[0]:  # no empty legend (and no warning)
        ax.legend(**kw)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
