"""The evaluation tables, made from the runs' ``summary.json`` documents (by run key): each
is a header, rows of cells and the raw numbers behind them. A missing run shows as ``-``.

Solver time is ``summary.json``'s ``solver_s``: ICEFROG reports its IceShare solve and
placement alone, the baselines their whole ``decide`` (docs/evaluation.md).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from icefrog_slurm.errors import InputError
from icefrog_slurm.evaluation.grid import (
    FIDELITY_APPS,
    Grid,
    faithful_runs,
    fidelity_runs,
    main_run,
    published_path,
    scale_run,
    sharing_run,
)
from icefrog_slurm.evaluation.runs import Run
from icefrog_slurm.jsonio import expect_object
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.userfiles import read_text

SIZES = ("small", "medium", "large", "xlarge")
PAPER_PHYSICAL = {"lucid+": 1.94, "optimus+": 1.84, "pollux+": 1.51}  # 48 GPUs (spec 14)
PAPER_SIMULATED = {"lucid+": "1.71-2.20", "optimus+": "1.34-4.21", "pollux+": "1.10-2.80"}
PAPER_TTA = "1.2-1.8"
PAPER_BATCH_SCALING = "1.16-1.21"  # ICEFROG with batch scaling over without (spec 15)
BATCH_ROWS = ("icefrog-paper", "icefrog", "pollux+")  # the batch table's rows
FAITHFUL_PUBLISHED = {0.5: 1.56, 1.5: 1.97, 2.0: 1.84}  # Optimus / Pollux avg JCT, Pollux

Table = tuple[list[str], list[list[str]], dict[str, Any]]  # header, rows, raw numbers


def _h(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600


def _ratios(top: Sequence[float | None], bottom: Sequence[float | None]) -> list[float | None]:
    """top / bottom pairwise; None where either is missing or 0."""
    return [a / b if a and b else None for a, b in zip(top, bottom, strict=True)]


def _spread(values: Iterable[float | None], fmt: str = "{:.2f}", unit: str = "") -> str:
    """``mean (min-max)`` over the values that exist; ``-`` when none."""
    vs = [v for v in values if v is not None and math.isfinite(v)]
    if not vs:
        return "-"
    mean = fmt.format(statistics.fmean(vs)) + unit
    if len(vs) == 1:
        return mean
    return f"{mean} ({fmt.format(min(vs))}-{fmt.format(max(vs))})"


def _totals(doc: dict[str, Any] | None) -> dict[str, Any]:
    return {} if doc is None else dict(doc["totals"])


def _unfinished(docs: Iterable[dict[str, Any] | None]) -> str:
    n = sum(t["jobs"] - t["finished"] for t in map(_totals, docs) if t)
    missing = sum(d is None for d in docs)
    parts = [str(n)] + ([f"{missing} run(s) missing"] if missing else [])
    return ", ".join(parts)


SPEEDUP_COLUMNS = ("ICEFROG speedup (its JCT / ICEFROG's)",
                   "ICEFROG paper-protocol speedup (its JCT / that row's)")  # fmt: skip
"""main's and scale's speedup columns: over each ICEFROG row (:func:`_over_icefrog`)."""


def main_key(g: Grid, w: float, s: int, p: str) -> str:
    return main_run(g, w, s, p).key


def _over_icefrog(
    jct: dict[str, list[float | None]], p: str
) -> dict[str, list[float | None] | None]:
    """Row ``p``'s JCTs over each ICEFROG row's, seed by seed (``jct``: the row's per seed);
    None for a row against itself or one that did not run."""
    return {b: _ratios(jct[p], jct[b]) if b in jct and b != p else None
            for b in ("icefrog", "icefrog-paper")}  # fmt: skip


def table_main(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    """Average JCT per row and load, and per seed each row's JCT over ICEFROG's (batch
    and layer elasticity) and over ICEFROG's under the paper's protocol, where those rows ran."""
    header = ["load", "policy", "avg JCT h, mean (min-max)", *SPEEDUP_COLUMNS,
              "paper physical (48 GPUs)", "paper simulated", "jobs unfinished"]  # fmt: skip
    rows, raw = [], {}
    for w in g.loads:
        jct = {
            p: [_totals(res[main_key(g, w, s, p)]).get("avg_jct_s") for s in g.seeds]
            for p in g.policies
        }
        for p in g.policies:
            docs = [res[main_key(g, w, s, p)] for s in g.seeds]
            over = _over_icefrog(jct, p)
            raw[f"load{w:g}/{p}"] = {"seeds": list(g.seeds), "avg_jct_s": jct[p],
                                     "speedup": over["icefrog"],
                                     "paper_protocol_speedup": over["icefrog-paper"]}  # fmt: skip
            rows.append([
                f"{w:g}x", p, _spread(map(_h, jct[p])),
                *("-" if v is None else _spread(v, unit="x") for v in over.values()),
                f"{PAPER_PHYSICAL[p]:.2f}x" if p in PAPER_PHYSICAL else "",
                f"{PAPER_SIMULATED[p]}x" if p in PAPER_SIMULATED else "",
                _unfinished(docs),
            ])  # fmt: skip
    return header, rows, raw


def table_size(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    """Per load and policy: each size class's JCT, and what makes it (the class's wait
    before its first start, its hours from first start to finish and its GPUs there, the
    seed means of :func:`_job_means`), and the GPU-hours and span of the whole run."""
    sizes = sorted(
        {k for d in res.values() if d for k in d["totals"]["jct_by_size_s"]},
        key=lambda k: SIZES.index(k) if k in SIZES else len(SIZES),
    )  # fmt: skip
    header = ["load", "policy", *[f"{k} JCT h (jobs)" for k in sizes],
              *[f"{k} wait / run h, GPUs" for k in sizes], "GPU-hours, span h"]  # fmt: skip
    rows, raw = [], {}
    for w in g.loads:
        for p in g.policies:
            docs = [res[main_key(g, w, s, p)] for s in g.seeds]
            ts = [_totals(d) for d in docs]
            means = [_job_means(d, "size", reached=False) for d in docs if d]
            cells, parts = [], []
            for k in sizes:
                vals = [_h(t["jct_by_size_s"].get(k)) for t in ts if t]
                jobs = [t["jobs_by_size"].get(k, 0) for t in ts if t]
                _, gpus, wait, run = ([m[k][i] for m in means if k in m] for i in range(4))
                raw[f"load{w:g}/{p}/{k}"] = {"jct_h": vals, "jobs": jobs, "wait_h": wait,
                                             "run_h": run, "gpus": gpus}  # fmt: skip
                n = f" ({statistics.fmean(jobs):.0f})" if jobs else ""
                cells.append(_spread(vals) + n)
                parts.append(f"{_mean(wait)} / {_mean(run)}, {_mean(gpus)}")
            spans = [_span(d) for d in docs if d]
            gpu_h, span_h = [x[0] for x in spans], [x[1] for x in spans]
            raw[f"load{w:g}/{p}"] = {"gpu_hours": gpu_h, "span_h": span_h}
            whole = f"{_spread(gpu_h, '{:.0f}')}, {_spread(span_h, '{:.1f}')}"
            rows.append([f"{w:g}x", p, *cells, *parts, whole])
    return header, rows, raw


def _mean(values: Sequence[float]) -> str:
    return f"{statistics.fmean(values):.2f}" if values else "-"


def _span(doc: dict[str, Any]) -> tuple[float, float]:
    """The run's GPU-hours over all its jobs, and its span (h): its first submission to its
    last finish."""
    ended = [j["finish"] for j in doc["jobs"] if j["finish"] is not None]
    first = min((j["submit"] for j in doc["jobs"]), default=0.0)
    return sum(j["gpu_hours"] for j in doc["jobs"]), (max(ended, default=first) - first) / 3600


def _job_means(
    doc: dict[str, Any] | None, by: str, *, reached: bool
) -> dict[str, tuple[float, float, float, float]]:
    """Per value of the jobs' field ``by``, means over its jobs that ran to their end (with
    ``reached``, those that reached the target only): JCT, submit to end (s); GPUs from
    first start to the end (GPU-hours / those hours: a paused job counts 0 while paused);
    wait before the first start (h); hours from the first start to the end."""
    by_value: dict[str, list[tuple[float, float, float, float]]] = {}
    for j in [] if doc is None else doc["jobs"]:
        if j["jct_s"] is None or j["start"] is None or (reached and not j["reached_target"]):
            continue
        span_h = (j["finish"] - j["start"]) / 3600
        gpus = j["gpu_hours"] / span_h if span_h > 0 else 0.0
        by_value.setdefault(j[by], []).append(
            (j["jct_s"], gpus, (j["start"] - j["submit"]) / 3600, span_h)
        )
    out = {}
    for v, xs in by_value.items():
        jct, gpus, wait, run = (statistics.fmean(column) for column in zip(*xs, strict=True))
        out[v] = (jct, gpus, wait, run)
    return out


def _pair(a: Iterable[float | None], b: Iterable[float | None], fmt: str) -> str:
    """``a / b``: the seed means of two rows' figures (``-`` for a row with none)."""
    cells = []
    for vs in (a, b):
        got = [v for v in vs if v is not None]
        cells.append(fmt.format(statistics.fmean(got)) if got else "-")
    return " / ".join(cells)


def table_tta(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    """Per load and task: ICEFROG's (batch and layer elasticity) and Pollux+'s time to
    accuracy, their ratio per seed, and what explains it: the GPUs each gave the task's jobs
    and how long they waited to start."""
    header = ["load", "task", "jobs (seed mean)", "ICEFROG TTA h", "Pollux+ TTA h",
              "Pollux+ / ICEFROG", "GPUs, ICEFROG / Pollux+", "wait h, ICEFROG / Pollux+",
              "paper"]  # fmt: skip
    rows, raw = [], {}
    for w in g.loads:
        ice = {s: _job_means(res[main_key(g, w, s, "icefrog")], "task", reached=True)
               for s in g.seeds}  # fmt: skip
        pol = {s: _job_means(res[main_key(g, w, s, "pollux+")], "task", reached=True)
               for s in g.seeds}  # fmt: skip
        tasks = sorted({t for s in g.seeds for t in ice[s]} | {t for s in g.seeds for t in pol[s]})
        for t in tasks:
            # per seed, for ICEFROG and for Pollux+: TTA (s), GPUs, wait (h)
            (a, gpus_i, wait_i), (b, gpus_p, wait_p) = (
                [[None if (x := by[s].get(t)) is None else x[k] for s in g.seeds]
                 for k in range(3)]
                for by in (ice, pol)
            )  # fmt: skip
            ratio = _ratios(b, a)
            n = [sum(j["task"] == t for j in d["jobs"]) for s in g.seeds
                 if (d := res[main_key(g, w, s, "icefrog")]) is not None]  # fmt: skip
            raw[f"load{w:g}/{t}"] = {
                "icefrog_s": a, "pollux_s": b, "ratio": ratio,
                "gpus": {"icefrog": gpus_i, "pollux": gpus_p},
                "wait_h": {"icefrog": wait_i, "pollux": wait_p},
            }  # fmt: skip
            rows.append([f"{w:g}x", t, f"{statistics.fmean(n):.1f}" if n else "-",
                         _spread(map(_h, a)), _spread(map(_h, b)), _spread(ratio, unit="x"),
                         _pair(gpus_i, gpus_p, "{:.1f}"), _pair(wait_i, wait_p, "{:.2f}"),
                         f"{PAPER_TTA}x"])  # fmt: skip
    return header, rows, raw


def table_scale(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    """One row a policy and scale point: its average JCT over ICEFROG's (batch and layer
    elasticity) and over ICEFROG's under the paper's protocol, where those rows ran."""
    header = ["load", "GPUs", "policy", "jobs (unfinished)", "avg JCT h", *SPEEDUP_COLUMNS,
              "solver s/round mean", "solver s/round max", "sim wall s"]  # fmt: skip
    rows, raw = [], {}
    for w, n in g.scale:
        totals = {p: _totals(res[scale_run(g, w, n, p).key]) for p in g.policies}
        jct = {p: [t.get("avg_jct_s")] for p, t in totals.items()}
        for p, t in totals.items():
            over = _over_icefrog(jct, p).values()
            raw[f"{n}/{p}"] = t
            rows.append([
                f"{w:g}x", str(n), p,
                f"{t['jobs']} ({t['jobs'] - t['finished']})" if t else "no run",
                _spread(map(_h, jct[p])),
                *("-" if v is None else _spread(v, "{:.2f}", "x") for v in over),
                _spread([t.get("solver_s_mean")], "{:.3f}"),
                _spread([t.get("solver_s_max")], "{:.3f}"),
                _spread([t.get("wall_s")], "{:.0f}"),
            ])  # fmt: skip
    return header, rows, raw


def table_solver(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    header = ["GPUs", "load", "policy", "runs", "rounds (mean)", "solver s/round mean",
              "solver s/round max"]  # fmt: skip
    groups: dict[tuple[int, float, str], list[dict[str, Any]]] = {}
    named = [(g.gpus, w, p, main_run(g, w, s, p)) for w in g.loads for s in g.seeds
             for p in g.policies]  # fmt: skip
    named += [(n, w, p, scale_run(g, w, n, p)) for w, n in g.scale for p in g.policies]
    for n, w, p, r in named:
        doc = res.get(r.key)
        if doc is not None:
            groups.setdefault((n, w, p), []).append(doc["totals"])
    rows, raw = [], {}
    for (n, w, p), ts in sorted(groups.items()):
        raw[f"{n}/{w:g}/{p}"] = [
            {k: t[k] for k in ("rounds", "solver_s_mean", "solver_s_max")} for t in ts
        ]
        rows.append([str(n), f"{w:g}x", p, str(len(ts)),
                     f"{statistics.fmean(t['rounds'] for t in ts):.0f}",
                     _spread([t["solver_s_mean"] for t in ts], "{:.3f}"),
                     f"{max(t['solver_s_max'] for t in ts):.3f}"])  # fmt: skip
    return header, rows, raw


def table_ablation(
    rows_in: Sequence[tuple[str, tuple[Run, ...]]], res: dict[str, dict[str, Any] | None]
) -> Table:
    """One row a variant: its figures as mean (min-max) over the seeds; the JCT ratio is taken
    per seed against the "as is" run on the same trace (the first row)."""
    header = ["ICEFROG variant", "seeds", "avg JCT h", "JCT / as-is JCT", "jobs unfinished",
              "reallocations", "GPU-hours", "sim wall s"]  # fmt: skip
    base = {r.seed: _totals(res.get(r.key)).get("avg_jct_s") for r in rows_in[0][1]}
    rows, raw = [], {}
    for label, runs in rows_in:
        docs = [res.get(r.key) for r in runs]
        ts = [_totals(d) for d in docs]
        jct = [t.get("avg_jct_s") for t in ts]
        ratio = _ratios(jct, [base.get(r.seed) for r in runs])
        raw[label] = {"seeds": [r.seed for r in runs], "totals": ts, "ratio": ratio}
        rows.append([
            label, str(sum(d is not None for d in docs)), _spread(map(_h, jct)),
            _spread(ratio), _unfinished(docs),
            _spread([t.get("reallocations") for t in ts], "{:.0f}"),
            _spread([t.get("gpu_hours") for t in ts], "{:.0f}"),
            _spread([t.get("wall_s") for t in ts], "{:.0f}"),
        ])  # fmt: skip
    return header, rows, raw


def table_batch(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    """ICEFROG under the paper's protocol, ICEFROG with batch and layer elasticity, Pollux+
    (``main``'s runs): average JCT per load, and per seed the paper-protocol JCT / its JCT
    (the paper's batch-elasticity gain) and Pollux+'s JCT / its."""
    header = ["load", "policy", "avg JCT h, mean (min-max)",
              "ICEFROG paper protocol / it", "Pollux+ / it",
              "paper (batch scaling over the paper protocol)", "jobs unfinished"]  # fmt: skip
    rows, raw = [], {}
    for w in g.loads:
        docs = {p: [res.get(main_key(g, w, s, p)) for s in g.seeds] for p in BATCH_ROWS}
        jct = {k: [_totals(d).get("avg_jct_s") for d in ds] for k, ds in docs.items()}
        for name, ds in docs.items():
            mine = jct[name]
            over_paper, pollux = _ratios(jct["icefrog-paper"], mine), _ratios(jct["pollux+"], mine)
            raw[f"load{w:g}/{name}"] = {
                "seeds": list(g.seeds),
                "avg_jct_s": mine,
                "paper_protocol_over": over_paper,
                "pollux_over": pollux,
            }
            rows.append([
                f"{w:g}x", name, _spread(map(_h, mine)),
                "-" if name == "icefrog-paper" else _spread(over_paper, unit="x"),
                "-" if name == "pollux+" else _spread(pollux, unit="x"),
                f"{PAPER_BATCH_SCALING}x" if name == "icefrog" else "",
                _unfinished(ds),
            ])  # fmt: skip
    return header, rows, raw


def table_sharing(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    """ICEFROG (batch and layer elasticity) with and without sharing on ``main``'s traces: per load,
    average JCT each way, per seed the JCT without / with (the gain of sharing), and how
    much sharing the run with it did (jobs that ever shared a GPU, hours on a shared GPU)."""
    header = ["load", "avg JCT h with sharing", "avg JCT h without",
              "JCT without / with, mean (min-max)", "jobs that shared a GPU",
              "hours on a shared GPU", "jobs unfinished (with, without)"]  # fmt: skip
    rows, raw = [], {}
    for w in g.loads:
        on = [res.get(main_key(g, w, s, "icefrog")) for s in g.seeds]
        off = [res.get(sharing_run(g, w, s).key) for s in g.seeds]
        jct_on = [_totals(d).get("avg_jct_s") for d in on]
        jct_off = [_totals(d).get("avg_jct_s") for d in off]
        gain = _ratios(jct_off, jct_on)
        shared = [_totals(d).get("jobs_shared") for d in on]
        hours = [_totals(d).get("shared_hours") for d in on]
        raw[f"load{w:g}"] = {
            "seeds": list(g.seeds), "with_s": jct_on, "without_s": jct_off, "gain": gain,
            "jobs_shared": shared, "shared_hours": hours,
        }  # fmt: skip
        rows.append([f"{w:g}x", _spread(map(_h, jct_on)), _spread(map(_h, jct_off)),
                     _spread(gain, unit="x"), _spread(shared, "{:.0f}"),
                     _spread(hours, "{:.1f}"),
                     f"{_unfinished(on)}, {_unfinished(off)}"])  # fmt: skip
    return header, rows, raw


def table_faithful(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    header = ["load", "workloads", "Optimus+ avg JCT h", "Pollux+ avg JCT h",
              "ratio, mean (min-max)", "published", "mean within 25 %?"]  # fmt: skip
    runs = faithful_runs(g)
    rows, raw = [], {}
    for w in g.faithful_loads:
        opt, pol, ratio = [], [], []
        for i in range(1, g.workloads + 1):
            pair = {r.policy: res[r.key] for r in runs if r.label.startswith(
                f"faithful-64g-load{w:g}-w{i}-")}  # fmt: skip
            a = _totals(pair["optimus+"]).get("avg_jct_s")
            b = _totals(pair["pollux+"]).get("avg_jct_s")
            opt.append(_h(a))
            pol.append(_h(b))
            ratio.append(a / b if a and b else None)
        got = [r for r in ratio if r is not None]
        pub = FAITHFUL_PUBLISHED.get(w)
        within = "-"
        if got and pub:
            dev = statistics.fmean(got) / pub - 1
            within = f"{'yes' if abs(dev) <= 0.25 else 'no'} ({dev:+.0%})"
        raw[f"{w:g}"] = {"optimus_h": opt, "pollux_h": pol, "ratio": ratio, "published": pub}
        rows.append([f"{w:.1f}", str(len(got)), _spread(opt), _spread(pol),
                     _spread(ratio, unit="x"), "-" if pub is None else f"{pub:.2f}x",
                     within])  # fmt: skip
    return header, rows, raw


FIDELITY_MEDIAN = (0.8, 1.25)  # the goal for each application's median JCT ratio
FIDELITY_AVERAGE = 0.15  # and for the average JCT's


def published_jcts(g: Grid, w: float) -> dict[str, dict[str, float]]:
    """Pollux's published per-job JCTs (s) at load ``w``: workload name -> job -> seconds."""
    path = published_path(g, w)
    try:
        doc = expect_object(
            json.loads(read_text(path, limit=16 << 20, kind="JSON file")), str(path)
        )
        jcts = expect_object(doc.get("jcts"), f"{path}: jcts")
        return {k: {j: float(v) for j, v in expect_object(d, f"{path}: {k}").items()}
                for k, d in jcts.items()}  # fmt: skip
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: not Pollux's published summary: {exc}") from None


def table_fidelity(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    """Pollux+ under ``--gpu-model v100`` against Pollux's published per-job JCTs: per load
    (and all loads), each application's median of our JCT / the published JCT over its
    jobs, and the average JCT ratio (our mean JCT / the published mean over the same jobs)."""
    lo, hi = FIDELITY_MEDIAN
    header = ["load", "workloads", *[f"{a} median (jobs)" for a in FIDELITY_APPS],
              "avg JCT h ours / published", "avg JCT ratio", "unfinished"]  # fmt: skip
    catalog = shipped_catalog()
    runs = fidelity_runs(g)
    ratios: dict[tuple[str, str], list[float]] = {}
    sums: dict[str, list[float]] = {}
    workloads: dict[str, int] = {}
    unfinished: dict[str, int] = {}
    for w in g.faithful_loads:
        published = published_jcts(g, w)
        for run in runs:
            if not run.label.startswith(f"fidelity-64g-load{w:g}-") or res[run.key] is None:
                continue
            doc = res[run.key]
            assert doc is not None
            pub = published.get(Path(str(run.workload)).stem, {})
            for key in (f"{w:.1f}", "all"):
                workloads[key] = workloads.get(key, 0) + 1
            for job in doc["jobs"]:
                theirs = pub.get(job["name"])
                if theirs is None or theirs <= 0:
                    continue
                if job["jct_s"] is None:
                    for key in (f"{w:.1f}", "all"):
                        unfinished[key] = unfinished.get(key, 0) + 1
                    continue
                app = catalog.get(job["task"]).pollux_app or job["task"]
                for key in (f"{w:.1f}", "all"):
                    ratios.setdefault((key, app), []).append(job["jct_s"] / theirs)
                    sums.setdefault(key, [0.0, 0.0, 0.0])
                    sums[key][0] += job["jct_s"]
                    sums[key][1] += theirs
                    sums[key][2] += 1
    rows, raw = [], {}
    for key in [f"{w:.1f}" for w in g.faithful_loads] + ["all"]:
        cells = []
        for app in FIDELITY_APPS:
            vals = ratios.get((key, app), [])
            med = statistics.median(vals) if vals else None
            mark = "" if med is None or lo <= med <= hi else " *"
            cells.append("-" if med is None else f"{med:.2f}{mark} ({len(vals)})")
            raw[f"{key}/{app}"] = {"median": med, "ratios": vals}
        ours, theirs, n = sums.get(key, [0.0, 0.0, 0.0])
        avg = ours / theirs if theirs else None
        mark = "" if avg is None or abs(avg - 1) <= FIDELITY_AVERAGE else " *"
        raw[f"{key}/average"] = {
            "ours_s": ours / n if n else None,
            "published_s": theirs / n if n else None,
            "ratio": avg,
        }
        rows.append([
            key, str(workloads.get(key, 0)), *cells,
            "-" if not n else f"{ours / n / 3600:.2f} / {theirs / n / 3600:.2f}",
            "-" if avg is None else f"{avg:.2f}{mark}", str(unfinished.get(key, 0)),
        ])  # fmt: skip
    return header, rows, raw


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]  # fmt: skip
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
