"""Illustrative ground truth for LLaMA jobs under SDP, PP and HP (not measurements).

Owns a few parameter sets of the section-7 models with A800-like magnitudes (bf16 compute
at ~40% of peak, PCIe 3.0 inside a node, 200 Gbps between nodes), the configurations a
profiler would visit, and the scenarios that pair them. Tests and
``benchmarks/parallel_fit.py`` fit the models back from noisy samples of these. Test data,
not shipped: the paper publishes no per-parameter values, so these are chosen, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallel import (
    IterationModel,
    Kind,
    Parallelism,
    PipelineModel,
    PipelineParams,
    SdpModel,
    SdpParams,
)
from icefrog_slurm.core.transformer_tables import load_shipped_table

# (seconds; per-sample slopes for a 384-token (3B) or 128-token (7B) sequence)
SDP_TRUTH = {
    "llama-3b": SdpParams(0.02, 0.030, 0.03, 0.060, 0.25, 0.040, 0.02, 0.8, 0.04, 2.0),
    "llama-7b": SdpParams(0.03, 0.020, 0.04, 0.040, 0.50, 0.080, 0.03, 0.7, 0.06, 2.5),
}
PIPELINE_TRUTH = {
    "llama-3b": PipelineParams(
        0.010, 0.030, 0.015, 0.060, 0.004, 0.0015, 0.01, 0.8, 0.03, 0.08, 2.0
    ),
    "llama-7b": PipelineParams(
        0.012, 0.020, 0.018, 0.040, 0.004, 0.0007, 0.012, 0.7, 0.05, 0.15, 2.5
    ),
}
LLAMA_UNIT = 4
PIPELINE_STAGES = 4


@dataclass(frozen=True)
class Scenario:
    """A model with known parameters and the (gpus, batch, frozen) it is profiled at."""

    name: str
    model: IterationModel
    configs: tuple[tuple[int, int, int], ...]


def _frozen_grid(table: LayerTable) -> tuple[int, ...]:
    """Every legal l up to 90 % of the layers (the paper's maximum), every other one."""
    legal = table.candidates(table.max_frozen_from_fraction(0.9))
    return legal[::2] + ((legal[-1],) if len(legal) % 2 == 0 else ())


def scenarios(table_name: str) -> tuple[Scenario, ...]:
    """SDP on 4..32 GPUs, PP on 4 stages, HP with 1..8 replicas of 4 stages."""
    table = load_shipped_table(table_name)
    grid = _frozen_grid(table)
    sdp = SdpModel(SDP_TRUTH[table_name], table, Parallelism(Kind.SDP, unit=LLAMA_UNIT))
    pp = Parallelism(Kind.PP, stages=PIPELINE_STAGES, unit=LLAMA_UNIT)
    hp = Parallelism(Kind.HP, stages=PIPELINE_STAGES, unit=LLAMA_UNIT)
    truth = PIPELINE_TRUTH[table_name]
    return (
        Scenario(
            "SDP",
            sdp,
            tuple((a, m, f) for a in (4, 8, 16, 24, 32) for m in (1, 2, 4, 8) for f in grid),
        ),
        Scenario(
            "PP",
            PipelineModel(truth, table, pp),
            tuple((4, m, f) for m in (4, 8, 16, 32, 64) for f in grid),
        ),
        Scenario(
            "HP",
            PipelineModel(truth, table, hp),
            tuple((a, m, f) for a in (4, 8, 16, 32) for m in (4, 8, 16, 32) for f in grid),
        ),
    )
