"""What a job's owner chose (its name, its target metric) cannot pass for other fields in
what an administrator reads: ``icefrog show job`` prints it as one shell word, and a
parsable ``icefrog sacct`` cell holding the separator is quoted."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.store.sql import SqlStore
from tests.integration.report.populate import NOW
from tests.integration.store.helpers import spec

FORGED_NAME = "train JobState=COMPLETED UserId=root(0)"
FORGED_METRIC = "val_acc FinalMetric=0.99 Reached=yes"


def test_an_owner_s_name_and_metric_cannot_forge_fields(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqlStore(db_url)
    try:
        with store.transaction() as tx:
            job = tx.create_job(
                name=FORGED_NAME, owner_uid=1001, owner_user="alice", slurm_job_id="700",
                spec=dataclasses.replace(spec(), target_metric=FORGED_METRIC), now=NOW - 600,
            )  # fmt: skip
            tx.create_job(
                name="a|root|COMPLETED", owner_uid=1001, owner_user="alice", slurm_job_id="701",
                spec=spec(), now=NOW - 600,
            )  # fmt: skip
    finally:
        store.close()
    assert main(["show", "job", str(job), "--db", db_url]) == 0
    words = shlex.split(capsys.readouterr().out)
    for key in ("JobName", "UserId", "JobState", "Target", "FinalMetric", "Reached"):
        assert sum(w.startswith(f"{key}=") for w in words) == 1, key  # none forged
    fields = dict(w.split("=", 1) for w in words if "=" in w)
    assert fields["JobName"] == FORGED_NAME and fields["UserId"] == "alice(1001)"
    assert fields["Target"].startswith(FORGED_METRIC) and fields["Reached"] == "no"
    assert main(["sacct", "--db", db_url, "-a", "-P", "-n", "-o", "JobName,User,State"]) == 0
    assert ["a|root|COMPLETED", "alice", "PENDING"] in [
        _cells(line) for line in capsys.readouterr().out.splitlines()
    ]


def _cells(line: str) -> list[str]:
    """A parsable line split at ``|`` outside shell quotes."""
    lex = shlex.shlex(line, posix=True)
    lex.whitespace, lex.whitespace_split = "|", True
    return list(lex)
