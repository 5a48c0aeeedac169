"""An out-of-memory while sharing a GPU is a sharing failure, not a failed job.

Under CUDA MPS each job sharing a GPU may allocate at most its pinned memory limit
(``memory_safety x`` its predicted peak: icefrog_launcher.launch.mps_env); a job whose
prediction was too low fails alone, with ``torch.cuda.OutOfMemoryError`` (or a
``RuntimeError`` saying "CUDA out of memory" / "CUDA error: out of memory" from a library
that allocates outside torch's allocator). Under shards there is no limit and the same
error means the pair did not fit. Either way the job itself is sound: it should train on
a GPU of its own.

:class:`SharingGuard` (installed by the trainer as a ``sys.excepthook``, so it sees the
error wherever the user's loop raises it: forward, backward, optimizer step) turns such an
uncaught error, in a job whose decision shares its GPU, into:

1. the file ``<workdir>/sharing_failed`` (:data:`SHARING_FAILED`): from now on, this run
   and every restart of it registers with ``accepts_shared: false``
   (:func:`without_sharing`), so the controller never offers it a shared GPU again;
2. that ``register`` report, at once (the inbox takes a job's register only from the
   job's owner, about that job: a job can only give up sharing for itself);
3. the checkpoint marker (icefrog_slurm.runfiles), so the launcher exits 75 ("requeue
   me") and the controller requeues the job instead of recording it failed. The job
   resumes from its last checkpoint (the end of its last epoch): the state at the error is
   not saved (a step may be half done).

The controller then keeps the job waiting until a round gives it whole GPUs
(icefrog_slurm.controller.tick.shared_without_consent). Only rank 0 writes and reports; a
shared job has one process. Any other error, or an out-of-memory on a GPU of its own, is
left to fail the job as before.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import torch

from icefrog_slurm.protocol import JobSpec
from icefrog_slurm.runfiles import CHECKPOINT_MARKER
from icefrog_slurm.security import write_atomic

SHARING_FAILED = "sharing_failed"
"""In the job's folder: the job ran out of memory while sharing a GPU (never shared again)."""

_OOM_TEXTS = ("cuda out of memory", "cuda error: out of memory")
_current: SharingGuard | None = None  # the guard the process's excepthook asks


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is CUDA running out of device memory."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXTS)


def sharing_failed_before(workdir: str) -> bool:
    return (Path(workdir) / SHARING_FAILED).exists()


def without_sharing(spec: JobSpec, workdir: str) -> JobSpec:
    """The spec a job registers with: ``accepts_shared`` off once its sharing failed."""
    if spec.accepts_shared and sharing_failed_before(workdir):
        return dataclasses.replace(spec, accepts_shared=False)
    return spec


class SharingGuard:
    """Turns an uncaught out-of-memory in a shared job into a sharing failure (module doc).

    ``shared()``: whether the job runs shared now (the decision it applied); ``register()``:
    sends the job's register report (which reads :func:`without_sharing`)."""

    def __init__(
        self,
        workdir: str,
        *,
        rank: int,
        shared: Callable[[], bool],
        register: Callable[[], None],
    ) -> None:
        self.workdir, self.rank = Path(workdir), rank
        self.shared, self.register = shared, register

    def install(self) -> None:
        """Make this the process's guard: one ``sys.excepthook`` in front of the one before
        (which still prints the error); a later Trainer's guard replaces this one."""
        global _current
        if _current is None:
            previous = sys.excepthook

            def hook(
                kind: type[BaseException], exc: BaseException, tb: TracebackType | None
            ) -> None:
                try:
                    if _current is not None:
                        _current.handle(exc)
                finally:
                    previous(kind, exc, tb)

            sys.excepthook = hook
        _current = self

    def handle(self, exc: BaseException) -> bool:
        """Record ``exc`` as a sharing failure when it is one; whether it was."""
        if not (is_out_of_memory(exc) and self.shared()):
            return False
        if self.rank == 0:
            why = f"out of memory while sharing a GPU: {str(exc)[:200]}"
            write_atomic(self.workdir / SHARING_FAILED, why.encode())
            try:  # the report is sent again at the restart: the requeue must not wait on it
                self.register()
            except Exception as report_error:
                print(f"icefrog trainer: register not sent: {report_error}", file=sys.stderr)
            write_atomic(self.workdir / CHECKPOINT_MARKER, why.encode())
            print(
                "icefrog trainer: ran out of memory while sharing its GPU: a sharing failure, "
                "not a failed job; it asks to be requeued and resumes from its last checkpoint "
                "on a GPU of its own (it is never shared again)",
                file=sys.stderr,
            )
        return True
