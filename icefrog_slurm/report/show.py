"""``icefrog show job``: one job's summary, its trajectory and its recent Slurm actions. Pure.

The summary is ``Key=Value`` pairs like ``scontrol show job``, with the figures of
``icefrog sacct`` (same code). The trajectory has one line per round whose decision
differs from the one before in GPUs, sharing, nodes, batch, frozen layers or ψ (as
printed, 3 decimals); predicted TTA and IceShare move every round and do not start a
line by themselves. Node lists print compressed (``node[1-2]``) and JSON times are whole
seconds, as in the other reports.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from typing import Any

from icefrog_slurm.domain.records import SlurmAction
from icefrog_slurm.report import jobs
from icefrog_slurm.report.envelope import seconds
from icefrog_slurm.report.queries import ShownJob
from icefrog_slurm.report.sacct import acct_json, acct_row, number
from icefrog_slurm.report.squeue import node_list
from icefrog_slurm.report.table import Column, Field, render_table
from icefrog_slurm.report.timefmt import format_duration, format_time
from icefrog_slurm.store.views import Decided


def _opt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


TRAJECTORY: tuple[Field[Decided], ...] = (
    Field("Round", 6, lambda d: str(d.round_no)),
    Field("Time", 19, lambda d: format_time(d.time)),
    Field("GPUs", 4, lambda d: str(d.allocation.gpus)),
    Field("Shared", 6, lambda d: "yes" if d.allocation.shared else "no"),
    Field("Batch", 5, lambda d: str(d.allocation.batch)),
    Field("Frozen", 6, lambda d: str(d.allocation.frozen)),
    Field("Psi", 5, lambda d: _opt(d.allocation.psi)),
    Field("PredTTA", 10, lambda d: format_duration(d.allocation.predicted_tta_s)),
    Field("IceShare", 8, lambda d: _opt(d.allocation.share)),
    Field("NodeList", 20, lambda d: node_list(d.allocation.nodes), left=True),
)

ACTIONS: tuple[Field[SlurmAction], ...] = (
    Field("Time", 19, lambda a: format_time(a.time)),
    Field("Action", 12, lambda a: a.action, left=True),
    Field("Outcome", 7, lambda a: a.outcome, left=True),
    Field("RC", 3, lambda a: "" if a.rc is None else str(a.rc)),
    Field("SlurmJobID", 10, lambda a: a.slurm_job_id or ""),
    Field("Command", 40, lambda a: shlex.join(a.command), left=True),
    Field("Detail", 30, lambda a: a.detail, left=True),
)


def _columns(fields: tuple[Field[Any], ...]) -> list[Column[Any]]:
    return [Column(field=f, width=f.width, left=f.left) for f in fields]


def changes(history: tuple[Decided, ...]) -> list[Decided]:
    """The decisions that differ from the one before (ψ as printed, nodes in any order);
    the first always."""
    out: list[Decided] = []
    previous: tuple[object, ...] | None = None
    for decided in history:
        a = decided.allocation
        key = (a.gpus, a.shared, a.batch, a.frozen, _opt(a.psi), tuple(sorted(a.nodes)))
        if key != previous:
            out.append(decided)
        previous = key
    return out


def show_lines(detail: ShownJob, *, now: float, actions: int) -> list[str]:
    facts = detail.facts
    job, row = facts.job, acct_row(facts, now=now)
    spec = job.spec
    summary = [
        f"JobId={job.id} JobName={shlex.quote(job.name)} UserId={job.owner_user}({job.owner_uid})",
        f"   JobState={jobs.state_name(job.state)} FinishReason={job.finish_reason or '(null)'}"
        f" Epoch={job.progress.epoch}",
        f"   Reason={_wait_text(facts.history, jobs.wait_reason(job, _last(facts.history)))}",
        f"   SlurmJobIds={','.join(job.slurm_job_ids)} Restarts={row.restarts}"
        f" Reallocations={row.reallocations}",
        f"   SubmitTime={format_time(job.submit_time)} StartTime={format_time(job.start_time)}"
        f" EndTime={format_time(job.end_time)}",
        f"   JCT={format_duration(row.jct_s)} TTA={format_duration(row.tta_s) or '(null)'}"
        f" GPUHours={row.gpu_hours:.2f}",
        f"   Target={shlex.quote(spec.target_metric)}{spec.target_op}{spec.target_value:g}"
        f" FinalMetric={number(row.final_metric) or '(null)'}"
        f" Reached={'yes' if row.reached else 'no'}",
        f"   Spec=gpus:{spec.min_gpus}-{spec.max_gpus},batch:{spec.min_batch}-{spec.max_batch}"
        f",max_frozen_fraction:{spec.max_frozen_fraction:g},layers:{len(spec.layer_flops)}",
        "",
    ]
    trajectory = changes(facts.history)
    summary.append(
        f"Trajectory: {len(trajectory)} of {len(facts.history)} rounds changed the decision"
    )
    if trajectory:
        summary.extend(render_table(_columns(TRAJECTORY), trajectory, header=True))
    recent = detail.actions[-actions:] if actions > 0 else ()
    summary.append("")
    summary.append(f"Slurm actions: latest {len(recent)} of {len(detail.actions)}")
    if recent:
        summary.extend(render_table(_columns(ACTIONS), recent, header=True))
    return summary


def _last(history: tuple[Decided, ...]) -> Decided | None:
    return history[-1] if history else None


def _wait_text(history: tuple[Decided, ...], word: str) -> str:
    """``Reason=``: (None) when the job does not wait, else the last round's whole reason."""
    if not word:
        return "(None)"
    last = _last(history)
    return last.reason if last is not None and last.reason else word


def show_json(detail: ShownJob, *, now: float, actions: int) -> dict[str, Any]:
    facts = detail.facts
    recent = detail.actions[-actions:] if actions > 0 else ()
    return {
        "job": acct_json(acct_row(facts, now=now)),
        "trajectory": [
            {"round": d.round_no, "time": seconds(d.time), **_allocation_json(d)}
            for d in changes(facts.history)
        ],
        "rounds_decided": len(facts.history),
        "reason": _wait_text(facts.history, jobs.wait_reason(facts.job, _last(facts.history))),
        "actions": [
            {**asdict(a), "time": seconds(a.time), "command": list(a.command)} for a in recent
        ],
        "actions_total": len(detail.actions),
    }


def _allocation_json(d: Decided) -> dict[str, Any]:
    values = asdict(d.allocation)
    values.pop("job_id")
    values["nodes"] = node_list(d.allocation.nodes)
    values["predicted_tta_s"] = seconds(d.allocation.predicted_tta_s)
    return values
