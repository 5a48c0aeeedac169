"""A job that ended at its time limit after checkpointing is requeued, also when the
controller's release of it timed out after it took effect (``scontrol release`` done,
``StartTime=now`` timed out: the audit log says ``timeout``, the job ran)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from icefrog_slurm.controller.requeue import EndedJobs, not_requeueable
from icefrog_slurm.domain.cluster import Gres, SlurmJobState
from icefrog_slurm.domain.records import SlurmAction

OWNER = 1001


def _action(action: str, outcome: str, time: float) -> SlurmAction:
    return SlurmAction(1, time, 1, 7, "42", action, (action, "42"), outcome, None, "", 0.1)


@dataclass
class _Tx:
    log: list[SlurmAction]

    def actions(self, *, job_id: int | None = None) -> list[SlurmAction]:
        return self.log


@dataclass
class _Store:
    log: list[SlurmAction] = field(default_factory=list)

    @contextmanager
    def transaction(self) -> Iterator[_Tx]:
        yield _Tx(self.log)


class _Files:
    def checkpoint_marked(self, *, run_dir: str, since: float, owner_uid: int) -> bool:
        return since < 500.0  # the job checkpointed at 500 s


@pytest.mark.parametrize(
    ("outcome", "why"),
    [("ok", ""), ("timeout", ""), ("error", "the controller never released it")],
)
def test_a_release_that_timed_out_after_taking_effect_counts(outcome: str, why: str) -> None:
    store = _Store([_action("release", outcome, 100.0)])
    ports: Any = EndedJobs(None, store, _Files(), None, lambda _j, _s: ("/w", OWNER))  # type: ignore[arg-type]
    ended = SlurmJobState(
        "42", "TIMEOUT", Gres("gpu", 1), 1, "n1", "None", 1, OWNER, "gpu", "", None
    )
    got = not_requeueable(ports, 7, "42", ended)
    assert (got == "") if not why else (why in got)
