"""``SlurmCliBackend``: the ClusterPort over sbatch/scontrol/squeue/sinfo/scancel.

Every command runs with a timeout; when slurmctld is down or slow (connection refused,
socket timeout, the command's own timeout) it is retried with exponential backoff a bounded
number of times, then ``SlurmUnavailable`` is raised: the caller keeps its decision and tries
again next round. A refusal is ``SlurmRejected`` at once. Nothing here exits the process.

Jobs are read from ``squeue --json`` (``parse``): identity (uid, gid, job id, state) comes
from its numeric fields, never from user text. ``sbatch`` is not idempotent, so submissions
are made idempotent by their tag: before every sbatch the backend looks for a live job of
the same owner with the same name and comment (``identity.earlier_submission``) and returns
it instead, so a submission that timed out but did reach slurmctld is never duplicated.

Resubmission as the job's owner (``resubmit``): the controller runs as root. The owner is
taken only when two independent sources agree: Slurm's numeric uid of the job and the uid
icefrog recorded from the job's munge-signed registration. The pending job's batch script
(``scontrol write batch_script``) is submitted again through ``setpriv --reuid --regid
--init-groups --no-new-privs sbatch`` with a minimal environment (PATH, HOME, USER, LOGNAME,
SLURM_CONF): the new job is the user's own submission with the user's uid, gid and login
groups and nothing of root's, so it can do nothing its owner could not do with sbatch. Never
as root for another user's job, and never for a user the system does not know. Name,
partition, working directory, output paths and time limit are kept; the comment names the
old id under the controller's signature (``identity.TagSigner``); the new job is held; the
old job is left for the caller to cancel once it has recorded the new one. The script's
``#SBATCH`` lines apply again (what ``icefrog submit`` kept of the user's sbatch options); a
header with anything else, such as ``--gres`` or ``--nodelist`` beside the controller's own
options, is refused (``sbatch_options.replay_refusal``). ``submit_held`` runs sbatch with
the same minimal environment, so that the first run of a job sees what every later one sees.

Holds: icefrog's own holds are user holds (``scontrol uhold``); a job an administrator holds
(``JobHeldAdmin``) is never released.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from icefrog_slurm.domain.cluster import Gres, PartitionCapacity, SlurmJobState
from icefrog_slurm.slurm import capacity, commands, parse, sbatch_options
from icefrog_slurm.slurm.commands import Argv
from icefrog_slurm.slurm.identity import TagSigner, earlier_submission, successor_of
from icefrog_slurm.slurm.port import (
    ClusterPort,
    GresAllocation,
    JobNotFound,
    SlurmJobDetail,
    SlurmRejected,
    SlurmUnavailable,
    SubmitRequest,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# Messages of Slurm clients that mean "slurmctld did not answer": retry later.
_UNAVAILABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "zero bytes were transmitted",
    "communication connection failure",
    "slurm_receive_msg",
    "transport endpoint",
    "resource temporarily unavailable",
    "slurmctld is not responding",
    "in standby mode",
    "unexpected message received",  # scontrol release/update while slurmctld is down
    # munged down or restarting on this host: the client cannot sign its request
    "munge encode failed",
    "protocol authentication error",
    "socket communication error",
)
_NOT_FOUND = ("invalid job id specified",)
_ALREADY_DONE = ("already completing or completed", "job has already finished")

# What differs between Slurm versions and changes a command the backend runs (the rest is
# read by parse.py; docs/controller.md, "Slurm versions", has the whole table).
VERSION_COMMAND: Argv = ("scontrol", "--version")
TASKS_WITH_RESIZE = frozenset({(24, 11)})
"""Versions where an update of a requeued job's GRES or node count must also set NumTasks
(one task a node, as sbatch gave it): without it 24.11 leaves a job that ran with more GPUs
(DefCpuPerGPU) pending for ever, reason Resources. 22.05 refuses NumTasks beside a NumNodes
change (BadConstraints); 26.05 does not need it."""
# What capacity reads besides sinfo and squeue: nodes' cores and memory, and the per-GPU
# defaults a job gets without asking (capacity.py, "Memory and cores").
SHOW_NODES: Argv = ("scontrol", "-o", "show", "node")
SHOW_CONFIG: Argv = ("scontrol", "show", "config")


def show_partition(partition: str) -> Argv:
    return ("scontrol", "-o", "show", "partition", partition)


REQUEUE_DISABLED = "presently disabled"
"""What ``scontrol requeuehold`` says of a job whose requeue flag is off ("Requested
operation is presently disabled")."""
STARTED_ON_RELEASE = "no longer pending execution"
"""What ``scontrol update StartTime=now`` says of a job that started, or ended, before it:
26.05 may start a job as it is released, so there is nothing left to bring forward."""


@dataclass(frozen=True)
class CliSettings:
    """How the CLI backend talks to Slurm."""

    timeout_s: float = 20.0
    """Wall-clock limit of one Slurm command, seconds."""
    attempts: int = 4
    """Tries of a command while slurmctld is unavailable, the first included (>= 1)."""
    backoff_s: float = 1.0
    """Wait before the second try, seconds; doubles every try."""
    backoff_max_s: float = 15.0
    """Longest wait between two tries, seconds."""
    slurm_conf: str | None = None
    """SLURM_CONF for every command; None: the Slurm default (/etc/slurm/slurm.conf)."""


class SlurmCliBackend:
    """ClusterPort over the Slurm command-line tools (22.05 and 24.11)."""

    def __init__(
        self,
        settings: CliSettings | None = None,
        *,
        signer: TagSigner | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings or CliSettings()
        if self.settings.attempts < 1:
            raise ValueError("CliSettings.attempts must be >= 1")
        self.signer = signer or TagSigner.ephemeral()
        self._sleep = sleep
        self._version: tuple[int, int] | None = None

    # ---- running commands -------------------------------------------------------------

    def _env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        if self.settings.slurm_conf:
            env["SLURM_CONF"] = self.settings.slurm_conf
        return env

    def _once(self, argv: Argv, *, stdin: str | None, env: Mapping[str, str] | None) -> str:
        try:
            cp = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.settings.timeout_s,
                env=dict(env) if env is not None else self._env(),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            msg = f"{argv[0]} timed out after {self.settings.timeout_s:g} s"
            raise SlurmUnavailable(msg, command=argv) from exc
        except OSError as exc:
            raise SlurmUnavailable(f"cannot run {argv[0]}: {exc}", command=argv) from exc
        if cp.returncode == 0:
            return cp.stdout
        msg = (cp.stderr.strip() or cp.stdout.strip() or f"exit code {cp.returncode}")[:2000]
        low = msg.lower()
        if any(p in low for p in _UNAVAILABLE):
            raise SlurmUnavailable(f"{' '.join(argv[:3])}: {msg}", command=argv)
        if any(p in low for p in _NOT_FOUND):
            raise JobNotFound(f"{' '.join(argv)}: {msg}", command=argv)
        raise SlurmRejected(f"{' '.join(argv)}: {msg}", command=argv)

    def _wait(self, attempt: int) -> None:
        s = self.settings
        self._sleep(min(s.backoff_s * 2**attempt, s.backoff_max_s))

    def _run(
        self, argv: Argv, *, stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> str:
        """Run an idempotent command, retrying while slurmctld is unavailable."""
        return self._retrying(argv, lambda: self._once(argv, stdin=stdin, env=env))

    def _retrying(self, argv: Argv, attempt_once: Callable[[], T]) -> T:
        """``attempt_once()`` until it does not raise SlurmUnavailable, at most ``attempts``
        times with a doubling backoff."""
        for attempt in range(self.settings.attempts):
            try:
                return attempt_once()
            except SlurmUnavailable as exc:
                if attempt + 1 == self.settings.attempts:
                    raise SlurmUnavailable(
                        f"{exc} (gave up after {self.settings.attempts} tries)", command=argv
                    ) from exc
                log.warning("slurm unavailable (try %d): %s", attempt + 1, exc)
                self._wait(attempt)
        raise AssertionError("unreachable")

    def _submit(
        self,
        argv: Argv,
        *,
        script: str,
        name: str,
        comment: str,
        owner_uid: int,
        env: Mapping[str, str],
    ) -> str:
        """sbatch at most once a tag: a live job of the owner with the same name and comment
        (an earlier submission that timed out but reached slurmctld) is returned instead,
        also when the last try timed out (one more look after it). When even that look
        fails, the error says a held job of that name may exist."""
        last: SlurmUnavailable | None = None
        tries = self.settings.attempts
        for attempt in range(tries + 1):
            if attempt:
                self._wait(attempt - 1)
            try:
                found = earlier_submission(
                    self._jobs_once().values(), name=name, comment=comment, owner_uid=owner_uid
                )
            except SlurmUnavailable as exc:
                log.warning("squeue unavailable (try %d): %s", attempt + 1, exc)
                last = exc
                continue
            if found is not None:
                return found
            if attempt == tries:  # looked once more: no try took effect
                raise SlurmUnavailable(f"{last} (gave up after {tries} tries)", command=argv)
            try:
                return parse.parse_sbatch_parsable(self._once(argv, stdin=script, env=env))
            except SlurmUnavailable as exc:
                log.warning("sbatch unavailable (try %d): %s", attempt + 1, exc)
                last = exc
        raise SlurmUnavailable(
            f"{last} (gave up after {tries} tries; a held job named {name!r} may have been "
            "made: squeue --me shows it)",
            command=argv,
        )

    def _jobs_once(self) -> dict[str, SlurmJobState]:
        out = self._once(commands.squeue_json(), stdin=None, env=None)
        return {k: d.state_view() for k, d in parse.parse_squeue_json(out).items()}

    def _details(self) -> dict[str, SlurmJobDetail]:
        """Every job, from one ``squeue --json`` (retried also when its output says
        slurmctld did not answer); a job in ``SPECIAL_EXIT`` reads as pending and held."""
        argv = commands.squeue_json()
        details = self._retrying(
            argv, lambda: parse.parse_squeue_json(self._once(argv, stdin=None, env=None))
        )
        return {k: _special_exit_as_held(d) for k, d in details.items()}

    def _jobs(self) -> dict[str, SlurmJobState]:
        return {k: d.state_view() for k, d in self._details().items()}

    # ---- ClusterPort ------------------------------------------------------------------

    def submit_held(self, *, request: SubmitRequest) -> str:
        with open(request.script, encoding="utf-8") as fh:
            script = fh.read()
        # the minimal environment of a resubmission (_as_owner): every run of the job sees
        # what its script sets, not what the submitting shell had
        argv, env = self._as_owner(
            commands.sbatch_held(request), uid=os.geteuid(), gid=os.getegid()
        )
        return self._submit(
            argv,
            script=script,
            name=request.name,
            comment=request.tag.comment(),
            owner_uid=os.getuid(),
            env=env,
        )

    def release(self, *, job_id: str) -> None:
        self._refuse_admin_hold(job_id)
        self._run(commands.release(job_id))

    def _refuse_admin_hold(self, job_id: str) -> None:
        job = self._jobs().get(job_id)
        if job is None:
            raise JobNotFound(f"job {job_id}: unknown to Slurm")
        if job.admin_held:
            raise SlurmRejected(
                f"job {job_id} is held by an administrator (JobHeldAdmin): not released"
            )

    def update_pending(
        self,
        *,
        job_id: str,
        gres: Gres | None = None,
        num_nodes: int | None = None,
        nodes: tuple[str, ...] | None = None,
    ) -> None:
        argv = commands.update_job(job_id, gres=gres, num_nodes=num_nodes, nodes=nodes)
        if (gres, num_nodes) != (None, None) and self.slurm_version() in TASKS_WITH_RESIZE:
            tasks = num_nodes if num_nodes is not None else self.job_detail(job_id=job_id).num_nodes
            argv = (*argv, f"NumTasks={tasks}")
        self._run(argv)

    def slurm_version(self) -> tuple[int, int]:
        """(major, minor) of the Slurm the client commands belong to, asked once."""
        if self._version is None:
            self._version = parse.parse_version(self._run(VERSION_COMMAND))
        return self._version

    def signal_batch(self, *, job_id: str, signal: str = "USR1") -> None:
        self._run(commands.signal_batch(job_id, signal))

    def requeue_hold(self, *, job_id: str) -> None:
        try:
            self._run(commands.requeue_hold(job_id))
        except SlurmRejected as exc:
            if REQUEUE_DISABLED not in str(exc).lower():
                raise
            # its owner made it non-requeueable (``scontrol update Requeue=0`` is allowed
            # on a running job): every managed job is submitted requeueable; made so again
            log.warning("Slurm job %s: not requeueable; set requeueable again", job_id)
            self._run(commands.update_job(job_id, requeue=True))
            self._run(commands.requeue_hold(job_id))

    def hold(self, *, job_id: str) -> None:
        self._run(commands.hold(job_id))

    def release_now(self, *, job_id: str) -> None:
        self.release(job_id=job_id)
        try:
            self._run(commands.update_job(job_id, start_now=True))
        except SlurmRejected as exc:
            if STARTED_ON_RELEASE not in str(exc).lower():
                raise

    def cancel(self, *, job_id: str) -> None:
        try:
            self._run(commands.cancel(job_id))
        except JobNotFound:
            return
        except SlurmRejected as exc:
            if not any(p in str(exc).lower() for p in _ALREADY_DONE):
                raise

    def poll(self, *, job_ids: Collection[str]) -> Mapping[str, SlurmJobState]:
        if not job_ids:
            return {}
        wanted = set(job_ids)
        return {k: v for k, v in self._jobs().items() if k in wanted}

    def job_detail(self, *, job_id: str) -> SlurmJobDetail:
        detail = self._details().get(job_id)
        if detail is None:
            raise JobNotFound(f"job {job_id}: unknown to Slurm")
        return detail

    def gres_allocation(self, *, job_id: str) -> tuple[GresAllocation, ...]:
        detail = self.job_detail(job_id=job_id)
        return parse.gres_allocations(detail.gres_detail, detail.nodelist or "")

    def partition_capacity(
        self, *, partition: str, managed: Mapping[str, int] | None = None
    ) -> PartitionCapacity:
        nodes = capacity.with_resources(
            parse.parse_sinfo_nodes(self._run(commands.sinfo_partition(partition))),
            self._run(SHOW_NODES),
        )
        need = capacity.site_need(self._run(SHOW_CONFIG), self._run(show_partition(partition)))
        details = self._details()
        jobs = [d.state_view() for d in details.values()]
        asked = {  # a shard job's asks are per node or per task: the need stands in
            jid: (d.mem_per_gpu_mb, d.cpus_per_gpu)
            for jid, d in details.items()
            if d.gres is not None and d.gres.kind == "gpu"
        }
        return capacity.partition_capacity(
            partition=partition,
            nodes=nodes,
            jobs=jobs,
            managed=managed,
            need=need,
            asked=asked,
        )

    def hostnames(self, *, nodelist: str) -> tuple[str, ...]:
        return parse.parse_hostnames(self._run(commands.hostnames(nodelist)))

    def find_successor(self, *, job_id: str, owner_uid: int) -> str | None:
        return successor_of(
            self._jobs().values(), job_id=job_id, owner_uid=owner_uid, signer=self.signer
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
        old = self.job_detail(job_id=job_id)
        if old.state != "PENDING":
            raise SlurmRejected(
                f"job {job_id} is {old.state}: only a pending (requeue-held) job is resubmitted"
            )
        if old.tag is None:
            raise SlurmRejected(f"job {job_id} carries no icefrog comment: not resubmitted")
        if old.user_id != owner_uid:
            raise SlurmRejected(
                f"job {job_id}: Slurm says uid {old.user_id} owns it, icefrog recorded uid "
                f"{owner_uid}: not resubmitted"
            )
        if old.state_view().admin_held:
            raise SlurmRejected(f"job {job_id} is held by an administrator: not resubmitted")
        script = self._run(commands.batch_script(job_id))
        refusal = sbatch_options.replay_refusal(script)
        if refusal is not None:  # the header may not ask for what the controller decides
            raise SlurmRejected(f"job {job_id}: {refusal}: not resubmitted")
        tag = self.signer.successor_tag(key=old.tag.key, previous_id=job_id, owner_uid=owner_uid)
        argv = commands.resubmit(
            old.name,
            comment=tag.comment(),
            gres=gres,
            num_nodes=num_nodes if num_nodes is not None else old.num_nodes,
            nodes=nodes if nodes is not None else parse.expand_hostlist(old.req_nodes or ""),
            partition=old.partition,
            work_dir=old.work_dir,
            std_out=_job_pattern(old.std_out, job_id),
            std_err=_job_pattern(old.std_err, job_id),
            time_limit_min=old.time_limit_min,
            mem_per_gpu_mb=old.mem_per_gpu_mb,
            cpus_per_gpu=old.cpus_per_gpu,
        )
        argv, env = self._as_owner(argv, uid=owner_uid, gid=old.group_id)
        new_id = self._submit(
            argv, script=script, name=old.name, comment=tag.comment(), owner_uid=owner_uid, env=env
        )
        log.info(
            "slurm_job=%s: resubmitted as slurm_job=%s (uid %d, %s)",
            job_id,
            new_id,
            owner_uid,
            gres,
        )
        return new_id

    def _as_owner(self, argv: Argv, *, uid: int, gid: int) -> tuple[Argv, dict[str, str]]:
        """Wrap ``argv`` to run as ``uid`` (unless that is us) with a minimal environment; a
        uid the user database does not know is refused (its groups cannot be known)."""
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            raise SlurmRejected(f"uid {uid} is not in the user database: not resubmitted") from None
        base = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": pw.pw_dir,
            "USER": pw.pw_name,
            "LOGNAME": pw.pw_name,
        }
        if "SLURM_CONF" in os.environ:  # the controller's own config source, passed through
            base["SLURM_CONF"] = os.environ["SLURM_CONF"]
        env = self._env(base)
        # the very client the controller runs (found on its own PATH, which may put another
        # Slurm version's commands first: cluster.sh env), by full path: not the minimal PATH's
        argv = (shutil.which(argv[0]) or argv[0], *argv[1:])
        if uid == os.geteuid():
            return argv, env
        return commands.as_user(argv, uid=uid, gid=gid), env


def _special_exit_as_held(detail: SlurmJobDetail) -> SlurmJobDetail:
    """``SPECIAL_EXIT`` (Slurm requeued the job held on its own: a site's
    ``RequeueExitHold``, or ``scontrol requeuehold State=SpecialExit``) is a pending job with
    a user hold to icefrog (squeue's reason: JobHeldUser); ``scontrol release`` lifts it."""
    if detail.state != "SPECIAL_EXIT":
        return detail
    reason = detail.reason if "held" in detail.reason.lower() else "JobHeldUser"
    return replace(detail, state="PENDING", reason=reason)


def _job_pattern(path: str | None, job_id: str) -> str | None:
    """scontrol prints output paths expanded (``/o/16.out``); give the new job its own file
    by turning the old id in the file name back into ``%j`` (``/o/%j.out``)."""
    if path is None:
        return None
    head, sep, name = path.rpartition("/")
    return head + sep + re.sub(rf"(?<!\d){job_id}(?!\d)", "%j", name)


def _conforms(backend: SlurmCliBackend) -> ClusterPort:
    """mypy proves here that SlurmCliBackend implements the whole port."""
    return backend
