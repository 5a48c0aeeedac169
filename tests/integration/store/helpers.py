"""Small builders shared by the store tests."""

from __future__ import annotations

from icefrog_slurm.protocol import JobSpec, ProfileSample


def spec(**changes: object) -> JobSpec:
    values: dict[str, object] = {
        "min_gpus": 1,
        "max_gpus": 4,
        "min_batch": 32,
        "max_batch": 256,
        "max_frozen_fraction": 0.9,
        "target_metric": "val_acc",
        "target_op": ">=",
        "target_value": 0.94,
        "max_epochs": 90,
        "samples_per_epoch": 50000,
        "layer_flops": (1.0, 2.0, 3.0),
        "layer_param_bytes": (10.0, 20.0, 30.0),
        "layer_boundaries": (0, 2, 3),
        "accepts_shared": True,
    }
    values.update(changes)
    return JobSpec(**values)  # type: ignore[arg-type]


def sample(gpus: int = 2, frozen: int = 1) -> ProfileSample:
    return ProfileSample(
        gpus=gpus,
        batch=64,
        frozen=frozen,
        shared=False,
        t_fwd_s=0.01,
        t_bwd_s=0.02,
        t_sync_s=0.005,
        t_iter_s=0.035,
        samples_per_s=3657.1,
        peak_mem_bytes=1.5e9,
        gpu_util=0.8,
    )
