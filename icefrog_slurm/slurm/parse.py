"""Pure parsers of Slurm's text output (squeue, scontrol, sinfo, sbatch), 22.05 and 24.11.

Pinned by the golden files in tests/golden/slurm-22.05 (captured here) and
tests/golden/slurm-24.11 (built from the 24.11 source). Differences handled:
TresPerNode/``%b`` is ``gres:gpu:2`` on 22.05 and ``gres/gpu:2`` on 24.11 (a type may sit
in between: ``gres/gpu:a800:2``); a shard allocation prints ``shard:1(IDX:0)`` on 22.05 and
``shard:1(1/2,0/2,0/2,0/2)`` (per GPU: used/available) on 24.11.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from icefrog_slurm.slurm.port import (
    COMMENT_PREFIX,
    Gres,
    GresAllocation,
    IcefrogTag,
    JobDetail,
    JobState,
    NodeGpus,
    SlurmError,
)

_NULL = ("(null)", "N/A", "")
# "Key=" starts a field of scontrol's one-line output; values may hold spaces (paths).
_FIELD_START = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


class ParseError(SlurmError, ValueError):
    """Slurm printed something the parser does not understand (names the text). A
    SlurmError, so a controller that handles SlurmError never crashes on odd output."""


def _opt(value: str | None) -> str | None:
    return None if value is None or value.strip() in _NULL else value.strip()


def parse_tag(comment: str | None) -> IcefrogTag | None:
    """``icefrog:<key>[;prev=<id>]`` -> IcefrogTag; any other comment -> None (foreign)."""
    if not comment or not comment.startswith(COMMENT_PREFIX):
        return None
    body = comment[len(COMMENT_PREFIX) :].strip()
    key, _, rest = body.partition(";")
    if not key:
        return None
    prev = rest[len("prev=") :] if rest.startswith("prev=") else None
    return IcefrogTag(key=key, previous_id=prev or None)


def parse_gres_request(text: str | None) -> Gres | None:
    """A job's per-node request (``gres:gpu:2``, ``gres/shard:1``, ``gpu:a800:2``) -> Gres.

    Only gpu and shard count; other GRES in a comma list are ignored; none -> None.
    """
    if _opt(text) is None:
        return None
    assert text is not None
    for item in text.split(","):
        parts = re.split(r"[:/]", item.strip())
        if parts and parts[0] == "gres":
            parts = parts[1:]
        if not parts or parts[0] not in ("gpu", "shard"):
            continue
        count = parts[-1] if len(parts) > 1 else "1"
        if not count.isdigit():
            raise ParseError(f"GRES request {text!r}: count {count!r} is not a number")
        return Gres(kind="gpu" if parts[0] == "gpu" else "shard", count=int(count))
    return None


def parse_squeue(text: str) -> dict[str, JobState]:
    """Lines of ``squeue -h -o '%i|%T|%b|%D|%N|%r|%Q|%U|%P|%k'`` -> {job id: JobState}."""
    jobs: dict[str, JobState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 9)
        if len(parts) != 10:
            raise ParseError(f"squeue line has {len(parts)} fields, expected 10: {line!r}")
        jid, state, tres, nnodes, nodelist, reason, prio, uid, partition, comment = parts
        try:
            jobs[jid] = JobState(
                job_id=jid,
                state=state.split()[0] if state else state,
                gres=parse_gres_request(tres),
                num_nodes=int(nnodes),
                nodelist=nodelist,
                reason=reason,
                priority=int(prio),
                user_id=int(uid),
                partition=partition,
                comment=_opt(comment) or "",
                tag=parse_tag(_opt(comment)),
            )
        except ValueError as exc:
            raise ParseError(f"squeue line {line!r}: {exc}") from exc
    return jobs


def parse_scontrol_fields(line: str) -> dict[str, str]:
    """``Key=value Key2=value with spaces`` (one record of ``scontrol -o``) -> dict."""
    starts = list(_FIELD_START.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
        fields[m.group(1)] = line[m.end() : end].strip()
    return fields


def _id_of(text: str) -> int:
    """``root(0)`` -> 0."""
    m = re.search(r"\((\d+)\)\s*$", text)
    if not m:
        raise ParseError(f"no numeric id in {text!r}")
    return int(m.group(1))


def parse_job_detail(text: str) -> JobDetail:
    """``scontrol -o show job X`` -> JobDetail."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), None)
    if line is None:
        raise ParseError(f"no JobId= record in scontrol output: {text[:200]!r}")
    f = parse_scontrol_fields(line)
    try:
        comment = _opt(f.get("Comment")) or ""
        return JobDetail(
            job_id=f["JobId"],
            name=f.get("JobName", ""),
            user_id=_id_of(f["UserId"]),
            group_id=_id_of(f["GroupId"]),
            state=f["JobState"],
            reason=f.get("Reason", ""),
            restarts=int(f.get("Restarts", "0")),
            gres=parse_gres_request(f.get("TresPerNode")),
            num_nodes=f.get("NumNodes", ""),
            req_nodes=_opt(f.get("ReqNodeList")),
            nodelist=_opt(f.get("NodeList")),
            partition=f.get("Partition", ""),
            work_dir=f.get("WorkDir", ""),
            std_out=_opt(f.get("StdOut")),
            std_err=_opt(f.get("StdErr")),
            time_limit=f.get("TimeLimit", ""),
            comment=comment,
            tag=parse_tag(comment),
            fields=f,
        )
    except KeyError as exc:
        raise ParseError(f"scontrol record lacks field {exc}: {line[:200]!r}") from exc


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
    """``0-1,3`` -> (0, 1, 3)."""
    out: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def _gres_item(item: str, nodes: tuple[str, ...]) -> GresAllocation:
    m = re.fullmatch(r"([^:(]+)(?::[^:(]+)?:(\d+)\((.*)\)", item.strip())
    if not m:
        raise ParseError(f"GRES allocation {item!r} not understood")
    kind, count, inner = m.group(1), int(m.group(2)), m.group(3)
    if inner.startswith("IDX:"):
        idx = parse_index_list(inner[4:]) if inner[4:] != "N/A" else ()
    elif inner.startswith("CNT:"):
        idx = ()
    else:  # 24.11 shared GRES: "used/avail" per device
        idx = tuple(i for i, p in enumerate(inner.split(",")) if int(p.split("/")[0]) > 0)
    return GresAllocation(nodes=nodes, kind=kind, count=count, indices=idx)


def parse_gres_detail(
    text: str, *, hostnames: Mapping[str, tuple[str, ...]] | None = None
) -> tuple[GresAllocation, ...]:
    """``scontrol show job -d X``: every ``Nodes=... GRES=...`` line -> GresAllocation.

    ``hostnames`` maps a node-list string to its expansion (default: expand_hostlist).
    """
    out: list[GresAllocation] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("Nodes=") or " GRES=" not in stripped:
            continue
        f = parse_scontrol_fields(stripped)
        gres = f.get("GRES", "")
        nodelist = f["Nodes"]
        nodes = (hostnames or {}).get(nodelist) or expand_hostlist(nodelist)
        out.extend(_gres_item(item, nodes) for item in _split_top(gres) if item.strip())
    return tuple(out)


def parse_sinfo_nodes(text: str) -> tuple[NodeGpus, ...]:
    """``sinfo -h -N -p P -o '%N|%t|%G'`` -> one NodeGpus a node (gpu and shard counts)."""
    nodes: dict[str, NodeGpus] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 3:
            raise ParseError(f"sinfo line has {len(parts)} fields, expected 3: {line!r}")
        name, state, gres_text = parts
        counts = {"gpu": 0, "shard": 0}
        for item in _split_top(gres_text):
            item = re.sub(r"\(.*\)$", "", item.strip())  # drop "(S:0-1)" socket info
            bits = item.split(":")
            if bits[0] in counts and len(bits) >= 2 and bits[-1].isdigit():
                counts[bits[0]] += int(bits[-1])
        nodes[name] = NodeGpus(name=name, state=state, gpus=counts["gpu"], shards=counts["shard"])
    return tuple(nodes.values())


def expand_hostlist(text: str) -> tuple[str, ...]:
    """``node[1-3,5],gpu07`` -> ("node1", "node2", "node3", "node5", "gpu07") like
    ``scontrol show hostnames`` (zero padding kept; one bracket group a name)."""
    if _opt(text) is None:
        return ()
    out: list[str] = []
    for item in _split_top(text, "[]"):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", item)
        if not m:
            out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{n:0{width}d}{suffix}")
    return tuple(out)


def parse_hostnames(text: str) -> tuple[str, ...]:
    """``scontrol show hostnames`` output: one name a line."""
    return tuple(ln.strip() for ln in text.splitlines() if ln.strip())


def parse_sbatch_parsable(text: str) -> str:
    """``sbatch --parsable`` prints ``<id>`` or ``<id>;<cluster>``."""
    first = text.strip().splitlines()[-1] if text.strip() else ""
    jid = first.split(";")[0].strip()
    if not jid.isdigit():
        raise ParseError(f"sbatch printed no job id: {text!r}")
    return jid
