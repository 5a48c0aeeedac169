"""Pure capacity arithmetic: a partition's usable GPUs minus those foreign jobs hold or block.

A job is foreign when the controller's store does not manage it: ``managed`` maps the Slurm
job ids of the store's active jobs to their owners' uids, and a job is the controller's own
only as one of those ids with that owner, whatever its comment says now (its owner can
rewrite it: ``scontrol update JobId=N Comment=...``); a running job carrying a tag the store
never adopted is foreign. A caller with no store (``managed`` None: preflight, the contract
tests) goes by the comment's icefrog tag (see ``port``). A foreign job holds
GPUs while it is in a holding state (RUNNING, COMPLETING, ...), on every node of its node
list that belongs to the partition, also when it was submitted to another partition that
shares those nodes. What it holds on a node is what Slurm allocated it there
(``SlurmJobState.gpus_by_node``: its whole GPUs and the GPUs its shards or MPS sit on),
however it asked (``--gres``, ``--gpus-per-node``, ``--gpus``, ``--gpus-per-task``,
``--gpus-per-socket``). Where Slurm gave no allocation (a completing job): a ``gpu:N`` job
holds N GPUs a node, a ``shard:K`` (``mps:N``) job ceil(K / shards-per-GPU)
(ceil(N / MPS-per-GPU)), a job that asked per job, task or socket every GPU of its nodes.

Memory and cores (``HostNeed``): on a site that schedules them (``SelectTypeParameters``
CR_Core_Memory and the like), a foreign job that holds a node's whole memory (``--mem=0``)
or all its cores but one GPU leaves the node's other GPUs free yet unusable: Slurm keeps a
job sent there pending (Resources). When the adapter read a node's cores and memory, the
node's GPUs usable by icefrog are min(free GPUs, free cores / cores per GPU, free memory /
memory per GPU), the rest counted as ``blocked_gpus``. Free means not held by foreign
jobs: the node's allocated cores and memory less what the managed jobs running there were
given (their own ``--mem-per-gpu``/``--cpus-per-gpu``, else the per-GPU need, a GPU's
worth for each GPU they hold), since those are planned. The per-GPU need is what a job
gets without asking (``site_need``): slurm.conf's DefCpuPerGPU and DefMemPerGPU (the
partition's, else the site's; else DefMemPerCPU times the cores per GPU). Where a
resource is scheduled but has no per-GPU default, a node with none of it free has no
usable GPU (every job takes a core and some memory). A site that does not schedule memory
(CR_Core) ignores memory; one that schedules neither, or a node whose resources were not
read, keeps the GPU count alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from icefrog_slurm.domain.cluster import NodeCapacity, PartitionCapacity, SlurmJobState
from icefrog_slurm.slurm.parse import expand_hostlist, parse_scontrol_fields
from icefrog_slurm.slurm.port import NodeGpus


def is_foreign(job: SlurmJobState, managed: Mapping[str, int] | None) -> bool:
    """Whether ``job`` is not the controller's (module docstring)."""
    if managed is None:
        return not job.is_icefrog
    return managed.get(job.job_id) != job.user_id


@dataclass(frozen=True)
class HostNeed:
    """What a GPU of the controller's job takes on its node besides the GPU (module
    docstring): whether the site schedules cores and memory, and the per-GPU defaults
    (None: no per-GPU default; the job still needs some)."""

    cores: bool = False
    memory: bool = False
    cpus_per_gpu: int | None = None
    mem_per_gpu_mb: int | None = None


def partition_capacity(
    *,
    partition: str,
    nodes: Sequence[NodeGpus],
    jobs: Iterable[SlurmJobState],
    managed: Mapping[str, int] | None = None,
    need: HostNeed | None = None,
    asked: Mapping[str, tuple[int | None, int | None]] | None = None,
) -> PartitionCapacity:
    """Capacity = sum over usable nodes n of max(GPUs(n) - foreign GPUs on n - GPUs blocked
    on n, 0) (module docstring).

    ``asked[job id]`` = (memory MB, cores) per GPU a managed job asked for (None: the need).
    """
    usable = {n.name: n for n in nodes if n.usable}
    foreign: dict[str, int] = dict.fromkeys(usable, 0)
    own_cpus: dict[str, int] = dict.fromkeys(usable, 0)
    own_mem: dict[str, int] = dict.fromkeys(usable, 0)
    need = need or HostNeed()
    foreign_ids: list[str] = []
    for job in jobs:
        if not job.holds_resources or not _asks_gpus(job):
            continue
        held_here = [n for n in expand_hostlist(job.nodelist) if n in usable]
        if not held_here:
            continue
        if not is_foreign(job, managed):
            mem, cpus = (asked or {}).get(job.job_id, (None, None))
            for name in held_here:
                gpus = _gpus_held(job, usable[name])
                own_cpus[name] += gpus * (cpus or need.cpus_per_gpu or 1)
                own_mem[name] += gpus * (mem or need.mem_per_gpu_mb or 0)
            continue
        foreign_ids.append(job.job_id)
        for name in held_here:
            foreign[name] += _gpus_held(job, usable[name])
    caps = []
    for name, node in usable.items():
        held = min(foreign[name], node.gpus)
        free = node.gpus - held
        limits = {
            "cores": _usable_by(node.cpus, node.alloc_cpus, own_cpus[name], need.cpus_per_gpu)
            if need.cores
            else None,
            "memory": _usable_by(
                node.memory_mb, node.alloc_memory_mb, own_mem[name], need.mem_per_gpu_mb
            )
            if need.memory
            else None,
        }
        short = {what: n for what, n in limits.items() if n is not None and n < free}
        usable_gpus = min([free, *short.values()])
        reasons = list(short)
        caps.append(
            NodeCapacity(
                name=name,
                gpus=node.gpus,
                foreign_gpus=held,
                blocked_gpus=free - usable_gpus,
                blocked_by=" and ".join(sorted(reasons)),
                shards=node.shards,
                mps=node.mps,
            )
        )
    return PartitionCapacity(
        partition=partition, nodes=tuple(caps), foreign_job_ids=tuple(foreign_ids)
    )


def _usable_by(total: int | None, alloc: int | None, own: int, per_gpu: int | None) -> int | None:
    """GPUs the part of a resource foreign jobs leave free can feed (None: not read; no
    limit but "some is free" without a per-GPU default)."""
    if total is None or alloc is None:
        return None
    free = total - max(alloc - own, 0)
    if free <= 0:
        return 0
    return free // per_gpu if per_gpu else _UNLIMITED


_UNLIMITED = 1 << 30


def _asks_gpus(job: SlurmJobState) -> bool:
    return job.gres is not None or job.gpus_otherwise or any(n for _, n in job.gpus_by_node or ())


def _gpus_held(job: SlurmJobState, node: NodeGpus) -> int:
    held = job.gpus_on(node.name)
    if held is not None:
        return held
    if job.gres is None:  # asked per job, task or socket: how many here is not known
        return node.gpus
    if job.gres.kind == "gpu":
        return job.gres.count
    shares = node.mps if job.gres.kind == "mps" else node.shards
    per_gpu = max(shares // node.gpus, 1) if node.gpus else 1
    return math.ceil(job.gres.count / per_gpu)


def site_need(config: str, partition: str) -> HostNeed:
    """``scontrol show config`` and ``scontrol -o show partition P`` -> the per-GPU need
    (module docstring): the partition's JobDefaults and DefMemPerCPU before the site's."""
    site = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^([A-Za-z]\w*)\s+=\s*(.*)$", config, re.MULTILINE)
    }
    part = parse_scontrol_fields(partition.strip())
    select = site.get("SelectTypeParameters", "").upper()

    def default(key: str) -> int | None:
        for fields in (part, site):
            for item in fields.get("JobDefaults", "").split(","):
                name, _, value = item.strip().partition("=")
                if name == key:
                    return _positive(value)
        return None

    cpus = default("DefCpuPerGPU")
    mem = default("DefMemPerGPU")
    per_cpu = _positive(part.get("DefMemPerCPU", "")) or _positive(site.get("DefMemPerCPU", ""))
    if mem is None and per_cpu is not None and cpus is not None:
        mem = per_cpu * cpus
    return HostNeed(
        cores=any(k in select for k in ("CR_CORE", "CR_CPU", "CR_SOCKET")),
        memory="MEMORY" in select,
        cpus_per_gpu=cpus,
        mem_per_gpu_mb=mem,
    )


def with_resources(nodes: Sequence[NodeGpus], show_node: str) -> tuple[NodeGpus, ...]:
    """``nodes`` with the cores and memory ``scontrol -o show node`` gives for them (Slurm's
    own numeric fields, CPUEfctv before CPUTot); a node it does not list, or lists without
    them, keeps None (its GPU count alone decides)."""
    read: dict[str, dict[str, str]] = {}
    for line in show_node.splitlines():
        fields = parse_scontrol_fields(line.strip())
        if "NodeName" in fields:
            read.setdefault(fields["NodeName"], fields)
    out = []
    for node in nodes:
        f = read.get(node.name, {})
        numbers = (
            _count(f.get("CPUEfctv") or f.get("CPUTot")),
            _count(f.get("CPUAlloc")),
            _count(f.get("RealMemory")),
            _count(f.get("AllocMem")),
        )
        if None in numbers:
            out.append(node)
            continue
        cpus, alloc_cpus, memory, alloc_memory = numbers
        out.append(
            replace(
                node,
                cpus=cpus,
                alloc_cpus=alloc_cpus,
                memory_mb=memory,
                alloc_memory_mb=alloc_memory,
            )
        )
    return tuple(out)


def _count(text: str | None) -> int | None:
    """A count Slurm printed, else None (missing, or not a plain number: not read)."""
    return int(text) if text is not None and re.fullmatch(r"[0-9]{1,15}", text) else None


def _positive(text: str) -> int | None:
    """A default's value: a positive number, else None (UNLIMITED, 0, unset)."""
    text = text.strip()
    return int(text) if re.fullmatch(r"[0-9]{1,15}", text) and int(text) > 0 else None
