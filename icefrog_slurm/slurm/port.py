"""The cluster port: what the controller may ask of Slurm, the plain data it gets back, and
the typed errors it must handle.

Adapters (``SlurmCliBackend``; a pyslurm one where pyslurm can be built) implement
``ClusterPort``; the controller sees only this module. Every method takes keyword arguments.

Icefrog identity inside Slurm: an icefrog job carries the comment ``icefrog:<key>`` (``<key>``
is the store's job key), and a job resubmitted in place of an older one carries
``icefrog:<key>;prev=<old slurm id>``. Every other job is *foreign*: its GPUs are subtracted
from the capacity icefrog may plan with.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from icefrog_slurm.errors import IcefrogError

GresKind = Literal["gpu", "shard"]
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


class SlurmError(IcefrogError):
    """Base of every error the Slurm adapters raise; ``command`` is the argv that failed."""

    def __init__(self, message: str, *, command: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.command = command


class SlurmUnavailable(SlurmError):
    """slurmctld is down, slow or unreachable (retryable): bounded retries were used up."""


class SlurmRejected(SlurmError):
    """Slurm answered and refused the request (not retryable: the request must change)."""


class JobNotFound(SlurmRejected):
    """The job id is unknown to slurmctld (never existed, or purged after MinJobAge)."""


@dataclass(frozen=True)
class Gres:
    """A per-node generic-resource request: ``gpu:N`` (exclusive) or ``shard:K`` (shared)."""

    kind: GresKind
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"Gres count must be >= 1, got {self.count}")

    def __str__(self) -> str:
        return f"{self.kind}:{self.count}"


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
class JobState:
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

    @property
    def is_icefrog(self) -> bool:
        return self.tag is not None

    @property
    def holds_resources(self) -> bool:
        return self.state in HOLDING_STATES

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
class GresAllocation:
    """GRES of one kind allocated on a group of nodes: which device indices (GPUs)."""

    nodes: tuple[str, ...]
    kind: str
    count: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class JobDetail:
    """One job's full record, from Slurm's machine-readable output: the identity fields
    (ids, uid, gid, state) are numbers or fixed words Slurm prints; the rest (name, comment,
    paths) is user text, never read for identity."""

    job_id: str
    name: str
    user_id: int
    group_id: int
    state: str
    reason: str
    restarts: int
    gres: Gres | None
    num_nodes: int
    req_nodes: str | None
    nodelist: str | None
    partition: str
    work_dir: str
    std_out: str | None
    std_err: str | None
    time_limit_min: int | None  # None: no limit of its own
    comment: str
    tag: IcefrogTag | None
    priority: int = 0
    multiline_text: bool = False  # a user field holds a line break (text outputs unsafe)

    def state_view(self) -> JobState:
        """The same job as a poll sees it."""
        return JobState(
            job_id=self.job_id,
            state=self.state,
            gres=self.gres,
            num_nodes=self.num_nodes,
            nodelist=self.nodelist or "",
            reason=self.reason,
            priority=self.priority,
            user_id=self.user_id,
            partition=self.partition,
            comment=self.comment,
            tag=self.tag,
            name=self.name,
        )


@dataclass(frozen=True)
class NodeGpus:
    """One node of a partition as ``sinfo -N`` shows it: state, GPUs and GRES shards."""

    name: str
    state: str
    gpus: int
    shards: int

    @property
    def usable(self) -> bool:
        base = self.state.rstrip("*~#!%$@^-")
        return base in ("idle", "mix", "mixed", "alloc", "allocated", "comp", "completing")


@dataclass(frozen=True)
class NodeCapacity:
    """GPUs of one usable node and how many of them foreign jobs hold."""

    name: str
    gpus: int
    foreign_gpus: int

    @property
    def available(self) -> int:
        return max(self.gpus - self.foreign_gpus, 0)


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
    def available_gpus(self) -> int:
        return sum(n.available for n in self.nodes)


@dataclass(frozen=True)
class SubmitRequest:
    """A held icefrog submission: the batch script and the decided resources."""

    script: str
    tag: IcefrogTag
    name: str
    gres: Gres
    num_nodes: int = 1
    nodes: tuple[str, ...] = ()
    partition: str | None = None
    output: str | None = None
    workdir: str | None = None
    time_limit: str | None = None


class ClusterPort(Protocol):
    """Everything the controller asks of Slurm. Errors: ``SlurmUnavailable`` (retry a later
    round), ``SlurmRejected``/``JobNotFound`` (the request itself is wrong)."""

    def submit_held(self, *, request: SubmitRequest) -> str:
        """Submit held (``sbatch -H --requeue``); return the Slurm job id. Idempotent per
        tag: when a live job with the same name and tag exists, its id is returned."""
        ...

    def release(self, *, job_id: str) -> None:
        """Let a held job run. A job an administrator holds is refused (SlurmRejected):
        icefrog lifts only user holds and its own requeue holds."""
        ...

    def update_pending(
        self,
        *,
        job_id: str,
        gres: Gres | None = None,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> None:
        """Change a PENDING job's GRES (same kind), node count (N-N) or node list."""
        ...

    def signal_batch(self, *, job_id: str, signal: str = "USR1") -> None:
        """Deliver a signal to the batch shell only (asks the job to checkpoint)."""
        ...

    def requeue_hold(self, *, job_id: str) -> None:
        """Requeue a running job and hold it (it is killed at once: checkpoint first)."""
        ...

    def hold(self, *, job_id: str) -> None:
        """Hold a pending job with a user hold (``scontrol uhold``): it stays queued but
        cannot start, and the hold is told apart from an administrator's."""
        ...

    def release_now(self, *, job_id: str) -> None:
        """Release a requeued job and make it eligible at once (StartTime=now); refuses an
        administrator's hold as ``release`` does."""
        ...

    def cancel(self, *, job_id: str) -> None:
        """Cancel a job; a job already finished is not an error."""
        ...

    def poll(self, *, job_ids: Collection[str]) -> Mapping[str, JobState]:
        """State of many jobs in one call; ids Slurm no longer knows are absent."""
        ...

    def job_detail(self, *, job_id: str) -> JobDetail:
        """Full record of one job."""
        ...

    def gres_allocation(self, *, job_id: str) -> tuple[GresAllocation, ...]:
        """Which GPU indices a running job holds on which nodes."""
        ...

    def partition_capacity(self, *, partition: str) -> PartitionCapacity:
        """The partition's usable GPUs minus those held by foreign (non-icefrog) jobs."""
        ...

    def resubmit(
        self,
        *,
        job_id: str,
        owner_uid: int,
        gres: Gres,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> str:
        """Replace a pending job by the same batch script, as its owner and with nothing
        more, with new GRES (the only way to move between gpu and shard on 22.05); the old
        job is cancelled and the new one (held) links to it in its signed comment. Refused
        unless Slurm's owner of the job is ``owner_uid`` (the owner icefrog recorded from
        the job's munge-signed registration). Returns the new id."""
        ...

    def hostnames(self, *, nodelist: str) -> tuple[str, ...]:
        """Expand a Slurm host list (``node[1-3]``)."""
        ...

    def find_successor(self, *, job_id: str, owner_uid: int) -> str | None:
        """The live job of ``owner_uid`` resubmitted in place of ``job_id`` (its comment
        names ``job_id`` and carries the controller's signature), or None: lets a restarted
        controller finish a resubmission it was killed in the middle of. A job anyone else
        made, with any comment, is never returned."""
        ...
