"""The cluster port: what the controller may ask of Slurm, the plain data it gets back, and
the typed errors it must handle. The values the snapshot and the plan carry too (GRES, the
icefrog tag, a polled job's state, capacity) are the domain's (icefrog_slurm.domain.cluster).

Adapters (``SlurmCliBackend``; a pyslurm one where pyslurm can be built) implement
``ClusterPort``; the controller sees only this module. Every method takes keyword arguments.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from icefrog_slurm.domain.cluster import (
    Gres,
    IcefrogTag,
    PartitionCapacity,
    SlurmJobState,
)
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.jsonio import printable


class SlurmError(IcefrogError):
    """Base of every error the Slurm adapters raise; ``command`` is the argv that failed.
    The message is made printable: it quotes what a Slurm command wrote, which may carry a
    job's fields (a name, a comment) and is logged as is."""

    def __init__(self, message: str, *, command: tuple[str, ...] = ()) -> None:
        super().__init__(printable(message, 2500))
        self.command = command


class SlurmUnavailable(SlurmError):
    """slurmctld is down, slow or unreachable (retryable): bounded retries were used up."""


class SlurmRejected(SlurmError):
    """Slurm answered and refused the request (not retryable: the request must change)."""


class JobNotFound(SlurmRejected):
    """The job id is unknown to slurmctld (never existed, or purged after MinJobAge)."""


@dataclass(frozen=True)
class GresAllocation:
    """GRES of one kind allocated on a group of nodes: which device indices (GPUs)."""

    nodes: tuple[str, ...]
    kind: str
    count: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class SlurmJobDetail:
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
    mem_per_gpu_mb: int | None = None  # asked for (per GPU, or a shard job's per node)
    cpus_per_gpu: int | None = None  # asked for (per GPU, or a shard job's per task)
    gpus_by_node: tuple[tuple[str, int], ...] | None = None  # SlurmJobState's
    gpus_otherwise: bool = False  # SlurmJobState's
    gres_detail: tuple[str, ...] = ()  # squeue's per-node allocation text (parse.py)
    compound: bool = False  # SlurmJobState's
    start_time: float | None = None  # Slurm's: the current run's start, or a pending estimate

    def state_view(self) -> SlurmJobState:
        """The same job as a poll sees it."""
        return SlurmJobState(
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
            gpus_by_node=self.gpus_by_node,
            gpus_otherwise=self.gpus_otherwise,
            compound=self.compound,
            start_time=self.start_time,
        )


USABLE_NODE_STATES = frozenset(
    {"idle", "mix", "mixed", "alloc", "allocated", "comp", "completing", "plnd", "planned"}
)
"""sinfo's node states (``%t`` and ``%T``, suffixes removed) whose GPUs icefrog counts."""


@dataclass(frozen=True)
class NodeGpus:
    """One node of a partition as ``sinfo -N`` shows it: state, GPUs, GRES shards and GRES
    MPS; and, where the adapter read them (``scontrol show node``), its cores and memory (MB)
    and how much of each jobs hold (None: not read)."""

    name: str
    state: str
    gpus: int
    shards: int
    cpus: int | None = None
    alloc_cpus: int | None = None
    memory_mb: int | None = None
    alloc_memory_mb: int | None = None
    mps: int = 0

    @property
    def usable(self) -> bool:
        """Up and schedulable. ``plnd`` is an idle node the backfill scheduler plans for a
        pending job (a ``-`` suffix: a busy one it plans): its GPUs are there and free."""
        base = self.state.rstrip("*~#!%$@^-")
        return base in USABLE_NODE_STATES


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
    mem_per_gpu_mb: int | None = None  # None: slurm.conf's DefMemPerGPU
    cpus_per_gpu: int | None = None  # None: slurm.conf's DefCpuPerGPU


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
        """Requeue a running job and hold it (it is killed at once: checkpoint first); a
        job its owner made non-requeueable is made requeueable again first."""
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

    def poll(self, *, job_ids: Collection[str]) -> Mapping[str, SlurmJobState]:
        """State of many jobs in one call; ids Slurm no longer knows are absent."""
        ...

    def job_detail(self, *, job_id: str) -> SlurmJobDetail:
        """Full record of one job."""
        ...

    def gres_allocation(self, *, job_id: str) -> tuple[GresAllocation, ...]:
        """Which GPU indices a running job holds on which nodes (one entry a node and
        kind), from Slurm's machine-readable job record."""
        ...

    def partition_capacity(
        self, *, partition: str, managed: Mapping[str, int] | None = None
    ) -> PartitionCapacity:
        """The partition's usable GPUs minus those held by foreign jobs: all but the
        ``managed`` ones (Slurm job id -> owner uid, the store's), whatever their comments
        say; with ``managed`` None, those without the icefrog tag (``capacity``)."""
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
        """Submit a successor of a pending job: the same batch script, as its owner and with
        nothing more, with new GRES (the only way to move between gpu and shard on 22.05),
        held, linking to the old job in its signed comment. The old job is left as it is:
        the caller cancels it once it has recorded the new one. Refused
        unless Slurm's owner of the job is ``owner_uid`` (the owner icefrog recorded from
        the job's munge-signed registration), and unless the script's ``#SBATCH`` header
        holds only what ``icefrog submit`` writes there (the user's kept sbatch options,
        ``sbatch_options.replay_refusal``), which apply again. Returns the new id."""
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
