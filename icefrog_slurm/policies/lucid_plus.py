"""``LucidPlusPolicy``: Lucid (Hu et al., ASPLOS 2023) with FreezeOut; non-elastic.

Lucid's rules as used here:
- a job runs on exactly the GPUs it asked for (non-elastic): the GPU count of the Slurm job
  it was submitted with (a job that shares a GPU asked for one);
- non-preemptive: a running job keeps its GPUs until it ends;
- waiting jobs are served shortest estimated duration first (Lucid's workload estimate;
  here the estimator's T_acc at the requested count, eq 16), without backfilling past a
  job that does not fit (a blocked head waits; smaller jobs behind it may still start when
  they fit, as Lucid's backfill does);
- affine-pair packing: a waiting one-GPU job that finds no free GPU may share a GPU with a
  running or waiting one-GPU job when their predicted utilisations sum to at most 1 and
  their memory fits (Lucid's packing analyser classifies jobs by GPU utilisation and
  memory; ICEFROG's predictor, eq 8, stands in for it); at most two jobs a GPU.
The "+" is FreezeOut tuned per job (module ``baseline``). See docs/evaluation.md.
"""

from __future__ import annotations

import time

from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import JobSnapshot, Snapshot
from icefrog_slurm.policies.baseline import (
    Free,
    JobOptions,
    allocation,
    job_options,
    pair_fits,
    result,
)
from icefrog_slurm.policies.estimate import Estimator, requested_count
from icefrog_slurm.settings import Settings


def requested_gpus(job: JobSnapshot) -> int:
    """The GPUs the job's Slurm job asks for (1 for a shard job); 0 when unknown."""
    state = job.slurm
    return 0 if state is None or state.gres is None else requested_count(job)


class LucidPlusPolicy:
    """Lucid+ (module docstring)."""

    name = "lucid+"

    def __init__(self) -> None:
        self.estimator = Estimator(freezing="freezeout", batch_scaling=False)

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        started = time.perf_counter()
        opts, _ = job_options(snapshot, self.estimator, settings)
        free = Free(snapshot)
        out: dict[int, Allocation] = {}
        solo: list[tuple[JobOptions, Allocation]] = []  # one-GPU jobs that could take a partner
        running = [o for o in opts if o.job.current.gpus > 0]
        shared_on: dict[str, int] = {}
        for o in running:
            kept = self._keep(o, free)
            if kept is not None:
                out[o.job.id] = kept
                if kept.shared:
                    shared_on[kept.nodes[0]] = shared_on.get(kept.nodes[0], 0) + 1
                if kept.gpus == 1 and o.shared is not None:
                    solo.append((o, kept))
        for node, jobs in shared_on.items():  # shared GPUs: max_jobs_per_gpu jobs a GPU
            per_gpu = max(settings.sharing.max_jobs_per_gpu, 1)
            free.free[node] = max(free.free.get(node, 0) - -(-jobs // per_gpu), 0)
        waiting = [o for o in opts if o.job.id not in out]
        waiting.sort(key=lambda o: (self._duration(o), o.job.id))
        for o in waiting:
            want = requested_gpus(o.job)
            cand = o.exclusive.get(want)
            nodes = free.place(want) if cand is not None else None
            if cand is not None and nodes is not None:
                out[o.job.id] = allocation(o.job, cand, nodes)
                if want == 1 and o.shared is not None:
                    solo.append((o, out[o.job.id]))
                continue
            if want == 1 and o.shared is not None:
                self._pack(o, solo, out, settings)
        return result(snapshot, out, started=started)

    def _keep(self, o: JobOptions, free: Free) -> Allocation | None:
        cur = o.job.current
        if cur.shared and o.shared is not None and cur.nodes:
            return allocation(o.job, o.shared, cur.nodes[:1])  # GPU reserved in decide
        cand = o.exclusive.get(cur.gpus)
        nodes = free.keep(o.job, cur.gpus) if cand is not None else None
        return None if cand is None or nodes is None else allocation(o.job, cand, nodes)

    def _duration(self, o: JobOptions) -> float:
        cand = o.exclusive.get(requested_gpus(o.job))
        return cand.tta_s if cand is not None else float("inf")

    def _pack(
        self,
        o: JobOptions,
        solo: list[tuple[JobOptions, Allocation]],
        out: dict[int, Allocation],
        settings: Settings,
    ) -> None:
        assert o.shared is not None
        for i, (p, alloc) in enumerate(solo):
            assert p.shared is not None
            if pair_fits(o.shared, p.shared, settings):
                out[p.job.id] = allocation(p.job, p.shared, alloc.nodes[:1])
                out[o.job.id] = allocation(o.job, o.shared, alloc.nodes[:1])
                del solo[i]
                return
