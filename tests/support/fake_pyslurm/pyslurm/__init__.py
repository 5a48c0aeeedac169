"""TEST STAND-IN for the ``pyslurm`` library (25.11 API); it is NOT pyslurm.

pyslurm on PyPI is 25.11 only and its build refuses the Slurm 22.05 / 24.11 installed here,
so the real library cannot be installed. This module implements just the subset of pyslurm
25.11's API that ``icefrog_slurm.slurm.pyslurm_backend`` uses, with the same names,
signatures and attributes (``JobSubmitDescription(...).submit()``, ``Job(id)`` /
``Job.load(id)`` with ``release``, ``modify``, ``requeue(hold=)``,
``send_signal(signal, steps=)``, ``cancel``, ``to_dict``; ``Jobs.load()``; ``RPCError``
with ``errno``), by calling the real Slurm command-line tools of the local cluster
(sbatch, scontrol, scancel). Slurm errors become ``RPCError`` with the Slurm errno the C
API would give (invalid job id 2017, already done 2021, controller unreachable 1800).

What the contract tests verify through it: the adapter's logic (requests it builds,
conversions, error mapping, idempotent submission) against the real cluster. They do not
verify pyslurm itself (its C bindings, its exact parsing of job records). The tests put
this folder on ``sys.path`` only when the real pyslurm is not importable.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from typing import Any

__version__ = "25.11.0-icefrog-test-stand-in"
IS_TEST_STAND_IN = True

_TIMEOUT_S = 20
_UNAVAILABLE = ("unable to contact slurm controller", "socket timed out", "connection refused")


class RPCError(Exception):
    """As ``pyslurm.RPCError``: ``errno`` (Slurm error number) and ``msg``."""

    def __init__(self, errno: int = -1, msg: str | None = None) -> None:
        self.errno = errno
        self.msg = msg or f"Slurm error {errno}"
        super().__init__(self.msg)


def _errno(msg: str) -> int:
    low = msg.lower()
    if any(p in low for p in _UNAVAILABLE):
        return 1800  # SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR
    if "invalid job id" in low:
        return 2017  # ESLURM_INVALID_JOB_ID
    if "already completing or completed" in low or "has already finished" in low:
        return 2021  # ESLURM_ALREADY_DONE
    return -1  # SLURM_ERROR


def _run(argv: list[str], stdin: str | None = None) -> str:
    try:
        cp = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise RPCError(5004, f"{argv[0]}: Socket timed out") from exc
    if cp.returncode != 0:
        msg = cp.stderr.strip() or cp.stdout.strip() or f"{argv[0]} exit {cp.returncode}"
        raise RPCError(_errno(msg), msg)
    return cp.stdout


def _fields(line: str) -> dict[str, str]:
    """One ``scontrol -o show job`` record: ``Key=value Key2=value with spaces``."""
    starts = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=", line))
    return {
        m.group(1): line[m.end() : (starts[i + 1].start() if i + 1 < len(starts) else None)].strip()
        for i, m in enumerate(starts)
    }


def _null(v: str | None) -> str | None:
    return None if v in (None, "", "(null)", "None") else v


def _gres_dict(tres: str | None) -> dict[str, int]:
    """``gres/gpu:2`` or ``gres:gpu:2`` -> ``{"gpu": 2}`` (as pyslurm's cstr.to_gres_dict)."""
    out: dict[str, int] = {}
    for item in (_null(tres) or "").split(","):
        m = re.fullmatch(r"gres[:/]([^:]+)(?::[^:]+)?:(\d+)", item.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def _epoch(stamp: str | None) -> int | None:
    """scontrol's local ``2026-12-04T23:40:00`` -> Unix seconds (pyslurm's ``int``);
    ``Unknown``/``None`` -> None."""
    try:
        return int(datetime.datetime.fromisoformat(stamp or "").timestamp())
    except ValueError:
        return None


def _minutes(limit: str) -> int | None:
    """``[D-]HH:MM:SS`` -> minutes; UNLIMITED -> None."""
    if limit in ("UNLIMITED", "Partition_Limit", ""):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts
    return (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)


def _when(stamp: int | str | None) -> str | None:
    """pyslurm's begin_time (epoch seconds) -> the ISO time sbatch/scontrol take."""
    if stamp is None:
        return None
    return datetime.datetime.fromtimestamp(int(stamp)).isoformat(timespec="seconds")


class JobSubmitDescription:
    """The subset of pyslurm's ``JobSubmitDescription`` the adapter sets."""

    _SUPPORTED = (
        "name",
        "script",
        "comment",
        "priority",
        "is_requeueable",
        "gres_per_node",
        "nodes",
        "required_nodes",
        "partitions",
        "standard_output",
        "working_directory",
        "time_limit",
        "begin_time",
        "memory_per_gpu",
        "cpus_per_gpu",
        "memory_per_node",
        "cpus_per_task",
    )

    def __init__(self, **kwargs: Any) -> None:
        for key in self._SUPPORTED:
            setattr(self, key, None)
        for key, value in kwargs.items():
            if key not in self._SUPPORTED:
                raise TypeError(f"stand-in JobSubmitDescription: {key!r} not implemented")
            setattr(self, key, value)

    def submit(self) -> int:
        argv = ["sbatch", "--parsable"]
        if self.priority == 0:
            argv.append("--hold")
        if self.is_requeueable:
            argv.append("--requeue")
        opts = {
            "job-name": self.name,
            "comment": self.comment,
            "gres": self.gres_per_node,
            "nodes": self.nodes,
            "nodelist": self.required_nodes,
            "partition": self.partitions,
            "output": self.standard_output,
            "chdir": self.working_directory,
            "time": self.time_limit,
            "begin": _when(self.begin_time),
            # memory: pyslurm takes MiB as a number or a size with its unit, as sbatch
            "mem-per-gpu": self.memory_per_gpu,
            "cpus-per-gpu": self.cpus_per_gpu,
            "mem": self.memory_per_node,
            "cpus-per-task": self.cpus_per_task,
        }
        argv += [f"--{k}={v}" for k, v in opts.items() if v is not None]
        return int(_run(argv, stdin=self.script).strip().split(";")[0])

    def _update_args(self) -> list[str]:
        # as pyslurm: ``nodes`` is ignored in an update (its _set_nodes returns when is_update)
        updates = {
            "Gres": self.gres_per_node,
            "ReqNodeList": self.required_nodes,
            "StartTime": _when(self.begin_time),
            "TimeLimit": self.time_limit,
            "Comment": self.comment,
            "Priority": self.priority,
        }
        return [f"{k}={v}" for k, v in updates.items() if v is not None]


class Job:
    """The subset of pyslurm's ``Job`` the adapter uses."""

    def __init__(self, job_id: int) -> None:
        self.id = int(job_id)
        self._f: dict[str, str] = {}

    @staticmethod
    def load(job_id: int) -> Job:
        out = _run(["scontrol", "-o", "show", "job", str(int(job_id))])
        line = next(ln for ln in out.splitlines() if ln.startswith("JobId="))
        return Job._from_fields(_fields(line))

    @staticmethod
    def _from_fields(f: dict[str, str]) -> Job:
        job = Job(int(f["JobId"]))
        job._f = f
        return job

    def _id_of(self, key: str) -> int:
        return int(re.search(r"\((\d+)\)", self._f[key]).group(1))  # type: ignore[union-attr]

    name = property(lambda self: self._f.get("JobName"))
    user_id = property(lambda self: self._id_of("UserId"))
    group_id = property(lambda self: self._id_of("GroupId"))
    priority = property(lambda self: int(self._f.get("Priority", "0")))
    state = property(lambda self: self._f.get("JobState"))
    state_reason = property(lambda self: _null(self._f.get("Reason")))
    requeue_count = property(lambda self: int(self._f.get("Restarts", "0")))
    start_time = property(lambda self: _epoch(self._f.get("StartTime")))
    num_nodes = property(lambda self: int(self._f.get("NumNodes", "0").split("-")[0]))
    max_nodes = property(
        lambda self: int(n.split("-")[1]) if "-" in (n := self._f.get("NumNodes", "")) else None
    )
    allocated_nodes = property(lambda self: _null(self._f.get("NodeList")))
    required_nodes = property(lambda self: _null(self._f.get("ReqNodeList")))
    partition = property(lambda self: self._f.get("Partition"))
    working_directory = property(lambda self: _null(self._f.get("WorkDir")))
    standard_output = property(lambda self: _null(self._f.get("StdOut")))
    standard_error = property(lambda self: _null(self._f.get("StdErr")))
    comment = property(lambda self: _null(self._f.get("Comment")))
    time_limit = property(lambda self: _minutes(self._f.get("TimeLimit", "")))
    gres_per_node = property(lambda self: _gres_dict(self._f.get("TresPerNode")))
    array_id = property(lambda self: int(self._f.get("ArrayJobId", "0")) or None)
    het_job_id = property(lambda self: int(self._f.get("HetJobId", "0")) or None)

    def to_dict(self) -> dict[str, Any]:
        keys = [k for k, v in vars(Job).items() if isinstance(v, property)]
        return {"id": self.id, **{k: getattr(self, k) for k in keys}}

    def modify(self, changes: JobSubmitDescription) -> None:
        _run(["scontrol", "update", f"JobId={self.id}", *changes._update_args()])

    def release(self) -> None:
        _run(["scontrol", "release", str(self.id)])

    def hold(self, mode: str | None = None) -> None:
        # pyslurm: mode "user" is a user hold, anything else an administrator's
        _run(["scontrol", "uhold" if mode == "user" else "hold", str(self.id)])

    def requeue(self, hold: bool = False) -> None:
        _run(["scontrol", "requeuehold" if hold else "requeue", str(self.id)])

    def send_signal(self, signal: str | int, steps: str = "children", hurry: bool = False) -> None:
        sig = str(signal).removeprefix("SIG")
        scope = {"batch": ["--batch"], "all": ["--full"]}.get(steps.casefold(), [])
        kill = sig in ("9", "KILL")
        # slurm_kill_job(id, SIGKILL, 0) is what a plain ``scancel id`` sends
        if kill and not scope:
            argv = ["scancel", str(self.id)]
        else:
            argv = ["scancel", *scope, f"--signal={sig}", str(self.id)]
        try:
            _run(argv)
        except RPCError as exc:  # pyslurm ignores these two, as here
            if exc.errno == 2021 or (exc.errno == 2017 and kill):
                return
            raise

    def cancel(self) -> None:
        self.send_signal(9)


class Jobs(dict[int, Job]):
    """As pyslurm's ``Jobs``: a dict job id -> Job."""

    @staticmethod
    def load() -> Jobs:
        out = _run(["scontrol", "-o", "show", "job"])
        jobs = Jobs()
        for line in out.splitlines():
            fields = _fields(line)
            # a record broken by a line break in a user field (the real pyslurm reads the
            # C structures and has no such problem): left out, as the stand-in cannot read it
            if line.startswith("JobId=") and {"UserId", "GroupId"} <= fields.keys():
                job = Job._from_fields(fields)
                jobs[job.id] = job
        return jobs
