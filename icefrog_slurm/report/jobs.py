"""What the reports compute about one job from its records: pure, no store, no clock.

A job's *decision history* is the controller's decision for it in each round, oldest first
(``store.views.Decided``). A decision holds from its round's time until the job's next
decided round, or until the job ended (or ``now`` while it runs).

- GPU-hours: ∫ gpus(t) dt over [start, end] / 3600, the integral of the decided GPU count
  over the job's run. A shared GPU is charged in full to each job on it.
- Reallocations: rounds in which the job's resources (GPU count, sharing, nodes) differ
  from the previous decision while it held GPUs: a resize, a move or a preemption. A
  change of batch or frozen layers alone is applied in place and is not counted.
- Restarts: decisions that start the job again from a checkpoint after it first got GPUs:
  each new set of resources (resize or move) and each resume after a preemption.
- TTA: from submission to the arrival of the first validation value of the target metric
  that meets the target (or to the end, when the job finished with ``target_reached`` but
  sent no such value).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from icefrog_slurm.domain.records import JobRecord
from icefrog_slurm.store.views import Decided, TimedMetric

# icefrog state -> (sacct/squeue long name, squeue compact code)
STATE_NAMES: dict[str, tuple[str, str]] = {
    "pending": ("PENDING", "PD"),
    "running": ("RUNNING", "R"),
    "finished": ("COMPLETED", "CD"),
    "failed": ("FAILED", "F"),
    "cancelled": ("CANCELLED", "CA"),
}
JOB_STATES_SHOWN: tuple[str, ...] = tuple(
    f"{state} ({long}, {code})" for state, (long, code) in STATE_NAMES.items()
)


@dataclass(frozen=True)
class JobFacts:
    """A job and what the store knows of it, read in one transaction."""

    job: JobRecord
    history: tuple[Decided, ...] = ()
    metrics: tuple[TimedMetric, ...] = ()


def state_name(state: str) -> str:
    return STATE_NAMES.get(state, (state.upper(), state.upper()))[0]


def state_code(state: str) -> str:
    return STATE_NAMES.get(state, (state.upper(), state.upper()))[1]


def state_aliases() -> dict[str, str]:
    """Every accepted ``-t/-s`` spelling (icefrog, long and compact, any case) -> state."""
    out: dict[str, str] = {}
    for state, (long, code) in STATE_NAMES.items():
        for alias in (state, long, code):
            out[alias.lower()] = state
    return out


def end_or_now(job: JobRecord, now: float) -> float:
    return job.end_time if job.end_time is not None else now


def gpu_seconds(history: Sequence[Decided], *, start: float | None, end: float) -> float:
    """∫ gpus dt over [start, end], each decision holding until the next one."""
    if start is None:
        return 0.0
    total = 0.0
    for k, decided in enumerate(history):
        until = history[k + 1].time if k + 1 < len(history) else end
        lo, hi = max(decided.time, start), min(until, end)
        if hi > lo:
            total += decided.allocation.gpus * (hi - lo)
    return total


def _resources(decided: Decided) -> tuple[int, bool, tuple[str, ...]] | None:
    a = decided.allocation
    return (a.gpus, a.shared, tuple(sorted(a.nodes))) if a.gpus > 0 else None


def restarts_and_reallocations(history: Iterable[Decided]) -> tuple[int, int]:
    """(restarts, reallocations) counted over the decision history (see module doc)."""
    restarts = reallocations = 0
    previous: tuple[int, bool, tuple[str, ...]] | None = None
    started = False
    for decided in history:
        current = _resources(decided)
        if previous is not None and current != previous:
            reallocations += 1
        if current is not None and started and current != previous:
            restarts += 1
        started = started or current is not None
        previous = current
    return restarts, reallocations


def meets(value: float, *, op: str, target: float) -> bool:
    return value >= target if op == ">=" else value <= target


def target_metrics(facts: JobFacts) -> list[TimedMetric]:
    name = facts.job.spec.target_metric
    return [m for m in facts.metrics if m.name == name]


def tta_seconds(facts: JobFacts) -> float | None:
    """Submission to the first target-meeting value of the target metric (module doc)."""
    spec, job = facts.job.spec, facts.job
    for m in target_metrics(facts):
        if meets(m.value, op=spec.target_op, target=spec.target_value):
            return m.time - job.submit_time
    if job.finish_reason == "target_reached" and job.end_time is not None:
        return job.end_time - job.submit_time
    return None


def final_metric(facts: JobFacts) -> float | None:
    """The metric the job finished with, else its latest value of the target metric."""
    if facts.job.final_metric is not None:
        return facts.job.final_metric
    values = target_metrics(facts)
    return values[-1].value if values else None


def target_reached(facts: JobFacts) -> bool:
    return facts.job.finish_reason == "target_reached" or tta_seconds(facts) is not None


def wait_reason(job: JobRecord, latest: Decided | None) -> str:
    """Why a pending job is not running, as a squeue-style reason word ('' otherwise).

    ``NotDecided``: no round has decided the job yet; ``Starting``: the last round gave it
    GPUs and the controller is releasing it; when the last round gave it no GPUs, the word
    of the reason the policy recorded (``Resources``: the GPUs went to others; ``NoFit``: no
    configuration of it fits or makes progress; ``EstimateFailed``: its reports could not be
    modelled; ``Evicted``: unstable while sharing), ``Resources`` when none was recorded.
    """
    if job.state != "pending":
        return ""
    if latest is None:
        return "NotDecided"
    if latest.allocation.gpus:
        return "Starting"
    return reason_word(latest.reason)


def reason_word(reason: str) -> str:
    """The squeue word of a recorded reason "Word: detail" ("Resources" for any other)."""
    word = reason.split(":", 1)[0]
    return word if word.isalnum() and word[:1].isupper() else "Resources"
