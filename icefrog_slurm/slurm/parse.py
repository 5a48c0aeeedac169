"""Pure parsers of Slurm's output (squeue --json, sinfo, scontrol, sbatch), 22.05 and newer.

Jobs are read from ``squeue --json`` only: a job's name, comment, paths and other fields are
user text and may hold line breaks, ``|`` or ``Key=value`` look-alikes, so no text format
can tell them from Slurm's own fields; JSON can. One malformed job record is skipped and
logged, never fatal. Layouts differ by version and are handled in one place
(:func:`_number`, :func:`_state`): the openapi v0.0.38 plugin of 22.05 prints plain numbers
and a state word; data_parser v0.0.40+ (23.11 and newer) prints ``{"set", "infinite",
"number"}`` objects and a list of state flags.

Text outputs still parsed: ``sinfo`` (node names and GRES: admin-defined), ``scontrol show
hostnames``, ``scontrol show partition`` and ``node``, and ``sbatch --parsable``. Pinned by
the golden files in tests/golden/slurm-22.05. TresPerNode is ``gres:gpu:2`` on 22.05 and
``gres/gpu:2`` on 24.11 (a type may sit in between: ``gres/gpu:a800:2``); a job's per-node
allocation (``gres_detail``) prints a shard as ``shard:1(IDX:0)`` on 22.05 and
``shard:1(1/2,0/2,0/2,0/2)`` (per GPU: used/available) on 24.11.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from icefrog_slurm.domain.cluster import (
    COMMENT_PREFIX,
    SHARED_KINDS,
    Gres,
    GresKind,
    IcefrogTag,
)
from icefrog_slurm.slurm.port import (
    GresAllocation,
    NodeGpus,
    SlurmError,
    SlurmJobDetail,
    SlurmUnavailable,
)

log = logging.getLogger(__name__)

_NULL = ("(null)", "N/A", "")
# "Key=" starts a field of scontrol's one-line output; values may hold spaces (paths).
_FIELD_START = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")
MAX_HOSTLIST_NAMES = 65536
"""Most names one hostlist may expand to (counted before expanding: ``n[1-999999999]`` is
refused, not built in memory)."""
MAX_HOSTLIST_TEXT = 65536
_HOSTLIST = re.compile(r"[A-Za-z0-9._\-\[\],]+")
_NODE_NAME = re.compile(r"[A-Za-z0-9._\-]+")


class ParseError(SlurmError, ValueError):
    """Slurm printed something the parser does not understand (names the text). A
    SlurmError, so a controller that handles SlurmError never crashes on odd output."""


def _opt(value: str | None) -> str | None:
    return None if value is None or value.strip() in _NULL else value.strip()


def parse_tag(comment: str | None) -> IcefrogTag | None:
    """``icefrog:<key>[;prev=<id>][;sig=<hex>]`` -> IcefrogTag; any other comment -> None
    (a foreign job). Whether a tag's signature is genuine is ``identity``'s question."""
    if not comment or not comment.startswith(COMMENT_PREFIX):
        return None
    key, *rest = comment[len(COMMENT_PREFIX) :].strip().split(";")
    if not key:
        return None
    extra = dict(part.partition("=")[::2] for part in rest)
    prev, sig = extra.get("prev"), extra.get("sig")
    return IcefrogTag(
        key=key,
        previous_id=prev if prev and prev.isascii() and prev.isdigit() else None,
        signature=sig or None,
    )


_KINDS: dict[str, GresKind] = {"gpu": "gpu", "shard": "shard", "mps": "mps"}


def parse_gres_request(text: str | None) -> Gres | None:
    """A job's per-node request (``gres:gpu:2``, ``gres/shard:1``, ``gres:mps:30``,
    ``gpu:a800:2``) -> Gres.

    Only gpu, shard and mps count; other GRES in a comma list are ignored; none -> None; a
    type without a count (``gpu:a800``) is one, as Slurm reads it.
    """
    if _opt(text) is None:
        return None
    assert text is not None
    for item in text.split(","):
        parts = re.split(r"[:/]", item.strip())
        if parts and parts[0] == "gres":
            parts = parts[1:]
        if not parts or parts[0] not in _KINDS:
            continue
        count = parts[-1] if len(parts) > 1 else "1"
        if not (count.isascii() and count.isdigit()):  # gpu:a800 (a type, no count) is 1
            count = "1"
        return Gres(kind=_KINDS[parts[0]], count=max(int(count), 1))
    return None


def parse_squeue_json(text: str) -> dict[str, SlurmJobDetail]:
    """``squeue --json`` -> {job id: SlurmJobDetail}. A record that cannot be read (a field
    missing or of the wrong type) is skipped and logged: one odd job never hides the rest.
    squeue exits 0 with an empty job list and an ``errors`` entry when slurmctld does not
    answer: that is ``SlurmUnavailable``, never "no jobs"."""
    try:
        doc = json.loads(text)
        records, errors = doc["jobs"], doc.get("errors") or []
        if not isinstance(records, list) or not isinstance(errors, list):
            raise TypeError("jobs or errors is not a list")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ParseError(f"squeue --json: not a job list ({exc}): {text[:200]!r}") from None
    if errors:  # exit code 0, no jobs, and why: slurmctld did not answer
        raise SlurmUnavailable(f"squeue --json: {_errors_text(errors)}")
    jobs: dict[str, SlurmJobDetail] = {}
    for record in records:
        try:
            detail = _job_from_json(record)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            jid = record.get("job_id") if isinstance(record, dict) else None
            shown = jid if isinstance(jid, int) else repr(jid)[:40]  # escaped when not a number
            log.warning("slurm_job=%s: squeue --json record skipped: %s", shown, str(exc)[:200])
            continue
        jobs[detail.job_id] = detail
    return jobs


def _errors_text(errors: list[Any]) -> str:
    parts = []
    for e in errors[:3]:
        if isinstance(e, dict):
            parts.append(" ".join(str(e.get(k, "")) for k in ("source", "description", "error")))
        else:
            parts.append(str(e))
    return "; ".join(p.strip() for p in parts)[:300]


def _job_from_json(r: Mapping[str, Any]) -> SlurmJobDetail:
    job_id = _number(r["job_id"])
    uid, gid = _number(r["user_id"]), _number(r["group_id"])
    if job_id is None or uid is None or gid is None:
        raise ValueError("job_id, user_id or group_id unset")
    comment = _text(r.get("comment"))
    gres = parse_gres_request(_text(r.get("tres_per_node")))
    detail = _detail_of(r.get("gres_detail"))
    return SlurmJobDetail(
        job_id=str(job_id),
        name=_text(r.get("name")),
        user_id=uid,
        group_id=gid,
        state=_state(r["job_state"]),
        reason=_text(r.get("state_reason")),
        restarts=_number(r.get("restart_cnt", 0)) or 0,
        gres=gres,
        num_nodes=_number(r.get("node_count", 1)) or 1,
        req_nodes=_opt(_text(r.get("required_nodes"))),
        nodelist=_opt(_text(r.get("nodes"))),
        partition=_text(r.get("partition")),
        work_dir=_text(r.get("current_working_directory")),
        std_out=_opt(_text(r.get("standard_output"))),
        std_err=_opt(_text(r.get("standard_error"))),
        time_limit_min=_number(r.get("time_limit")),
        comment=comment,
        tag=parse_tag(comment),
        priority=_number(r.get("priority", 0)) or 0,
        gpus_by_node=_gpus_by_node(detail, _text(r.get("nodes"))),
        gres_detail=detail,
        compound=bool(
            _number(r.get("array_job_id"))
            or _number(r.get("het_job_id"))
            or _text(r.get("array_task_string"))
        ),
        gpus_otherwise=gres is None
        and any(_GPU_ASKED.search(_text(r.get(k))) for k in _OTHER_GPU_REQUESTS),
        start_time=float(_number(r.get("start_time")) or 0) or None,
        **_host_share(r),
    )


_OTHER_GPU_REQUESTS = ("tres_per_job", "tres_per_task", "tres_per_socket")
_GPU_ASKED = re.compile(r"(?:^|[,:/])gpu(?:[:=]|$)")  # gres:gpu:2, gres/gpu=1 (24.11 per task)


def _detail_of(value: Any) -> tuple[str, ...]:
    """squeue's ``gres_detail`` as a tuple of strings (() when it is anything else)."""
    if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
        return ()
    return tuple(value)


@functools.lru_cache(maxsize=8192)
def _gpus_by_node(detail: tuple[str, ...], nodelist: str) -> tuple[tuple[str, int], ...] | None:
    """``gres_detail`` (:func:`gres_allocations`) -> the GPUs the job holds on each node:
    its whole GPUs and the GPUs its shards or MPS sit on. None where Slurm gave none (a
    pending job) or it does not read as one entry a node with device indices (the caller
    then counts by the request). Remembered: a job shows the same allocation at every poll
    (a hostlist's expansion is the costly part)."""
    if not detail:
        return None
    try:
        by_node = _allocations_by_node(detail, nodelist)
    except ParseError:
        return None
    out = []
    for name, allocs in by_node:
        whole, shared = 0, set[int]()
        for alloc in allocs:
            if alloc.kind == "gpu":
                whole += len(alloc.indices) or alloc.count
            elif alloc.kind in SHARED_KINDS:
                if not alloc.indices:
                    return None
                shared.update(alloc.indices)
        out.append((name, whole + len(shared)))
    return tuple(out)


def _allocations_by_node(
    detail: tuple[str, ...], nodelist: str
) -> tuple[tuple[str, tuple[GresAllocation, ...]], ...]:
    """``gres_detail``, one string a node of the job's node list, in order
    (``gpu:a800:2(IDX:0-1)``, ``shard:1(IDX:0)``, 24.11's ``shard:1(1/2,0/2,0/2,0/2)``) ->
    (node, its allocations) a node; a ParseError where it does not read so. One node name
    is taken as it is, not expanded as a hostlist."""
    names = (nodelist,) if _NODE_NAME.fullmatch(nodelist) else expand_hostlist(nodelist)
    if len(names) != len(detail):
        raise ParseError(f"gres_detail of {len(detail)} nodes for {nodelist[:80]!r}")
    return tuple(
        (name, tuple(_gres_item(item, (name,)) for item in _split_top(text) if item.strip()))
        for name, text in zip(names, detail, strict=True)
    )


def _host_share(r: Mapping[str, Any]) -> dict[str, int | None]:
    """The memory (MB) and cores a job has besides its GPUs, in the form icefrog asks for
    them (``commands.host_share``): per GPU (``memory_per_tres``/``cpus_per_tres``:
    ``gres:gpu:900``, ``gres/gpu:900``, or ``gpu:450`` where Slurm 22.05 filled in
    ``DefMemPerGPU``/``DefCpuPerGPU``) for a GPU job, per node and per task for a shard job
    that asked for them (a shard job on ``DefMemPerCPU`` shows ``memory_per_cpu``: None)."""
    gres = parse_gres_request(_text(r.get("tres_per_node")))
    if gres is not None and gres.shared:
        # one task: 22.05 leaves cpus_per_task unset and shows -c 2 as 2 cores a node; one
        # core is the default, not something asked for
        cores = _number(r.get("cpus_per_task")) or _number(r.get("minimum_cpus_per_node"))
        return {
            "mem_per_gpu_mb": _number(r.get("memory_per_node")) or None,
            "cpus_per_gpu": cores if cores and cores > 1 else None,
        }
    return {
        "mem_per_gpu_mb": _per_gpu(r.get("memory_per_tres")),
        "cpus_per_gpu": _per_gpu(r.get("cpus_per_tres")),
    }


def _per_gpu(value: Any) -> int | None:
    for item in _text(value).split(","):
        m = re.fullmatch(r"(?:gres[:/])?gpu(?::[^:,=]+)?[:=]([0-9]{1,18})", item.strip())
        if m:
            return int(m.group(1)) or None
    return None


def _number(value: Any) -> int | None:
    """A number as every layout prints it: ``5``, ``null``, or v0.0.40+'s ``{"set": true,
    "infinite": false, "number": 5}`` (None when unset or infinite)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {str(value)[:40]!r}")
    return value


def _state(value: Any) -> str:
    """``"RUNNING"`` (22.05) or ``["PENDING", "REQUEUED"]`` (v0.0.40+: the base state
    first, then flags) -> the base state."""
    if isinstance(value, list):
        value = value[0] if value else ""
    if not isinstance(value, str) or not value:
        raise TypeError(f"job_state {str(value)[:40]!r}")
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"not a string: {str(value)[:40]!r}")
    return value


MAX_GPU_INDEX = 4096
"""GPU indices on one node past this (``IDX:0-999999999999``) are no Slurm output: refused
before a range of them is made."""


def parse_scontrol_fields(line: str) -> dict[str, str]:
    """``Key=value Key2=value with spaces`` -> dict. Only for lines made of Slurm's own
    fields (``scontrol show partition`` and ``node``: admin-defined): a user field would
    spoof it."""
    starts = list(_FIELD_START.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
        fields.setdefault(m.group(1), line[m.end() : end].strip())
    return fields


def _split_top(text: str, brackets: str = "()") -> Iterator[str]:
    """Split on commas outside brackets: ``gpu:2(IDX:0-1),shard:1(1/2,0/2)``, ``n[1-2],m``."""
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == brackets[0]:
            depth += 1
        elif ch == brackets[1]:
            depth -= 1
        elif ch == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    if text[start:]:
        yield text[start:]


def parse_index_list(text: str) -> tuple[int, ...]:
    """``0-1,3`` -> (0, 1, 3); anything else (a non-number, an index past
    :data:`MAX_GPU_INDEX`) is a ParseError naming the text."""
    out: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        m = re.fullmatch(r"(\d{1,5})(?:-(\d{1,5}))?", part)
        lo, hi = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (0, -1)
        if not m or hi < lo or hi > MAX_GPU_INDEX or len(out) + hi - lo >= MAX_GPU_INDEX:
            raise ParseError(f"GPU index list {text[:80]!r} not understood")
        out.extend(range(lo, hi + 1))
    return tuple(out)


def _gres_item(item: str, nodes: tuple[str, ...]) -> GresAllocation:
    m = re.fullmatch(r"([^:(]+)(?::[^:(]+)?:(\d{1,9})\((.*)\)", item.strip())
    if not m:
        raise ParseError(f"GRES allocation {item[:80]!r} not understood")
    kind, count, inner = m.group(1), int(m.group(2)), m.group(3)
    if inner.startswith("IDX:"):
        idx = parse_index_list(inner[4:]) if inner[4:] != "N/A" else ()
    elif inner.startswith("CNT:"):
        idx = ()
    else:  # 24.11 shared GRES: "used/avail" per device
        used = [re.fullmatch(r"(\d{1,9})/\d{1,9}", p) for p in inner.split(",")]
        if not all(used) or len(used) > MAX_GPU_INDEX:
            raise ParseError(f"GRES allocation {item[:80]!r} not understood")
        idx = tuple(i for i, u in enumerate(used) if u and int(u.group(1)) > 0)
    return GresAllocation(nodes=nodes, kind=kind, count=count, indices=idx)


def gres_allocations(detail: tuple[str, ...], nodelist: str) -> tuple[GresAllocation, ...]:
    """squeue's ``gres_detail`` -> a GresAllocation a node and kind: which device indices
    (:func:`_allocations_by_node`; a ParseError where it does not read so)."""
    if not detail:
        return ()
    return tuple(a for _, allocs in _allocations_by_node(detail, nodelist) for a in allocs)


def parse_sinfo_nodes(text: str) -> tuple[NodeGpus, ...]:
    """``sinfo -h -N -p P -o '%N|%t|%G'`` -> one NodeGpus a node (gpu, shard, mps counts)."""
    nodes: dict[str, NodeGpus] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 3:
            raise ParseError(f"sinfo line has {len(parts)} fields, expected 3: {line!r}")
        name, state, gres_text = parts
        counts = {"gpu": 0, "shard": 0, "mps": 0}
        for item in _split_top(gres_text):
            item = re.sub(r"\(.*\)$", "", item.strip())  # drop "(S:0-1)" socket info
            bits = item.split(":")
            if bits[0] in counts and len(bits) >= 2 and bits[-1].isdigit():
                counts[bits[0]] += int(bits[-1])
        nodes[name] = NodeGpus(
            name=name, state=state, gpus=counts["gpu"], shards=counts["shard"], mps=counts["mps"]
        )
    return tuple(nodes.values())


def _check_hostlist(text: str) -> None:
    """Refuse what is not a Slurm hostlist, or one too long, before anything is expanded.

    Only what Slurm's hostlists use is accepted (names of letters, digits, ``.``, ``_``,
    ``-``; bracketed ranges ``[1-3,5]``, zero padding kept): ClusterShell's own extensions
    (``@group``, which could run a configured group command, the set operators ``!&^``,
    ``/step``) are refused, and so is a list of more than :data:`MAX_HOSTLIST_NAMES` names,
    counted from the ranges before anything is expanded.
    """
    if len(text) > MAX_HOSTLIST_TEXT or not _HOSTLIST.fullmatch(text):
        raise ParseError(f"hostlist {text[:80]!r}: not a Slurm hostlist")
    total = 0
    for item in _split_top(text, "[]"):
        count = 1
        for group in re.findall(r"\[([^\[\]]*)\]", item):
            count *= _range_size(group, text)
        total += count
        if total > MAX_HOSTLIST_NAMES:
            raise ParseError(
                f"hostlist {text[:80]!r}: more than {MAX_HOSTLIST_NAMES} names, refused"
            )


def _range_size(group: str, text: str) -> int:
    n = 0
    for part in group.split(","):
        lo, _, hi = part.partition("-")
        if not (lo.isdigit() and (hi or lo).isdigit()) or len(lo) > 9 or len(hi) > 9:
            raise ParseError(f"hostlist {text[:80]!r}: bad range {part[:20]!r}")
        n += max(int(hi or lo) - int(lo) + 1, 0)
    return n


def expand_hostlist(text: str) -> tuple[str, ...]:
    """``node[1-3,5],gpu07`` -> ("node1", "node2", "node3", "node5", "gpu07") like
    ``scontrol show hostnames`` (zero padding kept, any number of bracket groups a name:
    ``rack[1-2]-node[01-02]``), through ClusterShell's NodeSet. Names keep the order of
    the comma list (each item's own names sorted), each once. Not a hostlist, or more than
    :data:`MAX_HOSTLIST_NAMES` names: ParseError."""
    if _opt(text) is None:
        return ()
    stripped = text.strip()
    _check_hostlist(stripped)
    names: dict[str, None] = {}
    try:
        for item in _split_top(stripped, "[]"):
            names.update(dict.fromkeys(NodeSet(item, resolver=RESOLVER_NOGROUP)))
    except NodeSetException as exc:
        raise ParseError(f"hostlist {stripped[:80]!r}: {str(exc)[:120]}") from None
    return tuple(names)


def compress_hostlist(names: Iterable[str]) -> str:
    """Node names -> a hostlist as Slurm prints one: ``node1,node2,node4`` ->
    ``node[1-2,4]`` (sorted; only the last number of a name folds, as Slurm's
    ``scontrol show hostlist`` does: ``rack1-node[01-02],rack2-node01``). A name that is
    not a Slurm node name: ParseError."""
    items = list(names)
    if not items:
        return ""
    for name in items:
        if not _NODE_NAME.fullmatch(name):
            raise ParseError(f"node name {name[:80]!r}: not a Slurm node name")
    nodes = NodeSet(resolver=RESOLVER_NOGROUP, fold_axis=[-1])
    nodes.updaten(items)
    return str(nodes)


def parse_hostnames(text: str) -> tuple[str, ...]:
    """``scontrol show hostnames`` output: one name a line."""
    return tuple(ln.strip() for ln in text.splitlines() if ln.strip())


def parse_version(text: str) -> tuple[int, int]:
    """``scontrol --version`` (``slurm 24.11.5``; Debian's ``slurm-wlm 24.11.5``) -> (24, 11)."""
    m = re.fullmatch(r"slurm(?:-wlm)? ([0-9]{1,4})\.([0-9]{1,4})\.[0-9A-Za-z.-]+", text.strip())
    if not m:
        raise ParseError(f"not a Slurm version: {text[:80]!r}")
    return int(m.group(1)), int(m.group(2))


def parse_sbatch_parsable(text: str) -> str:
    """``sbatch --parsable`` prints ``<id>`` or ``<id>;<cluster>``."""
    first = text.strip().splitlines()[-1] if text.strip() else ""
    jid = first.split(";")[0].strip()
    if not jid.isdigit():
        raise ParseError(f"sbatch printed no job id: {text!r}")
    return jid
