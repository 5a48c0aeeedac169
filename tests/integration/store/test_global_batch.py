"""A job's declared global batch in the store (jobs.global_batch, migration 0004), on SQLite
and on a real Postgres server."""

from __future__ import annotations

from icefrog_slurm.protocol import MAX_GLOBAL_BATCH
from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import insert_old_job, spec


def test_the_global_batch_round_trips(store: SqlStore) -> None:
    fixed = spec(global_batch=MAX_GLOBAL_BATCH)
    with store.transaction() as tx:
        job_id = tx.create_job(
            name="fixed", owner_uid=1, owner_user="a", slurm_job_id="1", spec=fixed, now=1.0
        )
        free = tx.create_job(
            name="free", owner_uid=1, owner_user="a", slurm_job_id="2", spec=spec(), now=1.0
        )
    with store.transaction() as tx:
        assert tx.job(job_id).spec == fixed  # ORM path
        by_id = {j.id: j.spec.global_batch for j in tx.jobs()}  # plain-row path
        assert by_id == {job_id: MAX_GLOBAL_BATCH, free: 0}


def test_jobs_registered_before_0004_read_as_a_free_batch(empty_db_url: str) -> None:
    insert_old_job(empty_db_url, "0003", later=("global_batch",))
    migrate.upgrade(empty_db_url)
    store = SqlStore(empty_db_url)
    try:
        with store.transaction() as tx:
            assert tx.job(5).spec == spec()  # global_batch 0: free
    finally:
        store.close()
