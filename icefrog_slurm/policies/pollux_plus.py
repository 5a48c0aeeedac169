"""``PolluxPlusPolicy``: Pollux (Qiao et al., OSDI 2021) with FreezeOut, no sharing.

Pollux scores a job's allocation by its *goodput*: throughput x statistical efficiency of
the global batch, with the batch chosen per allocation; its cluster optimiser (AdaptDL's
``PolluxPolicy.optimize``, a genetic algorithm) maximises the power mean, p = -1, of the
jobs' speedups, speedup = goodput(allocation) / goodput(a fair-share allocation).

Here (simplified; docs/evaluation.md says why):
- efficiency (``core/goodput.py``) follows AdaptDL's ``goodput.py``: scale = M / M0 (M0
  the job's smallest global batch), gain = (var + sqr) / (var / scale + sqr), efficiency =
  gain / scale, with var and sqr the sums of the trainable layers' reported gradient
  variance and squared norm;
  jobs with no statistics yet count efficiency 1;
- goodput(a) = E(a) x efficiency(a x m) for the per-GPU batch m that maximises it at a
  (the Layer Tuner with batch scaling, at FreezeOut's depth l: the "+"), as AdaptDL
  re-optimises the batch for every allocation (without its gradient accumulation: m is
  one of the job's declared batches);
- speedup(a) = goodput(a) / goodput(fair share), the fair share ceil(GPUs / jobs) as in
  AdaptDL's simulator (``simulator/pollux.py``), times its restart penalty
  age / (age + delay) for a changed allocation (delay = the reallocation overhead);
- the p = -1 power-mean objective (sum of -1/speedup) is maximised by the marginal-gain
  greedy of ``baseline.elastic`` instead of NSGA-II, looking past the next count to every
  larger one (a job's value may dip at the first count across nodes and rise beyond);
  exclusive GPUs only.
"""

from __future__ import annotations

import time

from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.policies.baseline import (
    Free,
    JobOptions,
    elastic,
    job_options,
    place_counts,
    result,
)
from icefrog_slurm.policies.estimate import Estimator
from icefrog_slurm.settings import Settings

NO_SPEEDUP = 1e12  # -1/speedup for a job that would make no progress


def goodput(o: JobOptions, gpus: int) -> float:
    """The tuner's goodput at ``gpus``: E x efficiency of its chosen (batch, depth)."""
    return o.exclusive[gpus].choice.effective_progress


class PolluxPlusPolicy:
    """Pollux+ (module docstring)."""

    name = "pollux+"

    def __init__(self) -> None:
        self.estimator = Estimator(freezing="freezeout", batch_scaling=True)

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        started = time.perf_counter()
        opts, _ = job_options(snapshot, self.estimator, settings)
        opts = [o for o in opts if o.exclusive]
        fair = -(-snapshot.capacity.available_gpus // max(len(opts), 1))
        base = {o.job.id: goodput(o, fair_count(o, fair)) for o in opts}
        delay = settings.controller.reallocation_overhead_s

        def value(o: JobOptions, gpus: int) -> float:
            speedup = goodput(o, gpus) / base[o.job.id] if base[o.job.id] > 0 else 0.0
            cur = o.job.current.gpus
            if cur and gpus != cur:  # AdaptDL simulator's restart penalty
                age = max(snapshot.time - o.job.job.submit_time, 0.0)
                speedup *= age / (age + delay)
            return -1.0 / speedup if speedup > 0 else -NO_SPEEDUP

        free = Free(snapshot)
        counts = elastic(
            opts, free, value=value, order=lambda o: (o.job.job.submit_time, o.job.id),
            lookahead=True,
        )  # fmt: skip
        return result(snapshot, place_counts(opts, counts, free), started=started)


def fair_count(o: JobOptions, fair: int) -> int:
    """The job's legal count nearest below its fair share of the GPUs (its smallest if none)."""
    below = [g for g in o.counts if g <= fair]
    return below[-1] if below else o.counts[0]
