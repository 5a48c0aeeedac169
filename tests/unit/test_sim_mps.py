"""The simulator's CUDA MPS kind (``sharing.gres = "mps"``): the truth's speed of a pair
whose kernels run concurrently, next to time-sliced shards; MPS shares in the simulated
Slurm; the engine picks the kind from the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.sim.cluster import SimCluster
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.truth import GPU_MEMORY_BYTES, MPS_INTERFERENCE
from icefrog_slurm.sim.workload import TraceJob
from icefrog_slurm.slurm.port import SubmitRequest
from tests.unit.test_sim_truth import truth


def test_an_mps_pair_loses_less_than_a_time_sliced_one() -> None:
    a, b = truth("resnet18-cifar10"), truth("mobilenetv2-cifar10")
    for batch in (32, 64, 128, 256):
        partners = [(b, batch, 0)]
        shard = a.shared_speed(batch=batch, frozen=0, partners=partners)
        mps = a.shared_speed(batch=batch, frozen=0, partners=partners, kind="mps")
        assert 0 < shard < mps <= 1
        # below 100 % utilisation only the (smaller) interference is lost
        util = a.utilisation(batch=batch, frozen=0) + b.utilisation(batch=batch, frozen=0)
        if util <= 1:
            lost_shard, lost_mps = 1 - shard, 1 - mps
            assert lost_mps == pytest.approx(MPS_INTERFERENCE * lost_shard)
    assert a.shared_speed(batch=64, frozen=0, partners=[(b, 64, 0)], kind="shard") == (
        a.shared_speed(batch=64, frozen=0, partners=[(b, 64, 0)])
    )  # shard is the default, as before


def test_a_pair_past_the_gpus_memory_fails_under_either_kind() -> None:
    big, small = truth("ddpm-cifar10"), truth("resnet18-cifar10")
    huge = 256
    while big.memory(batch=huge, frozen=0) < GPU_MEMORY_BYTES:
        huge *= 2
    for kind in ("shard", "mps"):
        speed = big.shared_speed(batch=huge, frozen=0, partners=[(small, 64, 0)], kind=kind)
        assert speed == 0.0


def test_mps_shares_pack_up_to_the_gpus_count_and_never_mix_with_shards() -> None:
    cluster = SimCluster(nodes=1, gpus_per_node=2, shards_per_gpu=2, mps_per_gpu=100)

    def submit(name: str, gres: Gres) -> str:
        sid = cluster.submit_held(request=SubmitRequest("", IcefrogTag(name), name, gres))
        cluster.release(job_id=sid)
        return sid

    a, b = submit("a", Gres("mps", 60)), submit("b", Gres("mps", 40))
    assert cluster.holdings(a) == cluster.holdings(b)  # 60 + 40 fit one GPU's 100
    assert set(cluster.gpu_sharers(*cluster.holdings(a)[0])) == {a, b}
    c = submit("c", Gres("mps", 1))  # the first GPU is full: the other one
    assert cluster.holdings(c) and cluster.holdings(c) != cluster.holdings(a)
    d = submit("d", Gres("shard", 1))  # the second GPU has MPS clients: no shard beside them
    assert not cluster.holdings(d) and cluster.poll(job_ids=[d])[d].reason == "Resources"
    assert cluster.gpus_in_use() == 2


class _Pair:
    """Puts every job on node 0's first GPU, shared (one round decides it for good)."""

    name = "pair"

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        node = snapshot.capacity.nodes[0].name
        return PolicyResult({j.id: _shared(j.id, node) for j in snapshot.jobs})


def _shared(job_id: int, node: str) -> Allocation:
    return Allocation(
        job_id, 1, 64, 0, shared=True, nodes=(node,), predicted_util=0.45, predicted_mem_bytes=4e9
    )


def test_the_engine_runs_a_pair_at_the_speed_of_the_settings_kind(tmp_path: Path) -> None:
    jobs = [TraceJob(f"j{i}", 0.0, "resnet18-cifar10", 1, 64) for i in range(2)]
    finish = {}
    for kind in ("shard", "mps"):
        settings = settings_from_mapping({"sharing": {"gres": kind}})
        (tmp_path / kind).mkdir()
        engine = Engine(
            jobs, _Pair(), settings=settings, options=SimOptions(gpus=4, seed=2),
            store_dir=str(tmp_path / kind),
        )  # fmt: skip
        result = engine.run()
        assert all(j.finish is not None for j in result.jobs)
        finish[kind] = max(j.finish or 0.0 for j in result.jobs)
    # the same pair, the same seed: concurrent kernels finish it sooner than time slicing
    assert finish["mps"] < finish["shard"]
