"""The simulation engine: the production controller over a simulated clock, cluster and store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as settings_hyp
from hypothesis import strategies as st

from icefrog_slurm.cli import main
from icefrog_slurm.core.goodput import efficiency
from icefrog_slurm.core.penalty import effective_progress
from icefrog_slurm.core.tuner import powers_of_two, tune
from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.policies.lucid_plus import LucidPlusPolicy
from icefrog_slurm.policies.optimus_plus import OptimusPlusPolicy
from icefrog_slurm.policies.pollux_plus import PolluxPlusPolicy
from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.cluster import SimCluster
from icefrog_slurm.sim.engine import Engine, SimOptions, SimResult
from icefrog_slurm.sim.truth import TaskTruth
from icefrog_slurm.sim.workload import TraceJob
from icefrog_slurm.slurm.port import SlurmRejected, SubmitRequest

TASK = "resnet18-cifar10"


def _jobs(n: int, gap: float = 50.0, gpus: int = 1) -> list[TraceJob]:
    return [TraceJob(f"j{i}", gap * i, TASK, gpus, 128) for i in range(n)]


def _run(policy: object, jobs: list[TraceJob], gpus: int = 4, **kw: object) -> SimResult:
    opts = SimOptions(gpus=gpus, gpus_per_node=4, **kw)  # type: ignore[arg-type]
    return Engine(jobs, policy, settings=Settings(), options=opts).run()  # type: ignore[arg-type]


def test_same_seed_same_result_other_seed_differs() -> None:
    a = _run(StandInPolicy(), _jobs(3), seed=3)
    b = _run(StandInPolicy(), _jobs(3), seed=3)
    c = _run(StandInPolicy(), _jobs(3), seed=4)
    assert [j.finish for j in a.jobs] == [j.finish for j in b.jobs]
    assert [j.finish for j in a.jobs] != [j.finish for j in c.jobs]


def test_two_job_toy_matches_the_truth_exactly() -> None:
    """Two one-GPU jobs on two free GPUs, FCFS, nothing frozen: each starts at its
    submission (the first tick), pays the restart overhead once and then trains at the true
    throughput until the true samples to the target are done."""
    settings = Settings()
    result = _run(StandInPolicy(), _jobs(2, gap=0.0), gpus=4, seed=7)
    catalog, cal = shipped_catalog(), shipped_calibration()
    truth = TaskTruth(catalog.get(TASK), catalog.layers(TASK), cal[TASK], seed=7)
    task = catalog.get(TASK)
    batch = powers_of_two(task.min_batch, task.max_batch)[0]
    rate = truth.throughput(gpus=1, batch=batch, frozen=0)
    for i, job in enumerate(result.jobs):
        run = truth.start_run(seed=7 * 1_000_003 + i)
        per_sample = run.advance(samples=1.0, global_batch=batch)
        expected = settings.controller.reallocation_overhead_s + 1.0 / per_sample / rate
        assert job.start == 0.0 and job.reached_target
        assert job.finish == pytest.approx(expected, rel=1e-9)
        assert job.reallocations == 0


def test_gpus_in_use_never_exceed_capacity_and_all_finish() -> None:
    result = _run(OptimusPlusPolicy(), _jobs(6, gap=30.0), gpus=4, seed=1)
    assert max(g for _, g in result.usage) <= 4
    assert max(g for _, g in result.usage) > 0
    assert all(j.finish is not None for j in result.jobs)


@pytest.mark.parametrize("policy", [LucidPlusPolicy, OptimusPlusPolicy, PolluxPlusPolicy])
def test_each_baseline_runs_a_small_workload_to_completion(policy: type) -> None:
    result = _run(policy(), _jobs(3, gap=100.0), gpus=4, seed=2)
    assert result.policy == policy.name
    assert all(j.finish is not None and j.reached_target for j in result.jobs)
    assert max(g for _, g in result.usage) <= 4


def test_no_freeze_no_share_switches_reach_every_policy() -> None:
    result = _run(OptimusPlusPolicy(), _jobs(4, gap=20.0), gpus=4, seed=1, freeze=False,
                  share=False)  # fmt: skip
    assert result.frozen == {}
    assert all(j.finish is not None for j in result.jobs)


def test_elastic_policies_grow_a_lone_job() -> None:
    """Alone on 4 GPUs, an elastic policy gives a job more than one GPU; Lucid+ does not."""
    big = [TraceJob("big", 0.0, "resnet50-imagenet", 1, 128)]
    for policy, elastic in ((OptimusPlusPolicy(), True), (LucidPlusPolicy(), False)):
        opts = SimOptions(gpus=4, gpus_per_node=4, seed=1, max_sim_s=1500.0)
        engine = Engine(big, policy, settings=Settings(), options=opts)
        result = engine.run()
        peak = max(g for _, g in result.usage)
        assert (peak > 1) is elastic, (policy.name, peak)


def test_psi_one_and_nothing_frozen_makes_e_equal_throughput() -> None:
    assert effective_progress(1.0, 123.4) == 123.4
    best = tune(
        batch_sizes=(32, 64), frozen_candidates=(0,), psi=lambda _l: 1.0,
        throughput=lambda m, _l: 10.0 * m,
    )  # fmt: skip
    assert best is not None and best.effective_progress == best.throughput == 640.0


def test_pollux_efficiency_is_one_at_the_base_batch_and_falls() -> None:
    assert efficiency(var=2.0, sqr=0.1, batch=64, base_batch=64) == pytest.approx(1.0)
    assert efficiency(var=2.0, sqr=0.1, batch=1024, base_batch=64) < 1.0
    assert efficiency(var=0.0, sqr=0.0, batch=1024, base_batch=64) == 1.0


def test_sim_cluster_shards_pack_and_exclusive_gpus_do_not_mix() -> None:
    cluster = SimCluster(nodes=1, gpus_per_node=2, shards_per_gpu=2)

    def submit(name: str, gres: Gres) -> str:
        sid = cluster.submit_held(request=SubmitRequest("", IcefrogTag(name), name, gres))
        cluster.release(job_id=sid)
        return sid

    a, b = submit("a", Gres("shard", 1)), submit("b", Gres("shard", 1))
    assert cluster.holdings(a) == cluster.holdings(b)  # packed onto one GPU
    c = submit("c", Gres("gpu", 1))
    d = submit("d", Gres("gpu", 1))
    assert cluster.holdings(c) and not cluster.holdings(d)
    assert cluster.poll(job_ids=[d])[d].reason == "Resources"
    assert cluster.gpus_in_use() == 2
    cluster.requeue_hold(job_id=c)
    assert cluster.poll(job_ids=[c])[c].held
    assert cluster.schedule() == [d]


def test_simulate_cli_writes_summary(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\n"
                  "a,0,cifar10,1,128\nb,60,cifar10,2,256\n")  # fmt: skip
    out = tmp_path / "out"
    rc = main(["simulate", "--workload", str(wl), "--gpus", "4", "--policy", "optimus+",
               "--seed", "1", "--out", str(out), "--quiet"])  # fmt: skip
    assert rc == 0
    doc = json.loads((out / "summary.json").read_text())
    assert doc["policy"] == "optimus+"
    assert doc["totals"]["finished"] == 2 and doc["totals"]["avg_jct_s"] > 0
    assert {"name", "task", "submit", "start", "finish", "jct_s", "reached_target",
            "gpu_hours", "reallocations"} <= set(doc["jobs"][0])  # fmt: skip


def test_simulate_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\n")
    base = ["simulate", "--workload", str(wl), "--out", str(tmp_path / "o")]
    assert main([*base, "--gpus", "6", "--gpus-per-node", "4"]) == 2
    assert main([*base, "--policy", "fifo"]) == 2


def test_icefrog_without_freezing_or_sharing_is_an_elastic_max_min_scheduler() -> None:
    """Four identical jobs at once on 8 GPUs, freezing and sharing off: ICEFROG (max-min
    of IceShare) starts all of them at once and splits the GPUs evenly; nothing frozen."""
    module = pytest.importorskip("icefrog_slurm.policies.icefrog")
    jobs = [TraceJob(f"j{i}", 0.0, TASK, 1, 128) for i in range(4)]
    opts = SimOptions(gpus=8, gpus_per_node=4, seed=1, freeze=False, share=False)
    result = Engine(jobs, module.IcefrogPolicy(), settings=Settings(), options=opts).run()
    assert result.frozen == {}
    assert all(j.start == 0.0 and j.reached_target for j in result.jobs)
    hours = [j.gpu_seconds for j in result.jobs]
    assert max(hours) <= 2 * min(hours)
    assert max(g for _, g in result.usage) == 8


def test_fixed_global_batch_is_split_over_gpus_and_drives_convergence() -> None:
    """With the workload's global batch fixed, a one-GPU job trains at that batch whatever
    the policy decided, and its work to the target is that of the fixed global batch."""
    job = TraceJob("f", 0.0, TASK, 1, 256)
    opts = SimOptions(gpus=4, gpus_per_node=4, seed=5, fixed_batch=True)
    result = Engine([job], StandInPolicy(), settings=Settings(), options=opts).run()
    catalog, cal = shipped_catalog(), shipped_calibration()
    truth = TaskTruth(catalog.get(TASK), catalog.layers(TASK), cal[TASK], seed=5)
    per_sample = truth.start_run(seed=5 * 1_000_003).advance(samples=1.0, global_batch=256)
    rate = truth.throughput(gpus=1, batch=256, frozen=0)
    expected = Settings().controller.reallocation_overhead_s + 1.0 / per_sample / rate
    assert result.jobs[0].finish == pytest.approx(expected, rel=1e-9)
    big = TraceJob("g", 0.0, TASK, 1, 4096)
    engine = Engine([big], StandInPolicy(), settings=Settings(), options=opts)
    engine._arrivals()
    task = catalog.get(TASK)
    assert engine.jobs[0].batch_for(2, 32) == (task.max_batch, 4096)  # accumulates beyond
    assert engine.jobs[0].batch_for(16, 32) == (256, 4096)
    engine.close()


@settings_hyp(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["submit", "release", "requeue", "cancel",
                                           "complete", "schedule"]),
                          st.integers(0, 7), st.sampled_from(["gpu", "shard"]),
                          st.integers(1, 4), st.integers(1, 2)), max_size=40))  # fmt: skip
def test_sim_cluster_never_oversubscribes_a_gpu(
    ops: list[tuple[str, int, str, int, int]],
) -> None:
    """Whatever Slurm is asked, no GPU is both exclusive and shared, shards stay within
    shards_per_gpu, and GPUs in use never exceed the cluster's."""
    cluster = SimCluster(nodes=2, gpus_per_node=4, shards_per_gpu=2)
    ids: list[str] = []
    for op, k, kind, count, nodes in ops:
        sid = ids[k % len(ids)] if ids else ""
        try:
            if op == "submit":
                gres = Gres("shard", 1) if kind == "shard" else Gres("gpu", count)
                req = SubmitRequest("", IcefrogTag(f"j{len(ids)}"), f"j{len(ids)}", gres,
                                    num_nodes=1 if kind == "shard" else nodes)  # fmt: skip
                ids.append(cluster.submit_held(request=req))
                cluster.release(job_id=ids[-1])  # as reconcile does once it is updated
            elif op == "schedule":
                cluster.schedule()
            elif sid and op == "complete":
                if cluster.holdings(sid):
                    cluster.complete(job_id=sid)
            elif sid:
                {"release": cluster.release, "requeue": cluster.requeue_hold,
                 "cancel": cluster.cancel}[op](job_id=sid)  # fmt: skip
        except SlurmRejected:
            pass
        assert cluster.gpus_in_use() <= 8
        for node in cluster.node_names:
            for i in range(4):
                gpu = cluster._nodes[node][i]
                assert not (gpu.owner and gpu.shards)
                assert sum(gpu.shards.values()) <= 2
        held = [g for s in ids for g in cluster.holdings(s)]
        assert len(held) == len(set(held)) + sum(
            len(cluster.gpu_sharers(n, i)) - 1 for n, i in set(held) if cluster.gpu_sharers(n, i)
        )


def test_ticks_come_with_rounds_and_reconcile_not_with_arrivals() -> None:
    """The daemon wakes for its rounds (and every reconcile_poll_s while a job checkpoints),
    not when a job is submitted: a job arriving between rounds waits, registered with its
    own submission time, for the next round's tick."""
    settings = Settings()
    result = _run(StandInPolicy(), _jobs(5, gap=70.0), gpus=16, seed=2)
    rounds = [r.time for r in result.rounds]
    poll = settings.controller.reconcile_poll_s
    ticks = [t for t, _ in result.usage]
    assert len(ticks) == result.ticks
    assert all(min(t - r for r in rounds if r <= t) <= 5 * poll for t in ticks)
    by_name = {j.name: j for j in result.jobs}
    assert [by_name[f"j{i}"].submit for i in range(5)] == [0.0, 70.0, 140.0, 210.0, 280.0]
    assert all(by_name[f"j{i}"].start == rounds[1] for i in range(1, 5))
