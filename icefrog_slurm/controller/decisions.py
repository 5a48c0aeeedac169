"""decision.json for every job a round gives GPUs, written once a round into the job's folder.

A shared job's decision also carries its predicted footprint (:func:`shared_load`): under
CUDA MPS the launcher turns it into the job's limits (icefrog_launcher.launch.mps_env).

The :class:`~icefrog_slurm.controller.reconcile.Reconciler` calls :meth:`DecisionWriter.write`
after each pass. A write that fails (the folder is on a filesystem that is down, say) is
tried again next pass. A folder :class:`~icefrog_slurm.controller.jobdir.UnsafeJobDir`
refuses, or one whose write fails for what its owner made there (:data:`OWNER_MADE_ERRNOS`:
a folder in place of the temporary file, a file in place of a folder, no permission), is not
tried again until the next round: the refusal is logged and recorded in the audit log
(action ``decision``, outcome ``refused``, the reason naming the component), and the other
jobs' decisions are written as usual.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

from icefrog_slurm.controller.jobdir import UnsafeJobDir
from icefrog_slurm.controller.ports import Clock, JobFiles, StorePort
from icefrog_slurm.domain.plan import JobPlan, Plan
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.protocol import MAX_DEVICE_BYTES, Decision, SharedLoad
from icefrog_slurm.settings import SharingSettings

log = logging.getLogger(__name__)

OWNER_MADE_ERRNOS = frozenset(
    {errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ELOOP, errno.EACCES, errno.EPERM,
     errno.ENAMETOOLONG}
)  # fmt: skip
"""Write errors a job folder's owner can cause at will (each try of them costs a walk of the
folder's path): refused for the round, not tried again every pass."""

JobDir = Callable[[str, str], str]
"""(Slurm job id, folder its reports name) -> the job's folder (Reconciler._job_dir)."""


class DecisionWriter:
    """Writes the round's decisions (module docstring); remembers what each job has."""

    def __init__(
        self,
        *,
        files: JobFiles,
        store: StorePort,
        clock: Clock,
        job_dir: JobDir,
        sharing: SharingSettings | None = None,
    ) -> None:
        self.files, self.store, self.clock, self.job_dir = files, store, clock, job_dir
        self.sharing = sharing or SharingSettings()
        self._written: dict[int, int] = {}  # job id -> round whose decision is handled

    def write(self, plan: Plan) -> None:
        """decision.json for every job ``plan`` gives GPUs, once per round."""
        if plan.decided_round is None:
            return
        for job in plan.jobs:
            a = job.allocation
            if a.gpus <= 0 or a.batch < 1 or self._written.get(job.job_id) == plan.decided_round:
                continue
            if self._write_one(job, plan.decided_round):
                self._written[job.job_id] = plan.decided_round

    def _write_one(self, job: JobPlan, round_no: int) -> bool:
        """Write one job's decision; False when it is to be tried again next pass."""
        a = job.allocation
        extra = {"nodes": list(a.nodes), "psi": a.psi, "predicted_tta_s": a.predicted_tta_s}
        decision = Decision(
            round=round_no,
            gpus=a.gpus,
            batch=a.batch,
            frozen=a.frozen,
            shared=a.shared,
            extra={**extra, "share": a.share},
            load=shared_load(a, self.sharing),
        )
        run_dir = ""
        try:
            run_dir = self.job_dir(job.slurm_job_id, job.run_dir)
            self.files.write_decision(run_dir=run_dir, decision=decision, owner_uid=job.owner_uid)
        except UnsafeJobDir as exc:
            self._refused(job, run_dir, str(exc))
            return True
        except OSError as exc:
            if exc.errno in OWNER_MADE_ERRNOS:  # the folder's owner made it so: not this round
                self._refused(job, run_dir, str(exc))
                return True
            self._not_yet(job, exc)
            return False
        except IcefrogError as exc:
            self._not_yet(job, exc)
            return False
        return True

    def _not_yet(self, job: JobPlan, exc: Exception) -> None:
        log.warning(
            "job=%d slurm_job=%s: decision.json not written yet: %s",
            job.job_id, job.slurm_job_id, printable(str(exc), 500),
        )  # fmt: skip

    def _refused(self, job: JobPlan, run_dir: str, reason: str) -> None:
        log.warning(
            "job=%d slurm_job=%s: decision.json not written: %s",
            job.job_id, job.slurm_job_id, printable(reason),
        )  # fmt: skip
        with self.store.transaction() as tx:
            tx.log_action(
                action="decision",
                command=("write", printable(run_dir)),
                outcome="refused",
                now=self.clock.now(),
                duration_s=0.0,
                detail=printable(reason),
                slurm_job_id=job.slurm_job_id,
                job_id=job.job_id,
            )


def shared_load(allocation: Allocation, sharing: SharingSettings) -> SharedLoad | None:
    """A shared job's predicted footprint for its decision (the numbers eq 8's admission
    rule used, and the GRES kind that shares the GPU: under ``mps`` the launcher sets the
    job's MPS limits from it); None for an exclusive job or a round without a prediction."""
    util, memory = allocation.predicted_util, allocation.predicted_mem_bytes
    if not allocation.shared or util is None or memory is None:
        return None
    if not (0 <= util <= 1 and 0 <= memory <= MAX_DEVICE_BYTES):  # NaN fails too
        return None
    return SharedLoad(
        kind=sharing.gres, util=util, peak_mem_bytes=memory, memory_safety=sharing.memory_safety
    )
