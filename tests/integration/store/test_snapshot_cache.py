"""The controller's snapshot, read through the store's cache (store/snapcache.py), equals a
fresh read after every kind of change between two reads; SQLite and Postgres."""

from __future__ import annotations

from collections.abc import Callable

from icefrog_slurm.domain.records import Allocation, StoreSnapshot
from icefrog_slurm.protocol import GradStats, MetricReport
from icefrog_slurm.store.sql import SqlStore
from icefrog_slurm.store.tx import SqlStoreTx
from tests.integration.store.helpers import sample, spec


def _cached(store: SqlStore) -> StoreSnapshot:
    with store.transaction(consistent=True) as tx:
        return tx.snapshot()


def test_cached_snapshot_equals_a_fresh_read_after_each_change(store: SqlStore) -> None:
    with store.transaction() as tx:
        ids = [
            tx.create_job(
                name=f"j{k}",
                owner_uid=1001,
                owner_user="alice",
                slurm_job_id=str(100 + k),
                spec=spec(),
                now=10.0,
            )
            for k in range(3)
        ]
        a, b, c = ids
        tx.add_profile_samples(job_id=a, slurm_job_id="100", samples=[sample(1)], now=11.0)
        tx.put_metric(job_id=a, metric=MetricReport(1, "val_acc", 0.5), now=12.0)
        tx.put_grad_stats(job_id=b, stats=GradStats(1, 0, (1.0, 2.0, 3.0), (4.0,) * 3), now=12.0)
    first = _cached(store)
    assert first == store.snapshot()
    assert [len(v.samples) for v in first.jobs] == [1, 0, 0]

    changes: list[Callable[[SqlStoreTx], object]] = [
        # a new sample for a job that had one, and a first one for another
        lambda tx: tx.add_profile_samples(
            job_id=a, slurm_job_id="100", samples=[sample(2), sample(4)], now=20.0
        ),
        lambda tx: tx.add_profile_samples(
            job_id=c, slurm_job_id="102", samples=[sample(1)], now=21.0
        ),
        # a re-sent epoch's metric (same row, new value) and its re-sent statistics
        lambda tx: tx.put_metric(job_id=a, metric=MetricReport(1, "val_acc", 0.6), now=22.0),
        lambda tx: tx.put_grad_stats(
            job_id=b, stats=GradStats(1, 1, (0.5, 0.5, 0.5), (1.0,) * 3), now=23.0
        ),
        # a newer epoch's statistics replace the latest
        lambda tx: tx.put_grad_stats(
            job_id=b, stats=GradStats(2, 1, (0.1, 0.2, 0.3), (1.0,) * 3), now=24.0
        ),
        # the spec changes (decoded again) and a job ends (dropped from the snapshot)
        lambda tx: tx.set_spec(job_id=c, spec=spec(max_gpus=8, layer_flops=(1e9, 2e9, 3e9))),
        lambda tx: tx.set_state(job_id=a, state="finished", now=25.0),
    ]
    for change in changes:
        with store.transaction() as tx:
            change(tx)
        cached = _cached(store)
        assert cached == store.snapshot()
        assert cached.jobs != first.jobs  # each change is seen
        first = cached
    (vb, vc) = first.jobs
    assert vb.grad_stats == GradStats(2, 1, (0.1, 0.2, 0.3), (1.0,) * 3)
    assert vc.job.spec.max_gpus == 8 and vc.job.spec.layer_flops == (1e9, 2e9, 3e9)
    assert len(vc.samples) == 1


def test_a_rolled_back_write_read_in_its_own_transaction_is_not_kept(store: SqlStore) -> None:
    with store.transaction() as tx:
        job = tx.create_job(
            name="j", owner_uid=1001, owner_user="alice", slurm_job_id="7", spec=spec(), now=1.0
        )
    assert _cached(store) == store.snapshot()
    try:
        with store.transaction() as tx:
            tx.add_profile_samples(job_id=job, slurm_job_id="7", samples=[sample(1)], now=2.0)
            tx.put_metric(job_id=job, metric=MetricReport(1, "loss", 0.1), now=2.0)
            inside = tx.snapshot()
            assert len(inside.jobs[0].samples) == 1
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    after = _cached(store)
    assert after == store.snapshot()
    assert after.jobs[0].samples == () and after.jobs[0].metrics == ()


def _round(tx: SqlStoreTx, round_no: int, gpus: int, now: float) -> None:
    tx.record_round(
        round_no=round_no,
        now=now,
        policy="icefrog",
        capacity_gpus=4,
        allocations=[Allocation(1, gpus, 32, 0, False)],
    )


def test_the_last_round_kept_is_a_committed_one(store: SqlStore) -> None:
    with store.transaction() as tx:
        tx.create_job(
            name="j", owner_uid=1001, owner_user="alice", slurm_job_id="7", spec=spec(), now=1.0
        )
        _round(tx, 1, 1, 300.0)
    assert _cached(store).last_round == store.snapshot().last_round
    try:
        with store.transaction() as tx:
            _round(tx, 2, 2, 600.0)
            inside = tx.snapshot().last_round
            assert inside is not None and inside.allocations[0].gpus == 2
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    with store.transaction() as tx:
        _round(tx, 2, 4, 900.0)  # the same number again, another decision
    for _ in range(2):  # read once from the rows, then as kept
        last = _cached(store).last_round
        assert last == store.snapshot().last_round
        assert last is not None and (last.round_no, last.time) == (2, 900.0)
        assert last.allocations[0].gpus == 4
