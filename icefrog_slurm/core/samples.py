"""The measurement the throughput models are fitted to: :class:`ProfileSample`.

The job side sends it in its ``profile`` reports (icefrog_slurm.protocol parses and checks
them); the core's fits, the policies' estimates and the simulator's ground truth all read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProfileSample:
    """One measured configuration, averaged over several iterations (kind ``profile``)."""

    gpus: int
    batch: int  # per-GPU
    frozen: int
    shared: bool
    t_fwd_s: float
    t_bwd_s: float
    t_sync_s: float  # the part of synchronisation not hidden behind backward
    t_iter_s: float
    samples_per_s: float
    peak_mem_bytes: float = 0.0
    gpu_util: float = -1.0  # 0..1; -1 when unknown (no NVML, CPU run)
