"""A job's declared parallelism in the store (jobs.parallelism, migration 0002), on SQLite
and on a real Postgres server."""

from __future__ import annotations

from icefrog_slurm.core.parallelism import DDP, Kind, Parallelism
from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import insert_old_job, spec

HP = Parallelism(Kind.HP, stages=2, unit=4)


def test_the_parallelism_round_trips(store: SqlStore) -> None:
    declared = spec(min_gpus=4, max_gpus=16, parallelism=HP)
    with store.transaction() as tx:
        job_id = tx.create_job(
            name="llama", owner_uid=1, owner_user="a", slurm_job_id="1", spec=declared, now=1.0
        )
        plain = tx.create_job(
            name="cnn", owner_uid=1, owner_user="a", slurm_job_id="2", spec=spec(), now=1.0
        )
    with store.transaction() as tx:
        assert tx.job(job_id).spec == declared  # ORM path
        by_id = {j.id: j.spec for j in tx.jobs()}  # plain-row path
        assert by_id[job_id].parallelism == HP and by_id[plain].parallelism == DDP
        tx.set_spec(job_id=plain, spec=spec(parallelism=Parallelism(Kind.SDP)))
    with store.transaction() as tx:
        assert tx.job(plain).spec.parallelism == Parallelism(Kind.SDP)


def test_jobs_registered_before_0002_read_as_plain_ddp(empty_db_url: str) -> None:
    insert_old_job(empty_db_url, "0001", later=("parallelism", "global_batch"))
    migrate.upgrade(empty_db_url)
    store = SqlStore(empty_db_url)
    try:
        with store.transaction() as tx:
            assert tx.job(5).spec == spec()  # parallelism DDP in units of 1
    finally:
        store.close()
