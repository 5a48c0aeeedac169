"""``SimCluster``: an in-memory Slurm behind ``ClusterPort`` for the simulator.

Nodes of ``gpus_per_node`` GPUs; each GPU is held exclusively by one ``gpu:N`` job or
split into ``shards_per_gpu`` shards among ``shard:K`` jobs, or into ``mps_per_gpu``
MPS shares among ``mps:N`` jobs (never two of these at once, as in Slurm 22.05). Jobs move
as Slurm moves them: submitted held, released, started when their request fits (pinned nodes
respected, a shard or MPS job packed onto a GPU that already has such jobs before an empty
one), signalled, requeued held (freeing their GPUs at once), updated while pending,
resubmitted with a new GRES kind (the new job tagged ``prev=<old id>``; the controller
cancels the old one), completed by the engine when training ends. Administrators' holds and
foreign jobs (:meth:`SimCluster.admin_hold`, :meth:`SimCluster.run_foreign`: the simulator
itself makes neither) behave as on Slurm: icefrog never lifts the one, and the other's GPUs
leave the capacity icefrog plans with (``slurm/capacity.py``'s arithmetic); a foreign job
holding its node's whole memory keeps every other job off that node, and its free GPUs count
as blocked. Memory is modelled only that far. The semantic half of the ClusterPort contract
(``tests/contract``) runs over this class.

Nothing here knows about training: ``on_signal`` tells the engine a job was asked to
checkpoint; the engine reads who holds which GPU through :meth:`holdings`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from icefrog_slurm.domain.cluster import (
    Gres,
    IcefrogTag,
    NodeCapacity,
    PartitionCapacity,
    SlurmJobState,
)
from icefrog_slurm.slurm.capacity import HostNeed, partition_capacity
from icefrog_slurm.slurm.parse import expand_hostlist
from icefrog_slurm.slurm.port import (
    GresAllocation,
    JobNotFound,
    NodeGpus,
    SlurmJobDetail,
    SlurmRejected,
    SubmitRequest,
)

HELD_REASON = "JobHeldUser"
ADMIN_HELD_REASON = "JobHeldAdmin"


@dataclass
class _Gpu:
    owner: str | None = None  # exclusive gpu:N job
    shards: dict[str, int] = field(default_factory=dict)  # shard/mps job -> shares held

    @property
    def busy(self) -> bool:
        return self.owner is not None or bool(self.shards)


@dataclass
class _Job:
    job_id: str
    name: str
    tag: IcefrogTag | None  # None: a foreign job
    user_id: int
    work_dir: str
    gres: Gres
    num_nodes: int
    req_nodes: tuple[str, ...]
    state: str = "PENDING"
    reason: str = HELD_REASON
    restarts: int = 0
    start_time: float | None = None  # when its last run began (clock given)
    held_on: list[tuple[str, int]] = field(default_factory=list)  # (node, GPU index)
    whole_memory: bool = False  # holds its nodes' whole memory (``--mem=0``)


class SimCluster:
    """An in-memory Slurm partition (module docstring); every method keyword-only."""

    def __init__(
        self,
        *,
        nodes: int,
        gpus_per_node: int,
        shards_per_gpu: int,
        mps_per_gpu: int = 100,
        partition: str = "gpu",
        user_id: int = 1000,
        on_signal: Callable[[str], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if min(nodes, gpus_per_node, shards_per_gpu, mps_per_gpu) < 1:
            raise ValueError("nodes, gpus_per_node, shards_per_gpu, mps_per_gpu must be >= 1")
        self.partition, self.user_id = partition, user_id
        self.gpus_per_node, self.shards_per_gpu = gpus_per_node, shards_per_gpu
        self.mps_per_gpu = mps_per_gpu
        width = max(4, len(str(nodes)))
        self._nodes: dict[str, list[_Gpu]] = {
            f"sim{i:0{width}d}": [_Gpu() for _ in range(gpus_per_node)] for i in range(nodes)
        }
        self._jobs: dict[str, _Job] = {}
        self._foreign: list[str] = []  # ids of foreign jobs, in submission order
        # ids of the icefrog jobs by tag, and by the id their tag says they replaced
        self._by_tag: dict[IcefrogTag, list[str]] = {}
        self._successors: dict[str, list[str]] = {}
        self._memory_taken: set[str] = set()  # nodes a running job holds the whole memory of
        self._next_id = 1
        self.on_signal = on_signal or (lambda _sid: None)
        self.clock = clock  # dates each start (SlurmJobState.start_time) when given

    # ----- what the engine reads -----------------------------------------------------------
    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(self._nodes)

    def gpus_in_use(self) -> int:
        """Physical GPUs held by any job (exclusive or shared)."""
        return sum(g.busy for gpus in self._nodes.values() for g in gpus)

    def holdings(self, job_id: str) -> tuple[tuple[str, int], ...]:
        """(node, GPU index) pairs a running job holds (empty when it holds none)."""
        job = self._jobs.get(job_id)
        return tuple(job.held_on) if job is not None and job.state == "RUNNING" else ()

    def gpu_sharers(self, node: str, index: int) -> tuple[str, ...]:
        """Slurm job ids holding shards (or MPS shares) of one GPU."""
        return tuple(self._nodes[node][index].shards)

    def complete(self, *, job_id: str, state: str = "COMPLETED", reason: str = "None") -> None:
        """The job's batch script ended: exit 0 (training reached its end) by default, or
        as ``state`` says (``TIMEOUT`` with reason ``TimeLimit``: its time limit)."""
        job = self._get(job_id)
        self._free(job)
        job.state, job.reason = state, reason

    def schedule(self) -> list[str]:
        """Slurm's main scheduler pass: start every released pending job that fits, in
        submission order; returns the ids started."""
        started = []
        for job in sorted(self._jobs.values(), key=lambda j: int(j.job_id)):
            held = job.reason in (HELD_REASON, ADMIN_HELD_REASON)
            if job.state == "PENDING" and not held and self._try_start(job):
                started.append(job.job_id)
        return started

    # ----- ClusterPort ---------------------------------------------------------------------
    def submit_held(self, *, request: SubmitRequest) -> str:
        for job_id in self._by_tag.get(request.tag, ()):
            job = self._jobs[job_id]
            if job.name == request.name and job.state not in _ENDED:
                return job.job_id
        job = _Job(
            job_id=str(self._next_id),
            name=request.name,
            tag=request.tag,
            user_id=self.user_id,
            work_dir=request.workdir or f"/sim/{request.name}",
            gres=request.gres,
            num_nodes=request.num_nodes,
            req_nodes=request.nodes,
        )
        self._next_id += 1
        self._jobs[job.job_id] = job
        self._by_tag.setdefault(request.tag, []).append(job.job_id)
        if request.tag.previous_id is not None:
            self._successors.setdefault(request.tag.previous_id, []).append(job.job_id)
        return job.job_id

    def release(self, *, job_id: str) -> None:
        job = self._get(job_id)
        self._refuse_admin_hold(job, "released")
        if job.state == "PENDING" and job.reason == HELD_REASON:
            job.reason = "Priority"
            self._try_start(job)

    def release_now(self, *, job_id: str) -> None:
        self.release(job_id=job_id)

    def update_pending(
        self,
        *,
        job_id: str,
        gres: Gres | None = None,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> None:
        job = self._get(job_id)
        if job.state != "PENDING":
            raise SlurmRejected(f"job {job_id} is {job.state}, not pending")
        if gres is not None:
            if gres.kind != job.gres.kind:
                raise SlurmRejected(f"job {job_id}: GRES kind cannot change while pending")
            job.gres = gres
        if num_nodes is not None:
            job.num_nodes = num_nodes
        if nodes is not None:
            unknown = [n for n in nodes if n not in self._nodes]
            if unknown:
                raise SlurmRejected(f"unknown nodes {unknown}")
            job.req_nodes = nodes

    def signal_batch(self, *, job_id: str, signal: str = "USR1") -> None:
        job = self._get(job_id)
        if job.state != "RUNNING":
            raise SlurmRejected(f"job {job_id} is {job.state}, cannot signal")
        self.on_signal(job_id)

    def requeue_hold(self, *, job_id: str) -> None:
        job = self._get(job_id)
        if job.state not in ("RUNNING", "COMPLETED", "FAILED", "TIMEOUT", "PENDING"):
            raise SlurmRejected(f"job {job_id} is {job.state}, cannot requeue")
        self._free(job)
        job.state, job.reason = "PENDING", HELD_REASON
        job.restarts += 1

    def hold(self, *, job_id: str) -> None:
        job = self._get(job_id)
        if job.state != "PENDING":
            raise SlurmRejected(f"job {job_id} is {job.state}, not pending: cannot hold")
        if job.reason != ADMIN_HELD_REASON:  # a user hold does not replace an admin's
            job.reason = HELD_REASON

    def cancel(self, *, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.state in _ENDED:
            return
        self._free(job)
        job.state, job.reason = "CANCELLED", "None"

    def poll(self, *, job_ids: Collection[str]) -> Mapping[str, SlurmJobState]:
        return {sid: self._state(self._jobs[sid]) for sid in job_ids if sid in self._jobs}

    def job_detail(self, *, job_id: str) -> SlurmJobDetail:
        job = self._get(job_id)
        return SlurmJobDetail(
            job_id=job.job_id, name=job.name, user_id=job.user_id, group_id=job.user_id,
            state=job.state, reason=job.reason, restarts=job.restarts, gres=job.gres,
            num_nodes=job.num_nodes, req_nodes=",".join(job.req_nodes) or None,
            nodelist=self._nodelist(job) or None, partition=self.partition,
            work_dir=job.work_dir, std_out=None, std_err=None, time_limit_min=None,
            comment=_comment(job), tag=job.tag, priority=1,
        )  # fmt: skip

    def gres_allocation(self, *, job_id: str) -> tuple[GresAllocation, ...]:
        job = self._get(job_id)
        by_node: dict[str, list[int]] = {}
        for node, index in job.held_on:
            by_node.setdefault(node, []).append(index)
        return tuple(
            GresAllocation(nodes=(n,), kind=job.gres.kind, count=job.gres.count, indices=tuple(i))
            for n, i in by_node.items()
        )

    def partition_capacity(
        self, *, partition: str, managed: Mapping[str, int] | None = None
    ) -> PartitionCapacity:
        # the simulated jobs' comments never change: the foreign ones are those it was given
        running = [self._jobs[sid] for sid in self._foreign if self._jobs[sid].held_on]
        if not running:  # the simulator's own case: no foreign job ever
            return PartitionCapacity(
                partition=partition,
                nodes=tuple(NodeCapacity(n, len(g), 0) for n, g in self._nodes.items()),
                foreign_job_ids=(),
            )
        nodes = [  # memory in one unit, all of it held or none
            NodeGpus(
                name=n, state="mixed", gpus=len(g), shards=len(g) * self.shards_per_gpu,
                memory_mb=1, alloc_memory_mb=int(self._memory_held(n)),
            )
            for n, g in self._nodes.items()
        ]  # fmt: skip
        jobs = [
            replace(
                self._state(j),
                gpus_by_node=tuple(
                    (n, len({i for m, i in j.held_on if m == n}))
                    for n in dict.fromkeys(n for n, _ in j.held_on)
                ),
            )
            for j in running
        ]
        return partition_capacity(
            partition=partition,
            nodes=nodes,
            jobs=jobs,
            managed=managed,
            need=HostNeed(memory=True),
        )

    def resubmit(
        self,
        *,
        job_id: str,
        owner_uid: int,
        gres: Gres,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> str:
        old = self._get(job_id)
        if old.state != "PENDING":
            raise SlurmRejected(
                f"job {job_id} is {old.state}: only a pending (requeue-held) job is resubmitted"
            )
        if old.tag is None:
            raise SlurmRejected(f"job {job_id} carries no icefrog comment: not resubmitted")
        if old.user_id != owner_uid:
            raise SlurmRejected(f"job {job_id} belongs to uid {old.user_id}, not {owner_uid}")
        self._refuse_admin_hold(old, "resubmitted")
        request = SubmitRequest(
            script="", tag=IcefrogTag(old.tag.key, previous_id=job_id), name=old.name,
            gres=gres, num_nodes=num_nodes or 1, nodes=nodes or (), workdir=old.work_dir,
        )  # fmt: skip
        return self.submit_held(request=request)

    def hostnames(self, *, nodelist: str) -> tuple[str, ...]:
        return expand_hostlist(nodelist)

    def find_successor(self, *, job_id: str, owner_uid: int) -> str | None:
        jobs = (self._jobs[sid] for sid in self._successors.get(job_id, ()))
        live = [j.job_id for j in jobs if j.user_id == owner_uid and j.state not in _ENDED]
        return max(live, key=int) if live else None

    # ----- what Slurm's other users do (tests, what-ifs) ---------------------------------------
    def admin_hold(self, *, job_id: str) -> None:
        """An administrator holds a pending job (``scontrol hold`` as root)."""
        job = self._get(job_id)
        if job.state != "PENDING":
            raise SlurmRejected(f"job {job_id} is {job.state}, not pending: cannot hold")
        job.reason = ADMIN_HELD_REASON

    def run_foreign(
        self,
        *,
        name: str,
        gres: Gres,
        nodes: tuple[str, ...],
        user_id: int,
        whole_memory: bool = False,
    ) -> str:
        """A job submitted to Slurm without icefrog (no icefrog comment), not held: it starts
        at once on ``nodes`` when its request fits there, else waits for the next pass;
        ``whole_memory``: it asks for its nodes' whole memory (``--mem=0``)."""
        job = _Job(
            job_id=str(self._next_id), name=name, tag=None, user_id=user_id,
            work_dir=f"/sim/{name}", gres=gres, num_nodes=len(nodes) or 1, req_nodes=nodes,
            reason="Priority", whole_memory=whole_memory,
        )  # fmt: skip
        self._next_id += 1
        self._jobs[job.job_id] = job
        self._foreign.append(job.job_id)
        self._try_start(job)
        return job.job_id

    # ----- internals -------------------------------------------------------------------------
    def _refuse_admin_hold(self, job: _Job, what: str) -> None:
        if job.state == "PENDING" and job.reason == ADMIN_HELD_REASON:
            raise SlurmRejected(
                f"job {job.job_id} is held by an administrator ({ADMIN_HELD_REASON}): not {what}"
            )

    def _get(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(f"Invalid job id specified: {job_id}")
        return job

    def _state(self, job: _Job) -> SlurmJobState:
        return SlurmJobState(
            job_id=job.job_id, state=job.state, gres=job.gres, num_nodes=job.num_nodes,
            nodelist=self._nodelist(job), reason=job.reason, priority=1, user_id=job.user_id,
            partition=self.partition, comment=_comment(job), tag=job.tag, name=job.name,
            start_time=job.start_time,
        )  # fmt: skip

    def _nodelist(self, job: _Job) -> str:
        return ",".join(dict.fromkeys(n for n, _ in job.held_on))

    def _free(self, job: _Job) -> None:
        for node, index in job.held_on:
            gpu = self._nodes[node][index]
            if gpu.owner == job.job_id:
                gpu.owner = None
            gpu.shards.pop(job.job_id, None)
        if job.whole_memory:
            self._memory_taken.difference_update(n for n, _ in job.held_on)
        job.held_on = []

    def _memory_held(self, node: str) -> bool:
        """Whether a running job holds the node's whole memory."""
        return node in self._memory_taken

    def _try_start(self, job: _Job) -> bool:
        """Start the job when its request fits now (pinned nodes first, else any)."""
        pool = [n for n in job.req_nodes if n in self._nodes] or list(self._nodes)
        if self._memory_taken or job.whole_memory:  # a node's whole memory: no job beside it
            pool = [
                n
                for n in pool
                if n not in self._memory_taken
                and not (job.whole_memory and any(g.busy for g in self._nodes[n]))
            ]
        # a share of one GPU (shard or mps), or whole GPUs
        taken = self._fit_shard(pool, job) if job.gres.shared else self._fit_gpus(pool, job)
        if taken is None:
            job.reason = "Resources"
            return False
        job.held_on = taken
        if job.whole_memory:
            self._memory_taken.update(n for n, _ in taken)
        job.state, job.reason = "RUNNING", "None"
        job.start_time = None if self.clock is None else self.clock()
        return True

    def _fit_gpus(self, pool: list[str], job: _Job) -> list[tuple[str, int]] | None:
        chosen: list[tuple[str, int]] = []
        for node in pool:
            free = [i for i, g in enumerate(self._nodes[node]) if not g.busy]
            if len(free) >= job.gres.count:
                chosen.extend((node, i) for i in free[: job.gres.count])
            if len(chosen) == job.gres.count * job.num_nodes:
                for n, i in chosen:
                    self._nodes[n][i].owner = job.job_id
                return chosen
        return None

    def _fit_shard(self, pool: list[str], job: _Job) -> list[tuple[str, int]] | None:
        """One GPU for a shard or MPS job: one already shared (by jobs of the same kind)
        before an empty one."""
        size = self.mps_per_gpu if job.gres.kind == "mps" else self.shards_per_gpu
        options = []
        for node in pool[:1] if job.req_nodes else pool:
            for i, g in enumerate(self._nodes[node]):
                used = sum(g.shards.values())
                kinds = {self._jobs[sid].gres.kind for sid in g.shards}
                if g.owner is None and used + job.gres.count <= size and kinds <= {job.gres.kind}:
                    options.append((0 if used else 1, node, i))
        if not options:
            return None
        _, node, index = min(options)
        self._nodes[node][index].shards[job.job_id] = job.gres.count
        return [(node, index)]


_ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"})


def _comment(job: _Job) -> str:
    return "" if job.tag is None else job.tag.comment()
