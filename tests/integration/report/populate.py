"""A small history written through the store's own write API, for the report tests.

Times are seconds after T0 = 2026-11-20T08:00:00 UTC; the reports run at NOW = T0 + 12000.

- job 1 ``cnn`` (alice, Slurm 100 then 107): runs from T0+60. Rounds: r1 (T0) 2 GPUs on
  n1; r2 (T0+1800) 4 GPUs on n1,n2, 2 frozen: a reallocation and a restart; Slurm 107
  replaces 100; r3 (T0+3600) the same resources, ψ unchanged: no trajectory line; r4
  (T0+5400) 0 GPUs: preempted, a reallocation; r5 (T0+7200) back on 4 GPUs: a restart.
  val_acc 0.5 at T0+3600, 0.95 at T0+9000 (target 0.94: TTA 9000 s); finished at
  T0+10800, target reached, final 0.951. GPU-seconds: 2·1740 + 4·1800 + 4·1800 + 0 +
  4·3600 = 32280 (8.97 GPU-hours).
- job 2 ``bert`` (bob, Slurm 200): submitted T0+100, pending; 0 GPUs in r1..r4, then 1
  shared GPU on n3 in r5 (Starting).
- job 3 ``ncf`` (alice, Slurm 300): submitted T0+7000, running since T0+7300 on 1 shared
  GPU on n3 (r5 only): 4700 GPU-seconds by NOW.
- job 4 ``old`` (carol, Slurm 50): submitted T0-2 days, failed T0-1 day, never decided.
- job 5 ``new`` (alice, Slurm 400): submitted T0+7250, pending, no round decided it yet.
"""

from __future__ import annotations

from datetime import UTC, datetime

from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.protocol import FinishedReport, MetricReport
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import spec

T0 = datetime(2026, 11, 20, 8, 0, 0, tzinfo=UTC).timestamp()
NOW = T0 + 12000
DAY = 86400.0


def _alloc(job: int, gpus: int, nodes: tuple[str, ...], **kw: object) -> Allocation:
    values: dict[str, object] = {"batch": 64, "frozen": 0, "shared": False, "psi": 1.0}
    values.update(kw)
    return Allocation(job_id=job, gpus=gpus, nodes=nodes, **values)  # type: ignore[arg-type]


def populate(store: SqlStore) -> None:
    with store.transaction() as tx:
        a = tx.create_job(
            name="cnn",
            owner_uid=1001,
            owner_user="alice",
            slurm_job_id="100",
            spec=spec(),
            now=T0,
        )
        b = tx.create_job(
            name="bert",
            owner_uid=1002,
            owner_user="bob",
            slurm_job_id="200",
            spec=spec(target_metric="f1", target_value=88.0),
            now=T0 + 100,
        )
    with store.transaction() as tx:
        tx.set_state(job_id=a, state="running", now=T0 + 60)
    rounds = [
        (T0, [_alloc(a, 2, ("n1",), predicted_tta_s=7200.0, share=0.9), _alloc(b, 0, ())]),
        (
            T0 + 1800,
            [
                _alloc(a, 4, ("n1", "n2"), frozen=2, psi=0.8, predicted_tta_s=5000.0, share=1.0),
                _alloc(b, 0, ()),
            ],
        ),
        (
            T0 + 3600,
            [
                _alloc(a, 4, ("n2", "n1"), frozen=2, psi=0.8, predicted_tta_s=4000.0, share=0.95),
                _alloc(b, 0, ()),
            ],
        ),
        (T0 + 5400, [_alloc(a, 0, (), frozen=2, psi=0.8), _alloc(b, 0, ())]),
    ]
    for no, (t, allocs) in enumerate(rounds, start=1):
        with store.transaction() as tx:
            tx.record_round(
                round_no=no, now=t, policy="icefrog", capacity_gpus=8, allocations=allocs
            )
            if no == 2:
                tx.link_slurm_job(job_id=a, slurm_job_id="107", reason="resubmitted", now=t + 10)
                tx.log_action(
                    action="requeue_hold",
                    command=["scontrol", "requeuehold", "100"],
                    outcome="error",
                    now=t + 5,
                    duration_s=0.2,
                    rc=1,
                    detail="Invalid job id",
                    slurm_job_id="100",
                    job_id=a,
                )
                tx.log_action(
                    action="resubmit",
                    command=["sbatch", "--hold", "job.sh"],
                    outcome="ok",
                    now=t + 10,
                    duration_s=0.4,
                    rc=0,
                    slurm_job_id="107",
                    job_id=a,
                )
    with store.transaction() as tx:
        c = tx.create_job(
            name="ncf",
            owner_uid=1001,
            owner_user="alice",
            slurm_job_id="300",
            spec=spec(max_gpus=1),
            now=T0 + 7000,
        )
        old = tx.create_job(
            name="old",
            owner_uid=1003,
            owner_user="carol",
            slurm_job_id="50",
            spec=spec(),
            now=T0 - 2 * DAY,
        )
        tx.set_state(job_id=old, state="failed", now=T0 - DAY)
        tx.create_job(
            name="new",
            owner_uid=1001,
            owner_user="alice",
            slurm_job_id="400",
            spec=spec(),
            now=T0 + 7250,
        )
        tx.record_round(
            round_no=5,
            now=T0 + 7200,
            policy="icefrog",
            capacity_gpus=8,
            allocations=[
                _alloc(a, 4, ("n1", "n2"), frozen=2, psi=0.7, predicted_tta_s=3000.0, share=1.0),
                _alloc(b, 1, ("n3",), shared=True, psi=None, share=0.5),
                _alloc(c, 1, ("n3",), shared=True, batch=32, share=0.6),
            ],
        )
        tx.log_action(
            action="release",
            command=["scontrol", "release", "107"],
            outcome="ok",
            now=T0 + 7201,
            duration_s=0.1,
            rc=0,
            slurm_job_id="107",
            job_id=a,
        )
        tx.set_state(job_id=c, state="running", now=T0 + 7300)
        tx.put_metric(
            job_id=a, metric=MetricReport(epoch=1, name="val_acc", value=0.5), now=T0 + 3600
        )
        tx.put_metric(
            job_id=a, metric=MetricReport(epoch=2, name="val_acc", value=0.95), now=T0 + 9000
        )
        tx.put_metric(
            job_id=c, metric=MetricReport(epoch=1, name="val_acc", value=0.61), now=T0 + 9500
        )
        tx.mark_finished(
            job_id=a,
            report=FinishedReport(reason="target_reached", epoch=2, final_metric=0.951),
            now=T0 + 10800,
        )
