"""``PlainSlurmPolicy``: what a Slurm site's own scheduler does, as the baseline a site
would compare with (``icefrog simulate --policy slurm``).

- **FIFO**: jobs in submission order (Slurm's priority with only the age factor); a running
  job keeps its GPUs until it ends (no preemption);
- **the GPUs each job requested** (its Slurm job's ``--gres`` x ``--nodes``), the requested
  batch (the per-GPU batch of its declared global batch, else its smallest), nothing frozen,
  no shared GPU, no elasticity;
- **EASY backfill**: the first waiting job that does not fit gets a reservation at the
  earliest time its GPUs come free (the running jobs released in the order of their expected
  ends); a later job may start now only when it fits now and starting it does not move that
  reservation later (it ends before the reservation, or it leaves the GPUs the first job
  needs). A job's expected end is its start plus its time limit (``time_limits`` by job
  name, seconds); a job without one runs until it ends (Slurm's ``INFINITE``), so it is
  backfilled only where it never touches the first job's GPUs. A job past its limit is
  expected to end now (Slurm would end it);
- placement as the other policies place (``baseline.Free``): a request of at most a node
  best-fit on one node, a larger one on whole free nodes.

Waiting jobs say why as Slurm does: the first one ``Resources``, the ones behind it
``Priority``. The policy decides once a round (``controller.round_period_s``), where Slurm's
scheduler also runs when a job ends. docs/simulator.md says where the time limits come from.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import JobSnapshot, Snapshot
from icefrog_slurm.policies.baseline import Free, wait
from icefrog_slurm.policies.estimate import requested_count
from icefrog_slurm.settings import Settings

WHY_HEAD = "Resources"
WHY_BEHIND = "Priority"


@dataclass(frozen=True)
class Release:
    """GPUs a running (or just started) job gives back at its expected end."""

    end: float
    nodes: tuple[str, ...]
    each: int  # GPUs on each of its nodes


class PlainSlurmPolicy:
    """FIFO with EASY backfill on the requested GPUs (module docstring)."""

    name = "slurm"

    def __init__(self, time_limits: Mapping[str, float] | None = None) -> None:
        self.time_limits = dict(time_limits or {})

    def limit(self, job: JobSnapshot) -> float:
        """The job's time limit in seconds (``inf``: none)."""
        return self.time_limits.get(job.job.name, math.inf)

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        started = time.perf_counter()
        now = snapshot.time
        free = Free(snapshot)
        out: dict[int, Allocation] = {}
        reasons: dict[int, str] = {}
        running: list[Release] = []
        order = sorted(snapshot.jobs, key=lambda j: (j.job.submit_time, j.id))
        for job in order:  # running jobs keep what they hold
            cur = job.current
            nodes = None if cur.shared or cur.gpus <= 0 else free.keep(job, cur.gpus)
            if nodes is not None:
                out[job.id] = _alloc(job, cur.gpus, nodes)
                begun = job.job.start_time if job.job.start_time is not None else now
                end = max(begun + self.limit(job), now)
                running.append(Release(end, nodes, cur.gpus // len(nodes)))
        head: int | None = None  # GPUs the first blocked job wants
        shadow = math.inf  # when it is expected to start
        for job in order:
            if job.id in out:
                continue
            want = requested_count(job)
            if head is None:
                nodes = free.place(want)
                if nodes is None:
                    head, shadow = want, start_time(free, running, want, now)
                    reasons[job.id] = WHY_HEAD
                    continue
            else:
                trial = _copy(free)
                nodes = trial.place(want)
                if nodes is None:
                    reasons[job.id] = WHY_BEHIND
                    continue
                after = [*running, Release(now + self.limit(job), nodes, want // len(nodes))]
                if start_time(trial, after, head, now) > shadow:
                    reasons[job.id] = WHY_BEHIND
                    continue
                free = trial
            out[job.id] = _alloc(job, want, nodes)
            running.append(Release(now + self.limit(job), nodes, want // len(nodes)))
        for job in order:
            if job.id not in out:
                out[job.id] = wait(job)
        return PolicyResult(allocations=out, reasons=reasons, solve_s=time.perf_counter() - started)


def start_time(free: Free, running: Sequence[Release], gpus: int, now: float) -> float:
    """When a request of ``gpus`` first fits: now when it fits the free GPUs, else the
    expected end of the running job whose release makes it fit (``inf``: never)."""
    f = _copy(free)
    if _copy(f).place(gpus) is not None:
        return now
    for r in sorted(running, key=lambda r: r.end):
        for n in r.nodes:
            f.free[n] = f.free.get(n, 0) + r.each
        if _copy(f).place(gpus) is not None:
            return max(r.end, now)
    return math.inf


def _copy(free: Free) -> Free:
    twin = copy.copy(free)
    twin.free = dict(free.free)
    return twin


def _alloc(job: JobSnapshot, gpus: int, nodes: tuple[str, ...]) -> Allocation:
    """The requested GPUs at the requested batch, nothing frozen, not shared."""
    return Allocation(
        job_id=job.id, gpus=gpus, batch=job.job.spec.batch_candidates(gpus)[0], frozen=0,
        nodes=nodes,
    )  # fmt: skip
