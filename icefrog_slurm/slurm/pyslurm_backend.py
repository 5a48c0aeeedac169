"""``SlurmPyslurmBackend``: the ClusterPort over pyslurm 25.11 (optional; needs Slurm 25.11).

pyslurm is imported lazily, only when the backend is built; where it is absent
``MissingExtra`` names the problem. Operations done through pyslurm's API:
submission (``JobSubmitDescription(priority=0, is_requeueable=True).submit()``), release
(``Job.release``), GRES and node-list updates of a pending job (``Job.modify``; a
``begin_time`` of now for ``release_now``), signalling only the batch shell
(``Job.send_signal(steps="batch")``), requeue-hold (``Job.requeue(hold=True)``), cancel
(``Job.cancel``), polls and job records (``Jobs.load`` / ``Job.load``) and
``find_successor``.

Reused from ``SlurmCliBackend`` by composition, and why:

- ``resubmit``: it must submit *as the job's owner* with the owner's credential; pyslurm
  submits as the calling process only, so the CLI's ``setpriv ... sbatch`` is kept;
- ``gres_allocation`` and ``partition_capacity``: the GPU *indices* a job holds per node
  (``gpu:2(IDX:0-1)``) come from ``squeue --json``'s ``gres_detail``; pyslurm 25.11's
  ``Job.get_resource_layout_per_node`` is marked "subject to change", so the tested
  parsers of the CLI output are reused;
- ``hostnames``: ``scontrol show hostnames``; pyslurm offers no stable public expander;
- ``update_pending`` with a new node count: pyslurm's ``JobSubmitDescription`` ignores
  ``nodes`` in an update (its ``_set_nodes`` returns at once when ``is_update``), so a
  change of the node count goes, with the other fields, through ``scontrol update``.

Errors: ``pyslurm.RPCError`` is mapped by its ``errno`` (and message as a fallback):
communication errors -> ``SlurmUnavailable`` (retried with the CLI settings' bounded
backoff), invalid job id -> ``JobNotFound``, anything else -> ``SlurmRejected``.
Submission is idempotent per tag as in the CLI backend (a live job with the same name and
comment is returned instead of submitting again).
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from types import ModuleType
from typing import Any, TypeVar

from icefrog_slurm.domain.cluster import FINISHED_STATES, Gres, PartitionCapacity, SlurmJobState
from icefrog_slurm.errors import InputError
from icefrog_slurm.extras import MissingExtra, require
from icefrog_slurm.slurm import commands, parse
from icefrog_slurm.slurm.cli_backend import STARTED_ON_RELEASE, CliSettings, SlurmCliBackend
from icefrog_slurm.slurm.identity import TagSigner, earlier_submission, successor_of
from icefrog_slurm.slurm.port import (
    ClusterPort,
    GresAllocation,
    JobNotFound,
    SlurmError,
    SlurmJobDetail,
    SlurmRejected,
    SlurmUnavailable,
    SubmitRequest,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# Slurm errno values (slurm_errno.h) meaning "slurmctld did not answer".
_UNAVAILABLE_ERRNO = frozenset({1001, 1002, 1003, 1004, 1800, 1801, 1802, 1803, 1804, 5004})
_INVALID_JOB_ID = 2017  # ESLURM_INVALID_JOB_ID
_ALREADY_DONE = 2021  # ESLURM_ALREADY_DONE
_UNAVAILABLE_TEXT = ("unable to contact slurm controller", "socket timed out", "connection")


PyslurmMissing = MissingExtra
"""pyslurm cannot be imported (it builds only against Slurm 25.11): exit code 2."""


PYSLURM_SERIES = "25.11"
"""The pyslurm release series (= the Slurm release it is built against) whose API this
adapter is written for; pyslurm's API changes between series."""


def load_pyslurm() -> ModuleType:
    """Import pyslurm, or raise ``MissingExtra`` saying why and what to use instead; a
    pyslurm of another series than :data:`PYSLURM_SERIES` is refused (InputError, exit 2)."""
    require(
        "pyslurm",
        "pyslurm",
        "slurm.backend = 'pyslurm'",
        hint=f"it builds only against Slurm {PYSLURM_SERIES}; elsewhere use slurm.backend = 'cli'",
    )
    module = importlib.import_module("pyslurm")
    version = str(getattr(module, "__version__", "unknown"))
    if version.split(".")[:2] != PYSLURM_SERIES.split("."):
        raise InputError(
            f"slurm.backend = 'pyslurm': pyslurm {version[:40]} is installed, but this adapter "
            f"is written for pyslurm {PYSLURM_SERIES} (built against Slurm {PYSLURM_SERIES}); "
            "install that one, or use slurm.backend = 'cli'"
        )
    return module


def _gres(per_node: Mapping[str, Any] | None) -> Gres | None:
    """pyslurm's ``gres_per_node`` (``{"gpu": 2}``) -> ``Gres("gpu", 2)``."""
    for kind in ("gpu", "shard", "mps"):
        count = (per_node or {}).get(kind)
        if count:
            return Gres(kind, int(count))
    return None


class SlurmPyslurmBackend:
    """ClusterPort over pyslurm (Slurm 25.11); see the module docstring for what it reuses."""

    def __init__(
        self,
        settings: CliSettings | None = None,
        *,
        signer: TagSigner | None = None,
        sleep: Callable[[float], None] = time.sleep,
        module: ModuleType | None = None,
    ) -> None:
        self._py = module if module is not None else load_pyslurm()
        self._cli = SlurmCliBackend(settings, signer=signer, sleep=sleep)
        self.settings = self._cli.settings
        self._sleep = sleep

    # ---- errors and retries -----------------------------------------------------------

    def _error(self, exc: Exception, what: str) -> SlurmError:
        errno = getattr(exc, "errno", None)
        msg = f"pyslurm {what}: {exc}"
        if errno in _UNAVAILABLE_ERRNO or any(t in str(exc).lower() for t in _UNAVAILABLE_TEXT):
            return SlurmUnavailable(msg)
        if errno == _INVALID_JOB_ID or "invalid job id" in str(exc).lower():
            return JobNotFound(msg)
        return SlurmRejected(msg)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one pyslurm call, retrying (bounded, backoff) while slurmctld is unavailable."""
        s = self.settings
        for attempt in range(s.attempts):
            try:
                return fn()
            except self._py.RPCError as exc:
                err = self._error(exc, what)
                if not isinstance(err, SlurmUnavailable):
                    raise err from exc
                if attempt + 1 == s.attempts:
                    raise SlurmUnavailable(f"{err} (gave up after {s.attempts} tries)") from exc
                log.warning("slurm unavailable (try %d): %s", attempt + 1, err)
                self._sleep(min(s.backoff_s * 2**attempt, s.backoff_max_s))
        raise AssertionError("unreachable")

    def _job(self, job_id: str) -> Any:
        return self._py.Job(int(job_id))

    def _modify(self, job_id: str, what: str, **changes: object) -> None:
        desc = self._py.JobSubmitDescription(**changes)
        self._call(what, lambda: self._job(job_id).modify(desc))

    # ---- conversions ------------------------------------------------------------------

    @staticmethod
    def _state(job: Any) -> SlurmJobState:
        return SlurmPyslurmBackend._detail(job).state_view()

    @staticmethod
    def _detail(job: Any) -> SlurmJobDetail:
        comment = job.comment or ""
        return SlurmJobDetail(
            job_id=str(job.id),
            name=job.name or "",
            user_id=int(job.user_id),
            group_id=int(job.group_id),
            state=str(job.state),
            reason=job.state_reason or "",
            restarts=int(job.requeue_count or 0),
            gres=_gres(job.gres_per_node),
            num_nodes=int(job.num_nodes or 1),
            req_nodes=job.required_nodes or None,
            nodelist=job.allocated_nodes or None,
            partition=job.partition or "",
            work_dir=job.working_directory or "",
            std_out=job.standard_output or None,
            std_err=job.standard_error or None,
            time_limit_min=job.time_limit,
            comment=comment,
            tag=parse.parse_tag(comment),
            priority=int(job.priority or 0),
            compound=bool(getattr(job, "array_id", None) or getattr(job, "het_job_id", None)),
            start_time=float(job.start_time or 0) or None,
        )

    def _live(self) -> list[Any]:
        jobs = self._call("Jobs.load", lambda: self._py.Jobs.load())
        return [j for j in jobs.values() if str(j.state) not in FINISHED_STATES]

    # ---- ClusterPort ------------------------------------------------------------------

    def submit_held(self, *, request: SubmitRequest) -> str:
        comment = request.tag.comment()
        with open(request.script, encoding="utf-8") as fh:
            script = fh.read()
        n = request.num_nodes
        desc = self._py.JobSubmitDescription(
            name=request.name,
            script=script,
            comment=comment,
            priority=0,  # held, as sbatch --hold
            is_requeueable=True,
            gres_per_node=str(request.gres),
            nodes=f"{n}-{n}",
            required_nodes=",".join(request.nodes) or None,
            partitions=request.partition,
            standard_output=request.output,
            working_directory=request.workdir,
            time_limit=request.time_limit,
            **host_share(request),
        )

        def once() -> str:
            jobs = (self._state(j) for j in self._live())
            found = earlier_submission(
                jobs, name=request.name, comment=comment, owner_uid=os.getuid()
            )
            if found is not None:  # an earlier try reached slurmctld: never submit twice
                return found
            return str(desc.submit())

        return self._call("submit", once)

    def release(self, *, job_id: str) -> None:
        job = self.job_detail(job_id=job_id)
        if job.state_view().admin_held:
            raise SlurmRejected(
                f"job {job_id} is held by an administrator (JobHeldAdmin): not released"
            )
        self._call("release", lambda: self._job(job_id).release())

    def update_pending(
        self,
        *,
        job_id: str,
        gres: Gres | None = None,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> None:
        if num_nodes is not None:  # pyslurm's modify ignores a node count: see the docstring
            self._cli.update_pending(job_id=job_id, gres=gres, num_nodes=num_nodes, nodes=nodes)
            return
        changes: dict[str, object] = {}
        if gres is not None:
            changes["gres_per_node"] = str(gres)
        if nodes is not None:
            changes["required_nodes"] = ",".join(nodes)
        if not changes:
            raise ValueError("update_pending needs at least one field to change")
        self._modify(job_id, "modify", **changes)

    def signal_batch(self, *, job_id: str, signal: str = "USR1") -> None:
        sig = signal if signal.upper().startswith("SIG") else f"SIG{signal.upper()}"
        self._call("send_signal", lambda: self._job(job_id).send_signal(sig, steps="batch"))

    def requeue_hold(self, *, job_id: str) -> None:
        self._call("requeue", lambda: self._job(job_id).requeue(hold=True))

    def hold(self, *, job_id: str) -> None:
        self._call("hold", lambda: self._job(job_id).hold(mode="user"))

    def release_now(self, *, job_id: str) -> None:
        self.release(job_id=job_id)
        try:
            self._modify(job_id, "modify begin_time", begin_time=int(time.time()))
        except SlurmRejected as exc:  # started as it was released (26.05): as the CLI's
            if STARTED_ON_RELEASE not in str(exc).lower():
                raise

    def cancel(self, *, job_id: str) -> None:
        try:
            self._call("cancel", lambda: self._job(job_id).cancel())
        except JobNotFound:
            return
        except SlurmRejected as exc:
            cause = exc.__cause__
            if getattr(cause, "errno", None) != _ALREADY_DONE and "already" not in str(exc):
                raise

    def poll(self, *, job_ids: Collection[str]) -> Mapping[str, SlurmJobState]:
        if not job_ids:
            return {}
        jobs = self._call("Jobs.load", lambda: self._py.Jobs.load())
        return {str(j.id): self._state(j) for j in jobs.values() if str(j.id) in job_ids}

    def job_detail(self, *, job_id: str) -> SlurmJobDetail:
        return self._detail(self._call("Job.load", lambda: self._py.Job.load(int(job_id))))

    def gres_allocation(self, *, job_id: str) -> tuple[GresAllocation, ...]:
        return self._cli.gres_allocation(job_id=job_id)

    def partition_capacity(
        self, *, partition: str, managed: Mapping[str, int] | None = None
    ) -> PartitionCapacity:
        return self._cli.partition_capacity(partition=partition, managed=managed)

    def hostnames(self, *, nodelist: str) -> tuple[str, ...]:
        return self._cli.hostnames(nodelist=nodelist)

    def find_successor(self, *, job_id: str, owner_uid: int) -> str | None:
        jobs = (self._state(j) for j in self._live())
        return successor_of(jobs, job_id=job_id, owner_uid=owner_uid, signer=self._cli.signer)

    def resubmit(
        self,
        *,
        job_id: str,
        owner_uid: int,
        gres: Gres,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> str:
        return self._cli.resubmit(
            job_id=job_id, owner_uid=owner_uid, gres=gres, num_nodes=num_nodes, nodes=nodes
        )


def _conforms(backend: SlurmPyslurmBackend) -> ClusterPort:
    """mypy proves here that SlurmPyslurmBackend implements the whole port."""
    return backend


PYSLURM_FIELDS = {
    "--mem-per-gpu": "memory_per_gpu",
    "--cpus-per-gpu": "cpus_per_gpu",
    "--mem": "memory_per_node",
    "--cpus-per-task": "cpus_per_task",
}
"""sbatch's host-share options and the ``JobSubmitDescription`` field of each."""


def host_share(request: SubmitRequest) -> dict[str, str | int]:
    """The memory and cores the job asks for besides its GPUs, as ``JobSubmitDescription``
    fields: exactly what ``commands.host_share`` gives sbatch (per GPU for whole GPUs, one
    GPU's worth per node for a shard job; nothing: slurm.conf's defaults). Memory keeps its
    unit (``"900M"``), cores are a count."""
    fields: dict[str, str | int] = {}
    for option in commands.host_share(request.gres, request.mem_per_gpu_mb, request.cpus_per_gpu):
        name, value = option.split("=", 1)
        field = PYSLURM_FIELDS[name]
        fields[field] = value if field.startswith("memory") else int(value)
    return fields
