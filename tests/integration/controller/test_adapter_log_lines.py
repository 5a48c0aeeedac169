"""The Slurm adapter's lines about one Slurm job carry it as ``slurm_job=<id>:``, the field
the controller's lines use (docs/admin-guide.md, Logs), so ``grep -w slurm_job=<id>`` finds
them too: a resubmission on the real local cluster (named by its old and its new id) and a
``squeue --json`` record the parser cannot read (a hostile id printed escaped, on its line).
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.slurm.identity import TagSigner
from icefrog_slurm.slurm.parse import parse_squeue_json
from icefrog_slurm.slurm.port import SubmitRequest
from tests.integration.controller.support import backend

SCRIPT = "#!/bin/bash\nsleep 30\n"


def _grep_w(field: str, text: str) -> list[str]:
    """The lines of ``text`` that ``grep -w FIELD`` prints."""
    pattern = re.compile(rf"(?<![\w]){re.escape(field)}(?![\w])")
    return [line for line in text.splitlines() if pattern.search(line)]


@pytest.mark.slurm
def test_a_resubmission_names_the_old_and_the_new_slurm_job(
    job_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = backend(signer=TagSigner.ephemeral())
    key = f"log-{uuid.uuid4().hex[:8]}"
    script = job_dir / "job.sh"
    script.write_text(SCRIPT)
    old = cluster.submit_held(
        request=SubmitRequest(
            script=str(script), tag=IcefrogTag(key=key), name=f"it-{key}", gres=Gres("gpu", 1),
            partition="gpu", output=str(job_dir / "out-%j.txt"), workdir=str(job_dir),
        )
    )  # fmt: skip
    new = old
    try:
        with caplog.at_level(logging.INFO, logger="icefrog_slurm.slurm.cli_backend"):
            new = cluster.resubmit(job_id=old, owner_uid=os.getuid(), gres=Gres("shard", 1))
        text = "\n".join(r.getMessage() for r in caplog.records)
        [line] = _grep_w(f"slurm_job={old}", text)
        assert line.startswith(f"slurm_job={old}: resubmitted as slurm_job={new} "), line
        assert _grep_w(f"slurm_job={new}", text) == [line]
        assert not _grep_w(f"slurm_job={old}0", text)  # -w: not a longer id
    finally:
        for sid in {old, new}:
            cluster.cancel(job_id=sid)


def test_an_unreadable_squeue_record_is_logged_by_its_slurm_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hostile = "7\nINFO x: slurm_job=1: forged"
    doc = {"jobs": [{"job_id": 4711}, {"job_id": hostile}], "errors": []}
    with caplog.at_level(logging.WARNING, logger="icefrog_slurm.slurm.parse"):
        assert parse_squeue_json(json.dumps(doc)) == {}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("\n" not in m for m in messages), messages
    assert messages[0].startswith("slurm_job=4711: squeue --json record skipped: ")
    assert messages[1].startswith("slurm_job='7\\nINFO x: slurm_job=1")  # escaped, one line
    assert not _grep_w("slurm_job=1", "\n".join(m.split(":", 1)[0] for m in messages))
