"""``OptimusPlusPolicy``: Optimus (Peng et al., EuroSys 2018) with FreezeOut and ICEFROG's
sharing prediction (spec section 12).

Optimus gives every job one worker, then hands out the remaining GPUs one at a time to the
job whose estimated remaining time falls most per added GPU (its marginal-gain greedy on
fitted speed curves). Here the remaining time of a job at ``a`` GPUs is the estimator's
``T_acc(a)`` (eq 16: remaining work over the tuned E(a)); the "+" is FreezeOut tuned per job
(module ``baseline``). Sharing first: while more jobs wait than GPUs are free, pairs of
one-GPU jobs whose predicted loads fit one GPU (eq 8) are packed, in submission order;
the rest is allocated elastically. Differences from Optimus are in docs/evaluation.md.
"""

from __future__ import annotations

import time

from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.policies.baseline import (
    Free,
    JobOptions,
    allocation,
    elastic,
    job_options,
    pair_fits,
    place_counts,
    result,
)
from icefrog_slurm.policies.estimate import Estimator
from icefrog_slurm.settings import Settings


class OptimusPlusPolicy:
    """Optimus+ (module docstring)."""

    name = "optimus+"

    def __init__(self) -> None:
        self.estimator = Estimator(freezing="freezeout", batch_scaling=False)

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        started = time.perf_counter()
        opts, _ = job_options(snapshot, self.estimator, settings)
        free = Free(snapshot)
        allocations = pack_pairs(opts, free, settings)
        rest = [o for o in opts if o.job.id not in allocations and o.exclusive]
        counts = elastic(
            rest,
            free,
            value=lambda o, g: -o.exclusive[g].tta_s,
            order=lambda o: (o.job.job.submit_time, o.job.id),
        )
        allocations.update(place_counts(rest, counts, free))
        return result(snapshot, allocations, started=started)


def pack_pairs(opts: list[JobOptions], free: Free, settings: Settings) -> dict[int, Allocation]:
    """Pairs of shareable one-GPU jobs on one GPU while jobs outnumber free GPUs."""
    out: dict[int, Allocation] = {}
    shareable = sorted(
        (o for o in opts if o.shared is not None),
        key=lambda o: (o.job.job.submit_time, o.job.id),
    )
    excess = len(opts) - free.total
    used: set[int] = set()
    for i, a in enumerate(shareable):
        if excess <= 0:
            break
        if a.job.id in used:
            continue
        for b in shareable[i + 1 :]:
            assert a.shared is not None and b.shared is not None
            if b.job.id in used or not pair_fits(a.shared, b.shared, settings):
                continue
            nodes = free.place(1)
            if nodes is None:
                return out
            out[a.job.id] = allocation(a.job, a.shared, nodes)
            out[b.job.id] = allocation(b.job, b.shared, nodes)
            used |= {a.job.id, b.job.id}
            excess -= 1
            break
    return out
