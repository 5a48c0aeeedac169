"""Small builders shared by the store tests."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import MetaData, Table, insert

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.protocol import JobSpec
from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import make_engine
from icefrog_slurm.store.tx import _speccolumns


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


def insert_old_job(url: str, revision: str, later: Collection[str], job_id: int = 5) -> None:
    """Migrate an empty database to ``revision`` and insert a job of :func:`spec` as that
    revision stored it: without the spec columns ``later`` migrations added."""
    migrate.upgrade(url, revision)
    engine = make_engine(url)
    try:
        jobs = Table("jobs", MetaData(), autoload_with=engine)
        old = {k: v for k, v in _speccolumns(spec()).items() if k not in later}
        with engine.begin() as conn:
            conn.execute(
                insert(jobs).values(
                    id=job_id,
                    name="old",
                    owner_uid=1,
                    owner_user="a",
                    state="pending",
                    submit_time=1.0,
                    epoch=0,
                    samples_done=0,
                    effective_samples_done=0.0,
                    checkpoint_path="",
                    **old,
                )
            )
    finally:
        engine.dispose()
