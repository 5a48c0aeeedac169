"""The state store's contract, run on SQLite and on a real Postgres server."""

from __future__ import annotations

import pytest

from icefrog_slurm.domain.records import Allocation, Progress
from icefrog_slurm.protocol import FinishedReport, GradStats, MetricReport, ProgressReport
from icefrog_slurm.store.ledger import StoreError
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import sample, spec


def _job(store: SqlStore, slurm_id: str = "100", uid: int = 1001, name: str = "cnn") -> int:
    with store.transaction() as tx:
        return tx.create_job(
            name=name,
            owner_uid=uid,
            owner_user="alice",
            slurm_job_id=slurm_id,
            spec=spec(),
            now=10.0,
        )


def test_job_record_and_its_slurm_chain(store: SqlStore) -> None:
    job_id = _job(store)
    with store.transaction() as tx:
        tx.link_slurm_job(job_id=job_id, slurm_job_id="107", reason="resubmitted", now=20.0)
        job = tx.job_by_slurm_id("100")
        assert job is not None and job == tx.job_by_slurm_id("107") == tx.job(job_id)
        assert tx.job_by_slurm_id("999") is None
    assert job.slurm_job_ids == ("100", "107") and job.slurm_job_id == "107"
    assert job.spec == spec()  # the protocol's JobSpec round-trips, layer table included
    assert (job.owner_uid, job.owner_user, job.state, job.submit_time) == (
        1001,
        "alice",
        "pending",
        10.0,
    )
    other = _job(store, "200", name="other")
    with (
        pytest.raises(StoreError, match="already belongs to icefrog job"),
        store.transaction() as tx,
    ):
        tx.link_slurm_job(job_id=other, slurm_job_id="107", reason="x", now=1.0)


def test_state_times_and_a_failed_transaction_changes_nothing(store: SqlStore) -> None:
    job_id = _job(store)
    with store.transaction() as tx:
        tx.set_state(job_id=job_id, state="running", now=30.0)
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.set_state(job_id=job_id, state="cancelled", now=40.0)
        tx.put_metric(
            job_id=job_id, metric=MetricReport(epoch=1, name="val_acc", value=0.5), now=40.0
        )
        raise RuntimeError("boom")
    with store.transaction() as tx:
        job = tx.job(job_id)
        with pytest.raises(StoreError, match="job state"):
            tx.set_state(job_id=job_id, state="sleeping", now=1.0)
    assert (job.state, job.start_time, job.end_time) == ("running", 30.0, None)
    assert store.snapshot().jobs[0].metrics == ()


def test_measurements_replace_resent_epochs_and_keep_newest_progress(store: SqlStore) -> None:
    job_id = _job(store)
    with store.transaction() as tx:
        tx.add_profile_samples(
            job_id=job_id, slurm_job_id="100", samples=[sample(1), sample(2)], now=11.0
        )
        tx.put_grad_stats(
            job_id=job_id, stats=GradStats(1, 0, (1.0, 2.0, 3.0), (4.0, 5.0, 6.0)), now=12.0
        )
        tx.put_grad_stats(
            job_id=job_id, stats=GradStats(2, 1, (0.5, 0.5, 0.5), (1.0, 1.0, 1.0)), now=13.0
        )
        tx.put_grad_stats(
            job_id=job_id, stats=GradStats(2, 2, (0.7, 0.7, 0.7), (1.0, 1.0, 1.0)), now=14.0
        )
        for value in (0.5, 0.6):  # a requeued job re-sends epoch 1
            tx.put_metric(job_id=job_id, metric=MetricReport(1, "val_acc", value), now=15.0)
        tx.put_metric(job_id=job_id, metric=MetricReport(2, "val_acc", 0.7), now=16.0)
        tx.set_progress(
            job_id=job_id, progress=ProgressReport(2, 100000, 90000.0, "/ck/2"), sent_time=50.0
        )
        tx.set_progress(
            job_id=job_id, progress=ProgressReport(1, 50000, 45000.0, "/ck/1"), sent_time=40.0
        )
    (view,) = store.snapshot().jobs
    assert view.samples == (sample(1), sample(2))
    assert view.grad_stats == GradStats(2, 2, (0.7, 0.7, 0.7), (1.0, 1.0, 1.0))
    assert view.metrics == (MetricReport(1, "val_acc", 0.6), MetricReport(2, "val_acc", 0.7))
    assert view.job.progress == Progress(2, 100000, 90000.0, "/ck/2", 50.0)
    with store.transaction() as tx:  # re-sent in a later transaction: replaced too
        tx.put_metric(job_id=job_id, metric=MetricReport(2, "val_acc", 0.8), now=17.0)
        tx.put_grad_stats(
            job_id=job_id, stats=GradStats(2, 3, (0.9, 0.9, 0.9), (2.0, 2.0, 2.0)), now=18.0
        )
        light = tx.snapshot(measurements=False)
        asked: list[object] = []  # the controller's test of the last round: called once
        tested = tx.snapshot(measurements=lambda last: asked.append(last) or False)
    with store.transaction() as tx:  # progress written after the job's row was read: seen
        assert tx.job(job_id).progress.epoch == 2
        tx.set_progress(
            job_id=job_id, progress=ProgressReport(3, 150000, 1e5, "/ck/3"), sent_time=60.0
        )
        assert tx.job(job_id).progress.checkpoint_path == "/ck/3"
    (view,) = store.snapshot().jobs
    assert view.metrics[-1] == MetricReport(2, "val_acc", 0.8) and len(view.metrics) == 2
    assert view.grad_stats == GradStats(2, 3, (0.9, 0.9, 0.9), (2.0, 2.0, 2.0))
    # between rounds the tick reads the jobs alone: no measurement is loaded
    (bare,) = light.jobs
    assert not light.measured and store.snapshot().measured
    assert asked == [None] and tested == light  # no round yet; its answer is obeyed
    assert (bare.samples, bare.metrics, bare.grad_stats) == ((), (), None)
    assert bare.job.progress.epoch == 2 and bare.job.id == view.job.id


def test_snapshot_holds_active_jobs_last_round_and_open_intents(store: SqlStore) -> None:
    a, b = _job(store, "100"), _job(store, "200", name="b")
    with store.transaction() as tx:
        tx.mark_finished(job_id=b, report=FinishedReport("target_reached", 30, 0.95), now=99.0)
        n = tx.next_round_no()
        tx.record_round(
            round_no=n,
            now=100.0,
            policy="icefrog",
            capacity_gpus=8,
            solve_s=0.2,
            min_share=0.8,
            allocations=[
                Allocation(a, 2, 64, 1, False, ("node1",), 0.9, 3600.0, 0.8, 0.37, 2.5e10)
            ],
        )
        intent = tx.add_intent(action="start", params={"gpus": 2}, now=100.0, job_id=a, round_no=n)
    snap = store.snapshot()
    assert [v.job.id for v in snap.jobs] == [a]
    assert [v.job.id for v in store.snapshot(include_finished=True).jobs] == [a, b]
    with store.transaction() as tx:
        done = tx.job(b)
        assert tx.next_round_no() == n + 1
    assert (done.state, done.finish_reason, done.final_metric, done.end_time) == (
        "finished",
        "target_reached",
        0.95,
        99.0,
    )
    assert snap.last_round is not None and snap.last_round.round_no == n == 1
    assert snap.last_round.allocations == (
        Allocation(a, 2, 64, 1, False, ("node1",), 0.9, 3600.0, 0.8, 0.37, 2.5e10),
    )
    assert [i.id for i in snap.open_intents] == [intent]


def test_reconcile_intents_and_the_audit_log(store: SqlStore) -> None:
    """Intent first, act, record the outcome: a restart sees what was in flight."""
    job_id = _job(store)
    with store.transaction() as tx:
        first = tx.add_intent(
            action="start", params={"gpus": 2, "nodes": ["node1"]}, now=1.0, job_id=job_id
        )
    with store.transaction() as tx:
        started = tx.start_intent(intent_id=first, now=2.0)
    assert (started.status, started.attempts) == ("acting", 1)
    # ... the controller dies here; after a restart the intent is still open:
    with store.transaction() as tx:
        (open_one,) = tx.open_intents()
        assert open_one.id == first and open_one.params == {"gpus": 2, "nodes": ["node1"]}
        assert tx.start_intent(intent_id=first, now=3.0).attempts == 2
        tx.log_action(
            action="release",
            command=["scontrol", "release", "100"],
            outcome="ok",
            rc=0,
            now=4.0,
            duration_s=0.05,
            slurm_job_id="100",
            job_id=job_id,
            intent_id=first,
        )
        tx.finish_intent(intent_id=first, status="done", now=4.0)
    with store.transaction() as tx:
        assert tx.open_intents() == []
        (act,) = tx.actions(job_id=job_id)
        assert (act.command, act.outcome, act.rc, act.intent_id) == (
            ("scontrol", "release", "100"),
            "ok",
            0,
            first,
        )
        with pytest.raises(StoreError, match="not open"):
            tx.start_intent(intent_id=first, now=5.0)
        second = tx.add_intent(action="resize", params={"gpus": 4}, now=6.0, job_id=job_id)
        third = tx.add_intent(action="resize", params={"gpus": 1}, now=7.0, job_id=job_id)
        assert [i.id for i in tx.open_intents()] == [third]
        assert tx.intent(second).status == "superseded"
        with pytest.raises(StoreError, match="intent status"):
            tx.finish_intent(intent_id=third, status="maybe", now=8.0)
        tx.finish_intent(intent_id=third, status="failed", now=9.0, detail="x" * 5000)
        ended = tx.intent(third)  # read back in the transaction that wrote it
        assert (ended.status, ended.updated_at, len(ended.detail)) == ("failed", 9.0, 4000)
        with pytest.raises(StoreError, match="no intent 999"):
            tx.start_intent(intent_id=999, now=9.0)
        with pytest.raises(StoreError, match="no intent 999"):
            tx.finish_intent(intent_id=999, status="done", now=9.0)
        with pytest.raises(StoreError, match="no icefrog job 999"):
            tx.job(999)
        with pytest.raises(StoreError, match="no icefrog job 999"):
            tx.mark_finished(job_id=999, report=FinishedReport("failed", 1, 0.0), now=9.0)


def test_granted_is_each_active_jobs_last_done_start_change_or_stop(store: SqlStore) -> None:
    """What the tick compares a running job with: the target of its last *done* ``start``,
    ``change`` or ``stop`` intent; a later open, failed or superseded one, or an intent of
    another kind, does not count; a job with none, or ended, is absent."""
    moved, fresh, ended = _job(store, "100"), _job(store, "101"), _job(store, "102")

    def target(gres: str | None, *nodes: str) -> dict[str, object]:
        return {"gres": gres, "num_nodes": 1, "nodes": list(nodes)}

    with store.transaction() as tx:
        steps = [
            (moved, "start", target("gpu:1", "node1"), "done"),
            (moved, "change", target("gpu:2", "node2"), "done"),
            (moved, "requeue", target(None), "done"),
            (moved, "stop", target(None), "failed"),
            (fresh, "start", target("gpu:1", "node3"), "failed"),
            (ended, "stop", target(None), "done"),
        ]
        for n, (job, action, goal, status) in enumerate(steps):
            intent = tx.add_intent(action=action, params={"target": goal}, now=n, job_id=job)
            tx.finish_intent(intent_id=intent, status=status, now=n + 0.5)
        tx.add_intent(action="change", params={"target": target("gpu:4")}, now=9, job_id=moved)
        tx.set_state(job_id=ended, state="cancelled", now=10.0)
    with store.transaction() as tx:
        assert tx.granted() == {moved: target("gpu:2", "node2")}
    assert store.snapshot().granted == {moved: target("gpu:2", "node2")}


def test_details_are_stored_printable(store: SqlStore) -> None:
    """Slurm's words in an intent's or a command's detail may quote a job's name (its
    owner's text: an escape sequence, a line break): stored escaped, never as they came."""
    job_id = _job(store)
    said = "scontrol update jobid=100: Invalid job name 'x\x1b]0;pwned\x07\ny'"
    with store.transaction() as tx:
        intent = tx.add_intent(action="start", params={}, now=1.0, job_id=job_id)
        tx.log_action(action="update", command=("scontrol",), outcome="error", now=2.0,
                      duration_s=0.1, detail=said, job_id=job_id, intent_id=intent)  # fmt: skip
        tx.finish_intent(intent_id=intent, status="failed", now=3.0, detail=said)
    with store.transaction() as tx:
        (act,) = tx.actions(job_id=job_id)
        for text in (act.detail, tx.intent(intent).detail):
            assert text.isprintable() and "\\x1b]0;pwned\\x07\\x0ay'" in text


def test_a_rounds_intents_written_at_once(store: SqlStore) -> None:
    """add_intents writes several pending intents in one statement, in the order given,
    each as add_intent would; none closes another."""
    a, b = _job(store), _job(store, slurm_id="101")
    with store.transaction() as tx:
        earlier = tx.add_intent(action="start", params={"gpus": 1}, now=1.0, job_id=a)
        tx.add_intents(
            intents=[(b, "start", {"gpus": 2}), (a, "change", {"target": {"gpus": 4}})],
            now=2.0,
            round_no=None,
        )
        tx.add_intents(intents=[], now=3.0)
    with store.transaction() as tx:
        got = [(i.job_id, i.action, i.params, i.status, i.attempts) for i in tx.open_intents()]
        assert got == [
            (a, "start", {"gpus": 1}, "pending", 0),
            (b, "start", {"gpus": 2}, "pending", 0),
            (a, "change", {"target": {"gpus": 4}}, "pending", 0),
        ]
        assert tx.open_intents()[0].id == earlier
        assert [i.created_at for i in tx.open_intents()] == [1.0, 2.0, 2.0]


def test_round_trajectory_of_a_job(store: SqlStore) -> None:
    job_id = _job(store)
    with store.transaction() as tx:
        for n, gpus in ((1, 0), (2, 2), (3, 4)):
            tx.record_round(
                round_no=n,
                now=300.0 * n,
                policy="icefrog",
                capacity_gpus=4,
                allocations=[Allocation(job_id, gpus, 64, n, gpus == 1)],
            )
    with store.transaction() as tx:
        trajectory = tx.job_allocations(job_id)
        assert tx.round(2) is not None and tx.round(9) is None
    assert [(n, a.gpus, a.frozen) for n, a in trajectory] == [(1, 0, 1), (2, 2, 2), (3, 4, 3)]


def test_a_consistent_transaction_reads_one_state(store: SqlStore) -> None:
    if store.engine.dialect.name == "sqlite":
        pytest.skip("SQLite: a write transaction (BEGIN IMMEDIATE) excludes other writers")
    other = SqlStore(store.url)
    try:
        with store.transaction(consistent=True) as tx:
            assert tx.jobs() == []
            _job(other, "300")  # committed by another connection meanwhile
            assert tx.snapshot().jobs == ()
        with store.transaction() as tx:
            assert len(tx.jobs()) == 1
    finally:
        other.close()
