"""The policy interface and the plan a controller tick emits.

A policy (icefrog_slurm.policies) reads a :class:`Snapshot` and returns a
:class:`PolicyResult`: one :class:`Allocation` per job (0 GPUs = wait) with a reason when
the job waits. The tick turns it into a :class:`Plan`: per job the Slurm resources to hold
(:class:`SlurmRequest`) and the action that gets it there. Plans are plain data; reconcile
enacts them, the simulator applies them to its model, ``--dry-run`` prints them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.settings import Settings

Action = Literal["none", "start", "change", "stop"]
"""``start``: a pending job gets its resources (update, then release); ``change``: a running
job is checkpointed, requeued held, updated (or resubmitted for gpu<->shard/mps) and released;
``stop``: a running job is checkpointed and requeued held (it waits)."""


@dataclass(frozen=True)
class PolicyResult:
    """A round's decision: an allocation for every job of the snapshot."""

    allocations: Mapping[int, Allocation]
    reasons: Mapping[int, str] = field(default_factory=dict)
    solve_s: float | None = None
    min_share: float | None = None


class Policy(Protocol):
    """A scheduling policy: the same snapshot in, the same kind of decision out."""

    name: str

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult: ...


@dataclass(frozen=True)
class SlurmRequest:
    """The Slurm resources a job should hold: ``gres`` per node on ``num_nodes`` nodes,
    pinned to ``nodes``; ``gres`` None means hold nothing (the job waits)."""

    gres: Gres | None
    num_nodes: int = 1
    nodes: tuple[str, ...] = ()

    def params(self) -> dict[str, Any]:
        return {
            "gres": None if self.gres is None else str(self.gres),
            "num_nodes": self.num_nodes,
            "nodes": list(self.nodes),
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SlurmRequest:
        gres = params.get("gres")
        parsed = None
        if gres:
            parsed = Gres.parse(str(gres))
        return cls(
            gres=parsed,
            num_nodes=int(params.get("num_nodes", 1)),
            nodes=tuple(params.get("nodes", ())),
        )


@dataclass(frozen=True)
class JobPlan:
    """One job's part of a plan."""

    job_id: int
    slurm_job_id: str
    owner_uid: int
    allocation: Allocation
    target: SlurmRequest
    action: Action
    reason: str = ""
    run_dir: str = ""  # from the job's checkpoint path; "" = ask Slurm for its WorkDir
    overreach: bool = False  # it holds more than it was released with: no checkpoint wait
    at_open_target: bool = False  # it runs as its open intent asks (not recorded done yet)


@dataclass(frozen=True)
class Plan:
    """What one tick decided. ``round_no`` is None when no round was due: the jobs then
    carry the last round's decision, which reconcile keeps converging to."""

    time: float
    round_no: int | None
    policy: str
    capacity_gpus: int
    jobs: tuple[JobPlan, ...]
    state_changes: tuple[tuple[int, str], ...] = ()  # (job id, new store state)
    decided_round: int | None = None  # the round the allocations come from
    solve_s: float | None = None
    min_share: float | None = None

    @property
    def new_round(self) -> bool:
        return self.round_no is not None

    def actions(self) -> tuple[JobPlan, ...]:
        return tuple(j for j in self.jobs if j.action != "none")

    def to_json(self) -> str:
        """The plan as JSON (``icefrog controller --dry-run``)."""
        doc = asdict(self)
        for job in doc["jobs"]:
            job["target"] = SlurmRequest(**{**job["target"], "gres": None}).params() | {
                "gres": _gres_text(job["target"]["gres"])
            }
        return json.dumps(doc, indent=2, sort_keys=True, default=str)


def _gres_text(gres: Mapping[str, Any] | None) -> str | None:
    return None if gres is None else f"{gres['kind']}:{gres['count']}"
