"""The experiment sizes (``Grid``: the paper's, or ``--quick``'s) and the runs each table
needs, as ``Run`` lists whose keys the tables look their summaries up by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from icefrog_slurm.evaluation.runs import Run, Trace

POLICIES = ("icefrog", "lucid+", "optimus+", "pollux+", "slurm")
"""The policies of main and scale: ICEFROG, the paper's three baselines and plain Slurm (what
a site's own scheduler does: FIFO with backfill on the requested GPUs)."""
SCALE_POINTS = ((5.0, 240), (10.0, 480), (20.0, 960))
ABLATION_LAMBDAS = (0.6, 0.7, 0.8, 0.9, 1.0)
ABLATION_PERIODS_MIN = (1, 2, 5, 10)
ABLATION_NOISE = (0.0, 0.1, 0.25, 0.5)
ABLATION_SHARE_NOISE = (0.5, 1.0)
FREEZEOUT_SET = "policy.freezing=freezeout"
BATCH_SCALING_SET = "policy.batch_scaling=true"
PAPER_SET = "policy.batch_scaling=false"
"""The paper's protocol for ICEFROG (E alone, the workload's batch): the evaluation's runs
keep it although batch and layer elasticity together is the product's default."""
DEFAULT_LAMBDA, DEFAULT_PERIOD_S = 0.9, 300.0


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
    pollux: Path = Path("data") / "pollux"  # holds workloads-{0.5,1.5,2.0}
    common: tuple[str, ...] = ("--batch", "paper", "--set", PAPER_SET)

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


def ablation_rows(g: Grid) -> list[tuple[str, tuple[Run, ...]]]:
    """(row label, one run a seed of ``g.ablation_seeds``). Rows that equal the defaults
    (lambda 0.9, period 5 min) reuse the "as is" runs."""

    def run(tag: str, *extra: str) -> tuple[Run, ...]:
        return tuple(
            Run(f"ablation-{g.gpus}g-load{g.ablation_load:g}-seed{s}-icefrog-{tag}",
                g.trace(g.ablation_load, s), "icefrog", g.gpus, s, (*g.common, *extra))
            for s in g.ablation_seeds
        )  # fmt: skip

    base = run("asis")
    rows: list[tuple[str, tuple[Run, ...]]] = [
        ("as is (frozen penalty, sharing, lambda 0.9, period 5 min)", base),
        ("freezing off (`--no-freeze`)", run("nofreeze", "--no-freeze")),
        ("sharing off (`--no-share`)", run("noshare", "--no-share")),
        ("batch scaling on (`--set policy.batch_scaling=true`: goodput tuner, decided batch)",
         run("batchscaling", "--set", BATCH_SCALING_SET)),
        ("frozen penalty -> tuned FreezeOut", run("freezeout", "--set", FREEZEOUT_SET)),
    ]  # fmt: skip
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


POLLUX_RESCALE_S = 30
"""What a reallocation costs a job in AdaptDL's simulator (``Job.reallocate``:
``rescale_time = 30``), the fidelity runs' ``controller.reallocation_overhead_s``."""
FIDELITY_APPS = ("cifar10", "imagenet", "ncf", "yolov3", "bert", "deepspeech2")


def fidelity_runs(g: Grid) -> list[Run]:
    """Pollux+ on Pollux's workloads as AdaptDL's simulator ran Pollux: V100s, Pollux's
    applications (``--gpu-model v100``), 64 GPUs, 60 s rounds, 30 s a reallocation."""
    common = (*g.common, "--no-freeze", "--no-share", "--gpu-model", "v100",
              "--set", f"controller.round_period_s={FAITHFUL_PERIOD_S}",
              "--set", f"controller.reallocation_overhead_s={POLLUX_RESCALE_S}")  # fmt: skip
    return [
        Run(f"fidelity-64g-load{w:g}-w{i}-pollux+", g.pollux / f"workloads-{w:.1f}" /
            f"workload-{i}.csv", "pollux+", 64, 1, common)
        for w in g.faithful_loads for i in range(1, g.workloads + 1)
    ]  # fmt: skip


def published_path(g: Grid, w: float) -> Path:
    """Pollux's published per-job JCTs of its Pollux runs at load ``w``."""
    return g.pollux / "results-jobload" / f"pollux-{w:.1f}" / "summary.json"


def main_key(g: Grid, w: float, s: int, p: str) -> str:
    """The key of ``main``'s run of policy ``p`` at load ``w`` and seed ``s``."""
    return Run(f"main-{g.gpus}g-load{w:g}-seed{s}-{p}", g.trace(w, s), p, g.gpus, s, g.common).key
