"""Every finish reason a trainer reports shows whole in ``icefrog sacct`` and ``icefrog show
job``: ``max_physical_epochs`` (the cap on epochs trained) beside ``max_epochs`` (the work
budget spent; a store from before the cap existed holds it for epochs run out)."""

from __future__ import annotations

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.protocol import FINISH_REASONS, FinishedReport
from icefrog_slurm.store.sql import SqlStore
from tests.integration.report.populate import NOW
from tests.integration.store.helpers import spec


def test_each_finish_reason_shows_uncut(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = SqlStore(db_url)
    ids: list[int] = []
    try:
        for i, reason in enumerate(FINISH_REASONS):
            with store.transaction() as tx:
                job = tx.create_job(
                    name=f"j{i}", owner_uid=1001, owner_user="alice",
                    slurm_job_id=str(500 + i), spec=spec(), now=NOW - 600,
                )  # fmt: skip
                tx.set_state(job_id=job, state="running", now=NOW - 500)
                ids.append(job)
                tx.mark_finished(job_id=job, report=FinishedReport(reason, 12, 0.5), now=NOW - 100)
    finally:
        store.close()
    assert main(["sacct", "--db", db_url, "-o", "JobName,FinishReason", "-p"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [f"j{i}|{reason}|" for i, reason in enumerate(FINISH_REASONS)]
    assert main(["sacct", "--db", db_url, "-o", "JobName,FinishReason"]) == 0
    table = capsys.readouterr().out
    assert all(f" {reason}\n" in table for reason in FINISH_REASONS), table  # not cut
    cap = FINISH_REASONS.index("max_physical_epochs")
    assert main(["show", "job", "--db", db_url, str(ids[cap])]) == 0
    assert "FinishReason=max_physical_epochs " in capsys.readouterr().out
