"""The evaluation tables of docs/evaluation.md, one command each (issue 7).

    PYTHONPATH=. python benchmarks/evaluate.py TABLE [TABLE ...] [--out results/eval] [--jobs 2]

Tables: ``main`` (average JCT and ICEFROG's speedup over each baseline at 48 GPUs, 1x/2x/3x
load, 3 seeds), ``size`` (JCT by size class), ``tta`` (time to accuracy per task, ICEFROG vs
Pollux+), ``solver`` (solver time per round per policy and cluster size), ``scale`` (5x/10x/20x
load on 240/480/960 GPUs), ``ablation`` (ICEFROG at 2x load with one thing changed, 3 seeds),
``faithful`` (Optimus+/Pollux+ on Pollux's workloads); ``all`` is every one. ``size``,
``tta`` and ``solver`` read the runs of ``main`` (and ``solver`` those of ``scale``).

``--no-run`` makes the tables from the runs already in ``--out`` (``-`` where one is missing).
Solver time is ``summary.json``'s ``solver_s``: ICEFROG reports its IceShare solve and
placement alone, the baselines their whole ``decide`` (docs/evaluation.md).

Every simulation is one ``icefrog simulate`` process of one policy writing
``OUT/runs/KEY/summary.json``; KEY is a readable label plus a hash of the simulate arguments,
so a run whose summary.json exists is not rerun (RESUMABLE: rerun the same command after an
interruption; a changed flag makes new runs). A run is written to ``KEY.tmp`` and renamed when
it succeeded, so a killed run leaves no summary. ``run.json`` beside it records the command,
the git commit and the wall time; the table's header line says how many runs were reused and
from which commits (use a fresh ``--out`` after the code changed). Up to ``--jobs`` runs go at
once. Philly workloads come from ``icefrog trace sample`` (``OUT/traces``, with the seed and
the mapping in the JSON sidecar). Each table is printed as markdown and saved to
``OUT/tables/TABLE.md`` with its raw numbers in ``OUT/tables/TABLE.json``.

``--quick``: 16 GPUs, 0.25 load, one seed (and scale 0.5x on 32 GPUs, faithful one workload
at 0.5 load): a smoke test of the runner, not a result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("icefrog", "lucid+", "optimus+", "pollux+")
BASELINES = {"lucid+": "Lucid", "optimus+": "Optimus", "pollux+": "Pollux"}
SIZES = ("small", "medium", "large", "xlarge")
TABLES = ("main", "size", "tta", "solver", "scale", "ablation", "batch", "faithful")
PAPER_PHYSICAL = {"lucid+": 1.94, "optimus+": 1.84, "pollux+": 1.51}  # 48 GPUs (spec 14)
PAPER_SIMULATED = {"lucid+": "1.71-2.20", "optimus+": "1.34-4.21", "pollux+": "1.10-2.80"}
PAPER_TTA = "1.2-1.8"
FAITHFUL_PUBLISHED = {0.5: 1.56, 1.5: 1.97, 2.0: 1.84}  # Optimus / Pollux avg JCT, Pollux
SCALE_POINTS = ((5.0, 240), (10.0, 480), (20.0, 960))
ABLATION_LAMBDAS = (0.6, 0.7, 0.8, 0.9, 1.0)
ABLATION_PERIODS_MIN = (1, 2, 5, 10)
ABLATION_NOISE = (0.0, 0.1, 0.25, 0.5)
ABLATION_SHARE_NOISE = (0.5, 1.0)
FREEZEOUT_SET = "policy.freezing=freezeout"
BATCH_SCALING_SET = "policy.batch_scaling=true"
PAPER_BATCH_SCALING = "1.16-1.21"  # ICEFROG with batch scaling over without (spec 15)
DEFAULT_LAMBDA, DEFAULT_PERIOD_S = 0.9, 300.0


# ----- runs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """A Philly workload sampled by ``icefrog trace sample``."""

    load: float
    seed: int
    base_jobs: int
    tasks: str

    @property
    def name(self) -> str:
        tag = f"-t{_hash(self.tasks)}" if self.tasks else ""
        return f"philly-load{self.load:g}-seed{self.seed}-jobs{self.base_jobs}{tag}"


@dataclass(frozen=True)
class Run:
    """One ``icefrog simulate`` of one policy."""

    label: str
    workload: Trace | Path
    policy: str
    gpus: int
    seed: int
    extra: tuple[str, ...] = ()

    def argv(self, workload: Path) -> list[str]:
        return [
            "simulate", "--workload", str(workload), "--gpus", str(self.gpus),
            "--gpus-per-node", "4", "--policy", self.policy, "--seed", str(self.seed),
            *self.extra,
        ]  # fmt: skip

    @property
    def key(self) -> str:
        name = self.workload.name if isinstance(self.workload, Trace) else str(self.workload)
        return f"{self.label}-{_hash(' '.join(self.argv(Path(name))))}"


@dataclass
class Runner:
    """Generates traces and runs simulations that have no summary yet (module docstring)."""

    out: Path
    jobs: int
    philly: Path
    run_missing: bool = True  # False: tables from the runs that exist (--no-run)
    log: Callable[[str], None] = field(default=lambda m: _stderr(m))
    ran: int = 0
    reused: int = 0
    failed: list[str] = field(default_factory=list)
    commits: set[str] = field(default_factory=set)

    def trace_path(self, trace: Trace) -> Path:
        return self.out / "traces" / f"{trace.name}.csv"

    def summary(self, run: Run) -> dict[str, Any] | None:
        path = self.out / "runs" / run.key / "summary.json"
        if not path.is_file():
            return None
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc

    def ensure(self, runs: Sequence[Run]) -> dict[str, dict[str, Any] | None]:
        """Run what is missing (up to ``jobs`` at once); the summaries by run key."""
        unique = list({r.key: r for r in runs}.values())
        if not self.run_missing:
            found = {r.key: self.summary(r) for r in unique}
            self._note_commits([r for r in unique if found[r.key] is not None])
            self.reused += sum(d is not None for d in found.values())
            missing = sum(d is None for d in found.values())
            if missing:
                self.log(f"--no-run: {missing} run(s) missing, shown as -")
            return found
        for trace in sorted({r.workload for r in unique if isinstance(r.workload, Trace)},
                            key=lambda t: t.name):  # fmt: skip
            self._sample(trace)
        todo = [r for r in unique if self.summary(r) is None]
        done = [r for r in unique if r not in todo]
        self.reused += len(done)
        self._note_commits(done)
        if todo:
            self.log(f"{len(todo)} run(s) to do, {len(unique) - len(todo)} done already, "
                     f"{self.jobs} at once")  # fmt: skip
            with ThreadPoolExecutor(max_workers=max(self.jobs, 1)) as pool:
                list(pool.map(self._simulate, todo))
        return {r.key: self.summary(r) for r in unique}

    def _note_commits(self, runs: Sequence[Run]) -> None:
        for r in runs:
            meta = self.out / "runs" / r.key / "run.json"
            if meta.is_file():
                self.commits.add(json.loads(meta.read_text()).get("commit", "?"))

    def _sample(self, trace: Trace) -> None:
        csv = self.trace_path(trace)
        if csv.with_suffix(".json").is_file():
            return
        csv.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            "trace", "sample", "--philly", str(self.philly), "--load", f"{trace.load:g}",
            "--seed", str(trace.seed), "--jobs", str(trace.base_jobs), "--out", str(csv),
        ]  # fmt: skip
        if trace.tasks:
            argv += ["--tasks", trace.tasks]
        self.log(f"sampling {csv.name}")
        proc = _icefrog(argv)
        if proc.returncode != 0:
            raise SystemExit(f"icefrog {' '.join(argv)} failed:\n{proc.stderr}")

    def _simulate(self, run: Run) -> None:
        final = self.out / "runs" / run.key
        tmp = final.with_name(run.key + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        workload = (
            self.trace_path(run.workload) if isinstance(run.workload, Trace) else run.workload
        )
        argv = [*run.argv(workload), "--out", str(tmp), "--quiet"]
        commit = _commit()  # the code the run starts with
        self.log(f"start {run.key}")
        started = time.perf_counter()
        proc = _icefrog(argv)
        wall = time.perf_counter() - started
        (tmp / "log.txt").write_text(proc.stdout + proc.stderr)
        meta = {"argv": ["icefrog", *argv], "commit": commit, "wall_s": wall,
                "returncode": proc.returncode}  # fmt: skip
        (tmp / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
        if proc.returncode != 0 or not (tmp / "summary.json").is_file():
            self.failed.append(run.key)
            self.log(f"FAILED {run.key} (rc {proc.returncode}); see {tmp / 'log.txt'}")
            return
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self.ran += 1
        self.commits.add(commit)
        self.log(f"done  {run.key} in {wall:.0f} s")


def _stderr(message: str) -> None:
    sys.stderr.write(message + "\n")  # one write: lines of parallel runs do not mix
    sys.stderr.flush()


def _icefrog(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def _commit() -> str:
    try:
        proc = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                              capture_output=True, text=True, check=False)  # fmt: skip
    except OSError:
        return "?"
    return proc.stdout.strip() or "?"


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


# ----- what each table runs ---------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """The experiment sizes (the paper's, or ``--quick``'s) and the shared switches."""

    loads: tuple[float, ...] = (1.0, 2.0, 3.0)
    seeds: tuple[int, ...] = (1, 2, 3)
    gpus: int = 48
    policies: tuple[str, ...] = POLICIES
    base_jobs: int = 120
    tasks: str = ""
    ablation_load: float = 2.0
    ablation_seeds: tuple[int, ...] = (1, 2, 3)
    scale: tuple[tuple[float, int], ...] = SCALE_POINTS
    faithful_loads: tuple[float, ...] = (0.5, 1.5, 2.0)
    workloads: int = 3
    pollux: Path = Path("/work/shared/data/pollux")
    common: tuple[str, ...] = ("--batch", "paper")

    def trace(self, load: float, seed: int) -> Trace:
        return Trace(load, seed, self.base_jobs, self.tasks)


def main_runs(g: Grid) -> list[Run]:
    return [
        Run(f"main-{g.gpus}g-load{w:g}-seed{s}-{p}", g.trace(w, s), p, g.gpus, s, g.common)
        for w in g.loads for s in g.seeds for p in g.policies
    ]  # fmt: skip


def scale_runs(g: Grid) -> list[Run]:
    return [
        Run(f"scale-{n}g-load{w:g}-seed1-{p}", g.trace(w, 1), p, n, 1, g.common)
        for w, n in g.scale for p in g.policies
    ]  # fmt: skip


def ablation_rows(g: Grid, freezeout_known: bool) -> list[tuple[str, tuple[Run, ...] | None]]:
    """(row label, one run a seed of ``g.ablation_seeds``); None: skipped (the label says why).
    Rows that equal the defaults (lambda 0.9, period 5 min) reuse the "as is" runs."""

    def run(tag: str, *extra: str) -> tuple[Run, ...]:
        return tuple(
            Run(f"ablation-{g.gpus}g-load{g.ablation_load:g}-seed{s}-icefrog-{tag}",
                g.trace(g.ablation_load, s), "icefrog", g.gpus, s, (*g.common, *extra))
            for s in g.ablation_seeds
        )  # fmt: skip

    base = run("asis")
    rows: list[tuple[str, tuple[Run, ...] | None]] = [
        ("as is (frozen penalty, sharing, lambda 0.9, period 5 min)", base),
        ("freezing off (`--no-freeze`)", run("nofreeze", "--no-freeze")),
        ("sharing off (`--no-share`)", run("noshare", "--no-share")),
        ("batch scaling on (`--set policy.batch_scaling=true`: goodput tuner, decided batch)",
         run("batchscaling", "--set", BATCH_SCALING_SET)),
    ]  # fmt: skip
    if freezeout_known:
        rows.append(("frozen penalty -> tuned FreezeOut", run("freezeout", "--set", FREEZEOUT_SET)))
    else:
        rows.append((f"frozen penalty -> tuned FreezeOut: SKIPPED (`--set {FREEZEOUT_SET}` is "
                     "not a setting in this build)", None))  # fmt: skip
    for lam in ABLATION_LAMBDAS:
        extra = () if lam == DEFAULT_LAMBDA else ("--set", f"sharing.speed_factor={lam:g}")
        rows.append((f"lambda {lam:g}", run(f"lambda{lam:g}", *extra) if extra else base))
    for minutes in ABLATION_PERIODS_MIN:
        s = 60.0 * minutes
        extra = () if s == DEFAULT_PERIOD_S else ("--set", f"controller.round_period_s={s:g}")
        rows.append((f"period {minutes} min", run(f"period{s:g}", *extra) if extra else base))
    for sd in ABLATION_NOISE:
        rows.append(
            (f"throughput noise sd {sd:g}", run(f"noise{sd:g}", "--profile-noise", f"{sd:g}"))
        )
    for sd in ABLATION_SHARE_NOISE:
        rows.append((f"memory/utilisation noise sd {sd:g}",
                     run(f"sharenoise{sd:g}", "--share-noise", f"{sd:g}")))  # fmt: skip
    return rows


def batch_runs(g: Grid) -> list[Run]:
    """ICEFROG with batch scaling on main's traces (what ``main --policies icefrog --set
    policy.batch_scaling=true`` runs: the same labels and arguments)."""
    return [
        Run(f"main-{g.gpus}g-load{w:g}-seed{s}-icefrog", g.trace(w, s), "icefrog", g.gpus, s,
            (*g.common, "--set", BATCH_SCALING_SET))
        for w in g.loads for s in g.seeds
    ]  # fmt: skip


FAITHFUL_PERIOD_S = 60
"""The round period of the faithfulness runs: Pollux's published simulator results come from
AdaptDL's ``simulator/simulator.py``, whose scheduling interval defaults to 60 s (ours is
300 s, ICEFROG's); at 0.5 load, where jobs last minutes, 300 s rounds hide Pollux's edge."""


def faithful_runs(g: Grid) -> list[Run]:
    common = (*g.common, "--no-freeze", "--no-share",
              "--set", f"controller.round_period_s={FAITHFUL_PERIOD_S}")  # fmt: skip
    out = []
    for w in g.faithful_loads:
        for i in range(1, g.workloads + 1):
            path = g.pollux / f"workloads-{w:.1f}" / f"workload-{i}.csv"  # workloads-2.0
            for p in ("optimus+", "pollux+"):
                out.append(Run(f"faithful-64g-load{w:g}-w{i}-{p}", path, p, 64, 1, common))
    return out


def freezeout_known() -> bool:
    """Whether this build has ``policy.freezing`` (added on branch freeze)."""
    sys.path.insert(0, str(ROOT))
    from icefrog_slurm.errors import InputError
    from icefrog_slurm.settings import Settings, apply_overrides

    try:
        apply_overrides(Settings(), [FREEZEOUT_SET])
    except InputError:
        return False
    return True


# ----- tables ------------------------------------------------------------------------------


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


def table_main(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    header = ["load", "policy", "avg JCT h, mean (min-max)",
              "ICEFROG speedup (its JCT / ICEFROG's)", "paper physical (48 GPUs)",
              "paper simulated", "jobs unfinished"]  # fmt: skip
    rows, raw = [], {}
    for w in g.loads:
        ice = {s: _totals(res[_key(g, w, s, "icefrog")]).get("avg_jct_s") for s in g.seeds}
        for p in g.policies:
            docs = [res[_key(g, w, s, p)] for s in g.seeds]
            jct = [_totals(d).get("avg_jct_s") for d in docs]
            speed = _ratios(jct, [ice[s] for s in g.seeds])
            raw[f"load{w:g}/{p}"] = {"seeds": list(g.seeds), "avg_jct_s": jct, "speedup": speed}
            rows.append([
                f"{w:g}x", p, _spread(map(_h, jct)),
                "-" if p == "icefrog" else _spread(speed, unit="x"),
                f"{PAPER_PHYSICAL[p]:.2f}x" if p in PAPER_PHYSICAL else "",
                f"{PAPER_SIMULATED[p]}x" if p in PAPER_SIMULATED else "",
                _unfinished(docs),
            ])  # fmt: skip
    return header, rows, raw


def _key(g: Grid, w: float, s: int, p: str) -> str:
    return Run(f"main-{g.gpus}g-load{w:g}-seed{s}-{p}", g.trace(w, s), p, g.gpus, s, g.common).key


def table_size(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    sizes = sorted(
        {k for d in res.values() if d for k in d["totals"]["jct_by_size_s"]},
        key=lambda k: SIZES.index(k) if k in SIZES else len(SIZES),
    )  # fmt: skip
    header = ["load", "policy", *[f"{k} JCT h (jobs)" for k in sizes]]
    rows, raw = [], {}
    for w in g.loads:
        for p in g.policies:
            ts = [_totals(res[_key(g, w, s, p)]) for s in g.seeds]
            cells = []
            for k in sizes:
                vals = [_h(t["jct_by_size_s"].get(k)) for t in ts if t]
                jobs = [t["jobs_by_size"].get(k, 0) for t in ts if t]
                raw[f"load{w:g}/{p}/{k}"] = {"jct_h": vals, "jobs": jobs}
                n = f" ({statistics.fmean(jobs):.0f})" if jobs else ""
                cells.append(_spread(vals) + n)
            rows.append([f"{w:g}x", p, *cells])
    return header, rows, raw


def _task_tta(doc: dict[str, Any] | None) -> dict[str, float]:
    """Per task: mean submit-to-target time (s) of the jobs that reached the target."""
    by: dict[str, list[float]] = {}
    for j in [] if doc is None else doc["jobs"]:
        if j["reached_target"] and j["jct_s"] is not None:
            by.setdefault(j["task"], []).append(j["jct_s"])
    return {t: statistics.fmean(v) for t, v in by.items()}


def table_tta(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    header = ["load", "task", "jobs (seed mean)", "ICEFROG TTA h", "Pollux+ TTA h",
              "Pollux+ / ICEFROG", "paper"]  # fmt: skip
    rows, raw = [], {}
    for w in g.loads:
        ice = {s: _task_tta(res[_key(g, w, s, "icefrog")]) for s in g.seeds}
        pol = {s: _task_tta(res[_key(g, w, s, "pollux+")]) for s in g.seeds}
        tasks = sorted({t for s in g.seeds for t in ice[s]} | {t for s in g.seeds for t in pol[s]})
        for t in tasks:
            a = [ice[s].get(t) for s in g.seeds]
            b = [pol[s].get(t) for s in g.seeds]
            ratio = _ratios(b, a)
            n = [sum(j["task"] == t for j in d["jobs"]) for s in g.seeds
                 if (d := res[_key(g, w, s, "icefrog")]) is not None]  # fmt: skip
            raw[f"load{w:g}/{t}"] = {"icefrog_s": a, "pollux_s": b, "ratio": ratio}
            rows.append([f"{w:g}x", t, f"{statistics.fmean(n):.1f}" if n else "-",
                         _spread(map(_h, a)), _spread(map(_h, b)), _spread(ratio, unit="x"),
                         f"{PAPER_TTA}x"])  # fmt: skip
    return header, rows, raw


def table_scale(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    header = ["load", "GPUs", "policy", "jobs (unfinished)", "avg JCT h",
              "ICEFROG speedup (its JCT / ICEFROG's)", "solver s/round mean",
              "solver s/round max", "sim wall s"]  # fmt: skip
    rows, raw = [], {}
    for w, n in g.scale:
        key = {p: Run(f"scale-{n}g-load{w:g}-seed1-{p}", g.trace(w, 1), p, n, 1, g.common).key
               for p in g.policies}  # fmt: skip
        ice = _totals(res[key["icefrog"]]).get("avg_jct_s") if "icefrog" in key else None
        for p in g.policies:
            t = _totals(res[key[p]])
            jct = t.get("avg_jct_s")
            speed = jct / ice if jct and ice and p != "icefrog" else None
            raw[f"{n}/{p}"] = t
            rows.append([
                f"{w:g}x", str(n), p,
                f"{t['jobs']} ({t['jobs'] - t['finished']})" if t else "no run",
                _spread([_h(jct)]), "-" if speed is None else f"{speed:.2f}x",
                _spread([t.get("solver_s_mean")], "{:.3f}"),
                _spread([t.get("solver_s_max")], "{:.3f}"),
                _spread([t.get("wall_s")], "{:.0f}"),
            ])  # fmt: skip
    return header, rows, raw


def table_solver(g: Grid, res: dict[str, dict[str, Any] | None]) -> Table:
    header = ["GPUs", "load", "policy", "runs", "rounds (mean)", "solver s/round mean",
              "solver s/round max"]  # fmt: skip
    groups: dict[tuple[int, float, str], list[dict[str, Any]]] = {}
    for r in [*main_runs(g), *scale_runs(g)]:
        doc = res.get(r.key)
        if doc is not None:
            w = r.workload.load if isinstance(r.workload, Trace) else 0.0
            groups.setdefault((r.gpus, w, r.policy), []).append(doc["totals"])
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
    rows_in: Sequence[tuple[str, tuple[Run, ...] | None]], res: dict[str, dict[str, Any] | None]
) -> Table:
    """One row a variant: its figures as mean (min-max) over the seeds; the JCT ratio is taken
    per seed against the "as is" run on the same trace (the first row)."""
    header = ["ICEFROG variant", "seeds", "avg JCT h", "JCT / as-is JCT", "jobs unfinished",
              "reallocations", "GPU-hours", "sim wall s"]  # fmt: skip
    base = {r.seed: _totals(res.get(r.key)).get("avg_jct_s") for r in rows_in[0][1] or ()}
    rows, raw = [], {}
    for label, runs in rows_in:
        if runs is None:
            rows.append([label, *["-"] * (len(header) - 1)])
            continue
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
    """ICEFROG as is, ICEFROG with batch scaling, Pollux+: average JCT per load, and per seed
    the as-is JCT / its JCT (the paper's batch-elasticity gain) and Pollux+'s JCT / its."""
    header = ["load", "policy", "avg JCT h, mean (min-max)",
              "ICEFROG as is / it", "Pollux+ / it", "paper (batch scaling over as is)",
              "jobs unfinished"]  # fmt: skip
    scaled = {(r.workload.load, r.seed): r.key for r in batch_runs(g)}  # type: ignore[union-attr]
    rows, raw = [], {}
    for w in g.loads:
        docs = {
            "icefrog": [res.get(_key(g, w, s, "icefrog")) for s in g.seeds],
            "icefrog + batch scaling": [res.get(scaled[w, s]) for s in g.seeds],
            "pollux+": [res.get(_key(g, w, s, "pollux+")) for s in g.seeds],
        }
        jct = {k: [_totals(d).get("avg_jct_s") for d in ds] for k, ds in docs.items()}
        for name, ds in docs.items():
            mine = jct[name]
            over_ice, pollux = _ratios(jct["icefrog"], mine), _ratios(jct["pollux+"], mine)
            raw[f"load{w:g}/{name}"] = {
                "seeds": list(g.seeds),
                "avg_jct_s": mine,
                "icefrog_over": over_ice,
                "pollux_over": pollux,
            }
            rows.append([
                f"{w:g}x", name, _spread(map(_h, mine)),
                "-" if name == "icefrog" else _spread(over_ice, unit="x"),
                "-" if name == "pollux+" else _spread(pollux, unit="x"),
                f"{PAPER_BATCH_SCALING}x" if name == "icefrog + batch scaling" else "",
                _unfinished(ds),
            ])  # fmt: skip
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


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]  # fmt: skip
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ----- the command -------------------------------------------------------------------------


def grid_from(args: argparse.Namespace) -> Grid:
    g = Grid()
    if args.quick:
        g = Grid(loads=(0.25,), seeds=(1,), gpus=16, ablation_load=0.25, ablation_seeds=(1,),
                 scale=((0.5, 32),), faithful_loads=(0.5,), workloads=1)  # fmt: skip
    common = ("--batch", "paper", *[x for kv in args.set for x in ("--set", kv)])
    scale = tuple(p for p in g.scale if p[1] <= args.max_scale)
    return Grid(
        loads=_floats(args.loads) if args.loads else g.loads,
        seeds=_ints(args.seeds) if args.seeds else g.seeds,
        gpus=args.gpus or g.gpus,
        policies=tuple(args.policies.split(",")) if args.policies else g.policies,
        base_jobs=args.base_jobs,
        tasks=args.tasks,
        ablation_load=args.ablation_load or g.ablation_load,
        ablation_seeds=_ints(args.ablation_seeds) if args.ablation_seeds else g.ablation_seeds,
        scale=scale,
        faithful_loads=g.faithful_loads,
        workloads=args.workloads or g.workloads,
        pollux=args.pollux,
        common=common,
    )


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def build(table: str, g: Grid, runner: Runner) -> tuple[list[str], list[list[str]], dict[str, Any]]:
    """Run what ``table`` needs and make it."""
    if table in ("main", "size", "tta"):
        res = runner.ensure(main_runs(g))
        return {"main": table_main, "size": table_size, "tta": table_tta}[table](g, res)
    if table == "scale":
        return table_scale(g, runner.ensure(scale_runs(g)))
    if table == "solver":
        return table_solver(g, runner.ensure([*main_runs(g), *scale_runs(g)]))
    if table == "ablation":
        known = freezeout_known()
        if not known:
            runner.log(f"ablation: skipping the FreezeOut row: `--set {FREEZEOUT_SET}` is not "
                       "a setting in this build (branch freeze adds policy.freezing)")  # fmt: skip
        rows = ablation_rows(g, known)
        res = runner.ensure([r for _, runs in rows for r in runs or ()])
        return table_ablation(rows, res)
    if table == "batch":
        pair = replace(g, policies=("icefrog", "pollux+"))
        return table_batch(g, runner.ensure([*main_runs(pair), *batch_runs(g)]))
    if table == "faithful":
        return table_faithful(g, runner.ensure(faithful_runs(g)))
    raise SystemExit(f"unknown table {table!r}; choose from {', '.join(TABLES)}, all")


def make_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", help=f"{'|'.join(TABLES)}|all")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "eval")
    ap.add_argument("--jobs", type=int, default=2, help="simulations at once (2)")
    ap.add_argument("--quick", action="store_true", help="16 GPUs, 0.25 load, 1 seed (smoke)")
    ap.add_argument("--no-run", action="store_true",
                    help="run nothing: tables from the runs in --out (- if missing)")  # fmt: skip
    ap.add_argument("--loads", help="main: load factors, e.g. 1,2,3")
    ap.add_argument("--seeds", help="main: seeds, e.g. 1,2,3")
    ap.add_argument("--gpus", type=int, help="main/ablation: GPUs (48)")
    ap.add_argument("--policies", help=f"main/scale: policies ({','.join(POLICIES)})")
    ap.add_argument("--base-jobs", type=int, default=120, help="trace jobs at 1x load (120)")
    ap.add_argument("--tasks", default="", help="trace sample --tasks (default: its own)")
    ap.add_argument("--max-scale", type=int, default=960, help="scale: largest GPUs (960)")
    ap.add_argument("--ablation-load", type=float, help="ablation: load factor (2: the paper's)")
    ap.add_argument("--ablation-seeds", help="ablation: seeds, e.g. 1,2,3 (1,2,3)")
    ap.add_argument("--workloads", type=int, help="faithful: workloads per load (3)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="passed to every simulation (part of the run key)")  # fmt: skip
    ap.add_argument(
        "--philly", type=Path, default=Path("/work/shared/data/pollux/traces/philly.csv")
    )
    ap.add_argument("--pollux", type=Path, default=Path("/work/shared/data/pollux"),
                    help="folder holding workloads-{0.5,1.5,2.0}")  # fmt: skip
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = make_parser()
    args = ap.parse_args(argv)
    tables = list(TABLES) if "all" in args.tables else args.tables
    bad = [t for t in tables if t not in TABLES]
    if bad:
        ap.error(f"unknown table(s) {', '.join(bad)}; choose from {', '.join(TABLES)}, all")
    g = grid_from(args)
    if "icefrog" not in g.policies:
        ap.error("--policies must include icefrog (the speedups are over it)")
    command = "python benchmarks/evaluate.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    (args.out / "tables").mkdir(parents=True, exist_ok=True)
    runner = Runner(args.out, args.jobs, args.philly, run_missing=not args.no_run)
    for table in tables:
        before = (runner.ran, runner.reused)
        header, rows, raw = build(table, g, runner)
        text = markdown(header, rows)
        commits = ", ".join(sorted(runner.commits))
        note = (f"<!-- {command}: table {table}; {runner.ran - before[0]} run(s) now, "
                f"{runner.reused - before[1]} reused; commits {commits} -->")  # fmt: skip
        print(f"\n### {table}\n\n{note}\n\n{text}\n", flush=True)
        (args.out / "tables" / f"{table}.md").write_text(f"{note}\n\n{text}\n")
        doc = {"table": table, "command": command, "header": header, "rows": rows, "raw": raw,
               "commits": sorted(runner.commits)}  # fmt: skip
        (args.out / "tables" / f"{table}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"runs: {runner.ran} now, {runner.reused} reused, {len(runner.failed)} failed",
          file=sys.stderr)  # fmt: skip
    return 1 if runner.failed else 0


if __name__ == "__main__":
    sys.exit(main())
