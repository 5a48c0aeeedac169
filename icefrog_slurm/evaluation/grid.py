"""The experiment sizes (``Grid``: the paper's, or ``--quick``'s) and the runs each table
needs, as ``Run`` lists whose keys the tables look their summaries up by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from icefrog_slurm.evaluation.runs import Run, Trace

POLICIES = ("icefrog", "icefrog-paper", "lucid+", "optimus+", "pollux+", "slurm")
"""The rows of main and scale: ICEFROG with batch and layer elasticity together
(``policy.batch_scaling = true``), ICEFROG under the paper's protocol (layer elasticity
alone, the workload's batch), the paper's three baselines and plain Slurm (what a site's own
scheduler does: FIFO with backfill on the requested GPUs)."""
SCALE_POINTS = ((5.0, 240), (10.0, 480), (20.0, 960))
ABLATION_LAMBDAS = (0.6, 0.7, 0.8, 0.9, 1.0)
ABLATION_PERIODS_MIN = (1, 2, 5, 10)
ABLATION_NOISE = (0.0, 0.1, 0.25, 0.5)
ABLATION_SHARE_NOISE = (0.5, 1.0)
FREEZEOUT_SET = "policy.freezing=freezeout"
BATCH_SCALING_SET = "policy.batch_scaling=true"
PAPER_SET = "policy.batch_scaling=false"
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "icefrog": ("icefrog", ("--set", BATCH_SCALING_SET)),
    "icefrog-paper": ("icefrog", ("--set", PAPER_SET)),
}
"""A row name that is not a policy's: (the policy, its arguments). Both ICEFROG rows name
the setting, so a run does not depend on the configured default. Under ``--batch paper``
every job declares the workload's batch; the settings decide whether ICEFROG (and Pollux+,
always) may change it."""
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
    common: tuple[str, ...] = ("--batch", "paper")
    philly: Path | None = None  # the Philly trace sampled (None: the packaged one)

    def trace(self, load: float, seed: int) -> Trace:
        return Trace(load, seed, self.base_jobs, self.tasks, self.philly)


def variant_run(
    g: Grid, label: str, name: str, trace: Trace, gpus: int, seed: int, *extra: str, tag: str = ""
) -> Run:
    """The run of row ``name`` (a policy or one of :data:`VARIANTS`), labelled
    ``label-name[-tag]``, with ``extra`` arguments after the row's own."""
    policy, own = VARIANTS.get(name, (name, ()))
    full = f"{label}-{name}" + (f"-{tag}" if tag else "")
    return Run(full, trace, policy, gpus, seed, (*g.common, *own, *extra))


def main_run(g: Grid, w: float, s: int, p: str) -> Run:
    """``main``'s run of row ``p`` at load ``w`` and seed ``s``."""
    return variant_run(g, f"main-{g.gpus}g-load{w:g}-seed{s}", p, g.trace(w, s), g.gpus, s)


def main_runs(g: Grid) -> list[Run]:
    return [main_run(g, w, s, p) for w in g.loads for s in g.seeds for p in g.policies]


def scale_run(g: Grid, w: float, n: int, p: str) -> Run:
    """``scale``'s run of row ``p`` at load ``w`` on ``n`` GPUs (seed 1)."""
    return variant_run(g, f"scale-{n}g-load{w:g}-seed1", p, g.trace(w, 1), n, 1)


def scale_runs(g: Grid) -> list[Run]:
    return [scale_run(g, w, n, p) for w, n in g.scale for p in g.policies]


def sharing_run(g: Grid, w: float, s: int) -> Run:
    """ICEFROG (the ``icefrog`` row: batch and layer elasticity) without sharing on
    ``main``'s trace of load ``w``, seed ``s``: against ``main``'s run, the gain of
    sharing."""
    return variant_run(g, f"main-{g.gpus}g-load{w:g}-seed{s}", "icefrog", g.trace(w, s),
                       g.gpus, s, "--no-share", tag="noshare")  # fmt: skip


def sharing_runs(g: Grid) -> list[Run]:
    return [r for w in g.loads for s in g.seeds
            for r in (main_run(g, w, s, "icefrog"), sharing_run(g, w, s))]  # fmt: skip


def ablation_rows(g: Grid) -> list[tuple[str, tuple[Run, ...]]]:
    """(row label, one run a seed of ``g.ablation_seeds``): ICEFROG with batch and layer
    elasticity, one thing changed a row. The "as is", paper-protocol and sharing-off rows
    are ``main``'s and ``sharing``'s runs; rows that equal the defaults (lambda 0.9, period
    5 min) reuse the "as is" runs."""
    w, seeds = g.ablation_load, g.ablation_seeds

    def run(tag: str, *extra: str) -> tuple[Run, ...]:
        return tuple(
            variant_run(g, f"ablation-{g.gpus}g-load{w:g}-seed{s}", "icefrog", g.trace(w, s),
                        g.gpus, s, *extra, tag=tag)
            for s in seeds
        )  # fmt: skip

    base = tuple(main_run(g, w, s, "icefrog") for s in seeds)
    rows: list[tuple[str, tuple[Run, ...]]] = [
        ("as is (batch and layer elasticity, frozen penalty, sharing, lambda 0.9, period 5 min)",
         base),
        ("the paper's protocol (`--set policy.batch_scaling=false`: the workload's batch)",
         tuple(main_run(g, w, s, "icefrog-paper") for s in seeds)),
        ("freezing off (`--no-freeze`)", run("nofreeze", "--no-freeze")),
        ("sharing off (`--no-share`)", tuple(sharing_run(g, w, s) for s in seeds)),
        ("frozen penalty -> tuned FreezeOut", run("freezeout", "--set", FREEZEOUT_SET)),
    ]  # fmt: skip
    for lam in ABLATION_LAMBDAS:
        extra = () if lam == DEFAULT_LAMBDA else ("--set", f"sharing.speed_factor={lam:g}")
        rows.append((f"lambda {lam:g}", run(f"lambda{lam:g}", *extra) if extra else base))
    for minutes in ABLATION_PERIODS_MIN:
        sec = 60.0 * minutes
        extra = () if sec == DEFAULT_PERIOD_S else ("--set", f"controller.round_period_s={sec:g}")
        rows.append((f"period {minutes} min", run(f"period{sec:g}", *extra) if extra else base))
    for sd in ABLATION_NOISE:
        rows.append(
            (f"throughput noise sd {sd:g}", run(f"noise{sd:g}", "--profile-noise", f"{sd:g}"))
        )
    for sd in ABLATION_SHARE_NOISE:
        rows.append((f"memory/utilisation noise sd {sd:g}",
                     run(f"sharenoise{sd:g}", "--share-noise", f"{sd:g}")))  # fmt: skip
    return rows


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
