"""The cluster as the scheduler sees it: the GRES a job asks for, the icefrog tag a Slurm job
carries, one Slurm job as a batched poll observes it, and the GPUs a partition offers.

Plain values with no I/O: the Slurm adapters (icefrog_slurm.slurm) build them, the snapshot
and the plan carry them. Icefrog identity inside Slurm: an icefrog job carries the comment
``icefrog:<key>`` (``<key>`` is the store's job key), and a job resubmitted in place of an
older one carries ``icefrog:<key>;prev=<old slurm id>``. Every other job is *foreign*: its
GPUs are subtracted from the capacity icefrog may plan with, and so are the free GPUs its
memory or cores leave unusable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GresKind = Literal["gpu", "shard", "mps"]
SHARED_KINDS: tuple[GresKind, ...] = ("shard", "mps")
"""The GRES a shared job asks for (``sharing.gres``): a share of one GPU, never a whole one."""
COMMENT_PREFIX = "icefrog:"
ADMIN_HOLD = "JobHeldAdmin"

# Job states in which a job holds its nodes' GPUs (squeue %T long names).
HOLDING_STATES = frozenset(
    {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
)
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)


@dataclass(frozen=True)
class Gres:
    """A per-node generic-resource request: ``gpu:N`` (exclusive), or a share of one GPU:
    ``shard:K`` (time-sliced) or ``mps:N`` (CUDA MPS, N of the GPU's MPS count)."""

    kind: GresKind
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"Gres count must be >= 1, got {self.count}")

    def __str__(self) -> str:
        return f"{self.kind}:{self.count}"

    @property
    def shared(self) -> bool:
        """A share of one GPU (``shard`` or ``mps``), not whole GPUs."""
        return self.kind in SHARED_KINDS

    @classmethod
    def parse(cls, text: str) -> Gres:
        """``kind:count`` as :meth:`__str__` writes it (a plan's stored target)."""
        kind, _, count = text.partition(":")
        kinds: dict[str, GresKind] = {"gpu": "gpu", "shard": "shard", "mps": "mps"}
        if kind not in kinds:
            raise ValueError(f"Gres kind must be gpu, shard or mps, got {kind!r}")
        return cls(kinds[kind], int(count))


@dataclass(frozen=True)
class IcefrogTag:
    """The icefrog identity carried in a Slurm job comment: the key, and for a job the
    controller resubmitted in place of another, the id it replaced and the controller's
    signature over both and the owner (``slurm/identity.py``): users can write any comment,
    so only a signed tag ever names a successor."""

    key: str
    previous_id: str | None = None
    signature: str | None = None

    def comment(self) -> str:
        prev = f";prev={self.previous_id}" if self.previous_id else ""
        sig = f";sig={self.signature}" if self.signature else ""
        return f"{COMMENT_PREFIX}{self.key}{prev}{sig}"


@dataclass(frozen=True)
class SlurmJobState:
    """One job as a batched ``squeue`` poll sees it."""

    job_id: str
    state: str
    gres: Gres | None
    num_nodes: int
    nodelist: str
    reason: str
    priority: int
    user_id: int
    partition: str
    comment: str
    tag: IcefrogTag | None
    name: str = ""
    gpus_by_node: tuple[tuple[str, int], ...] | None = None
    """The GPUs the job holds on each of its nodes as Slurm allocated them (whole GPUs, and
    the GPUs its shards or MPS sit on); None where Slurm gave no allocation."""
    gpus_otherwise: bool = False
    """It asked for GPUs per job, task or socket (``--gpus``, ``--gpus-per-task``,
    ``--gpus-per-socket``), so ``gres`` (per node) is None."""
    compound: bool = False
    """An array job (or one of its tasks) or a part of a heterogeneous job: Slurm acts on
    every part of it by this id, so it is never managed."""
    start_time: float | None = None
    """Slurm's start time (Unix time, by slurmctld's clock: whole seconds): of its current
    run while it holds resources, else an estimate; None when the backend does not say."""

    def gpus_on(self, node: str) -> int | None:
        """GPUs held on ``node`` by Slurm's allocation (None: not known)."""
        return dict(self.gpus_by_node or ()).get(node)

    @property
    def is_icefrog(self) -> bool:
        return self.tag is not None

    @property
    def holds_resources(self) -> bool:
        return self.state in HOLDING_STATES

    @property
    def started_at(self) -> float | None:
        """When its current run began, while it holds resources (None otherwise): a
        requeued job that runs again has a start after its requeue."""
        return self.start_time if self.holds_resources else None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def held(self) -> bool:
        # JobHeldUser / JobHeldAdmin, or "job requeued in held state" after requeuehold
        return self.state == "PENDING" and "held" in self.reason.lower()

    @property
    def admin_held(self) -> bool:
        """Held by an administrator (``scontrol hold`` as root or SlurmUser): icefrog never
        lifts such a hold; its own holds are user holds (``scontrol uhold``)."""
        return self.state == "PENDING" and self.reason == ADMIN_HOLD


@dataclass(frozen=True)
class NodeCapacity:
    """GPUs of one usable node, how many of them foreign jobs hold, and how many of the rest
    are blocked: free, but the memory or cores foreign jobs hold on the node leave too little
    for a job to use them (``blocked_by``: "cores", "memory" or "cores and memory"); and the
    GRES a GPU of it can be shared by: its ``shard`` and ``mps`` counts (0: none)."""

    name: str
    gpus: int
    foreign_gpus: int
    blocked_gpus: int = 0
    blocked_by: str = ""
    shards: int = 0
    mps: int = 0

    @property
    def available(self) -> int:
        return max(self.gpus - self.foreign_gpus - self.blocked_gpus, 0)


@dataclass(frozen=True)
class PartitionCapacity:
    """Capacity icefrog may plan with: the partition's GPUs minus those of foreign jobs."""

    partition: str
    nodes: tuple[NodeCapacity, ...]
    foreign_job_ids: tuple[str, ...]

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def foreign_gpus(self) -> int:
        return sum(min(n.foreign_gpus, n.gpus) for n in self.nodes)

    @property
    def blocked_gpus(self) -> int:
        return sum(n.blocked_gpus for n in self.nodes)

    @property
    def available_gpus(self) -> int:
        return sum(n.available for n in self.nodes)
