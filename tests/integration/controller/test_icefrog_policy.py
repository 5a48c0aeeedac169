"""The ICEFROG policy driving the controller on the real local cluster: held jobs with
measured profiles are released with the GPU counts, batch and frozen layers it decides,
and each job's decision.json carries psi, the predicted TTA and its IceShare."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.policies.icefrog import IcefrogPolicy
from icefrog_slurm.protocol import GradStats
from icefrog_slurm.slurm.parse import expand_hostlist
from tests.integration.controller.support import (
    OffsetClock,
    backend,
    converge,
    make_controller,
    make_settings,
    make_store,
    running,
    submit_job,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]
L = 4


def _profile(gpus: int, rate: float, frozen: int = 0) -> ProfileSample:
    return ProfileSample(gpus, 64, frozen, False, 0.0, 0.0, 0.0, gpus * 64 / rate, rate, 30e9, 0.6)


def test_held_jobs_start_with_what_icefrog_decides(tmp_path: Path, job_dir: Path) -> None:
    settings = make_settings(tmp_path)
    store = make_store(settings)
    cluster = backend()
    layers = {"layer_flops": (1.0,) * L, "layer_param_bytes": (1.0,) * L, "layer_boundaries": ()}
    jobs = [
        submit_job(store, cluster, job_dir, f"ctl-{uuid.uuid4().hex[:8]}", min_gpus=1,
                   max_gpus=4, min_batch=32, max_batch=64, **layers)
        for _ in range(3)
    ]  # fmt: skip
    try:
        with store.transaction() as tx:
            for job, sid, _ in jobs:
                samples = [_profile(1, 400.0), _profile(2, 780.0), _profile(4, 1500.0)]
                samples.append(_profile(1, 560.0, frozen=2))
                tx.add_profile_samples(
                    job_id=job, slurm_job_id=sid, samples=samples, now=time.time()
                )
                grad = GradStats(
                    epoch=2, frozen=0, grad_var=(0.01, 0.01, 4.0, 4.0), grad_sqr=(1.0,) * L
                )
                tx.put_grad_stats(job_id=job, stats=grad, now=time.time())
        ctl = make_controller(settings, store, IcefrogPolicy(), OffsetClock())
        converge(ctl)
        with store.transaction() as tx:
            decided = {a.job_id: a for a in tx.round().allocations}  # type: ignore[union-attr]
        assert sum(a.gpus for a in decided.values()) <= 16
        for job, sid, run_dir in jobs:
            alloc = decided[job]
            assert alloc.gpus >= 1 and alloc.frozen == 2 and alloc.psi is not None
            state = running(cluster, sid)
            assert state.gres is not None and state.gres.count * state.num_nodes == alloc.gpus
            assert set(expand_hostlist(state.nodelist)) == set(alloc.nodes)
            decision = json.loads((run_dir / "decision.json").read_text())
            assert decision["frozen"] == 2 and decision["extra"]["predicted_tta_s"] > 0
            assert 0 < decision["extra"]["share"] <= 1
    finally:
        for _, sid, _ in jobs:
            cluster.cancel(job_id=sid)
        store.close()
