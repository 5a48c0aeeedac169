"""``tick(snapshot, policy, settings) -> Plan``: the pure half of a controller round.

1. Store bookkeeping read off Slurm: a pending job Slurm runs is ``running``, a running job
   requeued held is ``pending`` again (once no reconcile step moves it); a job Slurm
   finished (or forgot) with no reconcile step in flight ends ``finished``, ``cancelled``
   or ``failed`` -- except a job whose launch slurmd refused (:func:`launch_refused`),
   which is ``pending`` again and restarted (requeued held, released later).
2. When a round is due (``controller.round_period_s`` after the last one, or no round yet):
   evict the later-submitted job of a shared pair whose sampled GPU utilization is unstable
   (spec section 8: it waits this round and returns in a later one), ask the policy for
   every other job, and number the round. Otherwise the last round's decision stands and
   the plan only keeps converging to it. Either way a job that no longer accepts a shared
   GPU (its sharing failed) waits rather than be put on one (:func:`shared_without_consent`).
3. Diff each job's decided resources against what Slurm shows into an action: ``start``
   (pending job: update, release; also a released job not started yet that the round
   moved to other nodes), ``change`` (running job with other resources: checkpoint,
   requeue, update or resubmit, release), ``stop`` (running job told to wait, or a released
   one not started yet: held again).

Nothing here reads a clock, the store or Slurm: the same tick runs in the simulator.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from icefrog_slurm.domain.cluster import Gres, SlurmJobState
from icefrog_slurm.domain.plan import Action, JobPlan, Plan, Policy, PolicyResult, SlurmRequest
from icefrog_slurm.domain.records import Allocation, RoundRecord
from icefrog_slurm.domain.snapshot import JobSnapshot, Snapshot
from icefrog_slurm.settings import Settings

EVICTED = "Evicted: unstable GPU utilization while sharing a GPU (spec section 8)"
UNSHARED = "Sharing failed: ran out of memory while sharing a GPU; waits for a GPU of its own"


def round_due(last_round: RoundRecord | None, now: float, settings: Settings) -> bool:
    """Whether a tick at ``now`` is a round: none yet, or the period since the last one."""
    return last_round is None or now - last_round.time >= settings.controller.round_period_s


def tick(snapshot: Snapshot, policy: Policy, settings: Settings) -> Plan:
    """One tick's plan (module docstring)."""
    changes = state_changes(snapshot)
    ended = {job_id for job_id, state in changes if state not in ("pending", "running")}
    live = tuple(j for j in snapshot.jobs if j.id not in ended)
    if round_due(snapshot.last_round, snapshot.time, settings):
        if not snapshot.measured:
            raise ValueError("a round is due but the snapshot was read without measurements")
        evicted = unstable_packed(live, settings)
        others = Snapshot(
            time=snapshot.time,
            jobs=tuple(j for j in live if j.id not in evicted),
            capacity=snapshot.capacity,
            last_round=snapshot.last_round,
            open_intents=snapshot.open_intents,
        )
        result = policy.decide(others, settings=settings) if others.jobs else PolicyResult({})
        allocations = dict(result.allocations)
        reasons = dict(result.reasons)
        for job_id in evicted:
            allocations[job_id] = Allocation(job_id=job_id, gpus=0, batch=0, frozen=0)
            reasons[job_id] = EVICTED
        last = snapshot.last_round
        round_no: int | None = 1 if last is None else last.round_no + 1
        name, solve_s, min_share = policy.name, result.solve_s, result.min_share
        before = None if last is None else {a.job_id: a.nodes for a in last.allocations}
    else:
        assert snapshot.last_round is not None
        allocations = {a.job_id: a for a in snapshot.last_round.allocations}
        reasons, round_no, before = {}, None, None
        name, solve_s, min_share = snapshot.last_round.policy, None, None
    for job_id in shared_without_consent(live, allocations):
        allocations[job_id] = Allocation(job_id=job_id, gpus=0, batch=0, frozen=0)
        reasons[job_id] = UNSHARED
    held = held_mps(live, allocations)
    open_targets = {i.job_id: i.params.get("target") for i in snapshot.open_intents}
    busy = set(open_targets)
    jobs = tuple(
        _job_plan(
            j,
            allocations[j.id],
            reasons.get(j.id, ""),
            settings,
            moved=before is not None and before.get(j.id, ()) != allocations[j.id].nodes,
            held=held,
            overreach=j.id not in busy and overreaches(j, snapshot.granted.get(j.id)),
            at_open_target=j.id in busy and runs_as(j, open_targets[j.id]),
        )
        for j in live
        if j.id in allocations
    )
    return Plan(
        time=snapshot.time,
        round_no=round_no,
        policy=name,
        capacity_gpus=snapshot.capacity.available_gpus,
        jobs=jobs,
        state_changes=changes,
        solve_s=solve_s,
        min_share=min_share,
        decided_round=round_no if round_no is not None else _last_no(snapshot),
    )


def _last_no(snapshot: Snapshot) -> int | None:
    return None if snapshot.last_round is None else snapshot.last_round.round_no


def state_changes(snapshot: Snapshot) -> tuple[tuple[int, str], ...]:
    """(job id, new store state) for jobs whose Slurm state moved on (module docstring)."""
    busy = {i.job_id for i in snapshot.open_intents}
    out: list[tuple[int, str]] = []
    for j in snapshot.jobs:
        state, store_state = j.slurm, j.job.state
        if state is not None and state.holds_resources and store_state == "pending":
            out.append((j.id, "running"))
        elif state is not None and state.state == "PENDING" and store_state == "running":
            if j.id not in busy:
                out.append((j.id, "pending"))  # stopped (requeued held): it waits again
        elif j.id not in busy and launch_refused(state):
            if store_state == "running":
                out.append((j.id, "pending"))  # its restart was refused: it waits again
        elif j.id not in busy and (state is None or state.finished):
            out.append((j.id, _end_state(state, store_state)))
    return tuple(out)


_REFUSED = ("credential revoked", "launch fail", "joblaunchfailure")


def launch_refused(state: SlurmJobState | None) -> bool:
    """Whether slurmd refused to launch the job (e.g. "Job credential revoked" when it was
    requeued and released at once on the same node): Slurm shows it back pending held
    ("launch failed requeued held") or ended with a launch-failure reason. Such a job is
    restarted later, never counted as failed."""
    if state is None or not (state.finished or state.held):
        return False
    reason = state.reason.lower()
    return any(r in reason for r in _REFUSED)


def _end_state(state: SlurmJobState | None, store_state: str) -> str:
    if state is None:
        return "cancelled" if store_state == "pending" else "failed"
    if state.state == "COMPLETED":
        return "finished"
    return "cancelled" if state.state == "CANCELLED" else "failed"


def unstable_packed(jobs: tuple[JobSnapshot, ...], settings: Settings) -> frozenset[int]:
    """Jobs to evict: for each shared job whose last ``util_window`` shared samples have a
    GPU-utilization standard deviation above ``unstable_util_std``, the later-submitted
    of it and the jobs sharing a GPU on its node (ties: the larger id), as the spec evicts
    by submission time, when that job's own samples say so too (a shared GPU's utilization
    is the device's, which both see); else the job whose samples say so. A job's samples
    are its own word: one reporting an instability its partner does not see evicts itself,
    never another user's job."""
    window, limit = settings.sharing.util_window, settings.sharing.unstable_util_std

    def unstable(j: JobSnapshot) -> bool:
        utils = [s.gpu_util for s in j.view.samples if s.shared and s.gpu_util >= 0][-window:]
        return len(utils) >= window and statistics.pstdev(utils) > limit

    shared = [j for j in jobs if j.current.shared]
    evict: set[int] = set()
    for j in shared:
        if not unstable(j):
            continue
        pack = [p for p in shared if set(p.current.nodes) & set(j.current.nodes)]
        if len(pack) < 2:
            continue  # alone on its GPU: nothing to evict it from
        later = max(pack, key=lambda p: (p.job.submit_time, p.id))
        evict.add(later.id if later is j or unstable(later) else j.id)
    return frozenset(evict)


def shared_without_consent(
    jobs: tuple[JobSnapshot, ...], allocations: dict[int, Allocation]
) -> frozenset[int]:
    """Jobs a decision puts on a shared GPU although they no longer accept one: a job that
    ran out of memory while sharing registers again with ``accepts_shared`` false
    (icefrog_launcher.sharing; the inbox takes that only from the job's owner, about that
    job) and exits to be requeued. Its last round may still say shared: it waits instead of
    being released there again, until a round gives it GPUs of its own (the policies offer
    a shared GPU only to jobs that accept one)."""
    return frozenset(
        j.id
        for j in jobs
        if not j.job.spec.accepts_shared and j.id in allocations and allocations[j.id].shared
    )


def target_of(allocation: Allocation, settings: Settings) -> SlurmRequest:
    """Slurm resources for a decision: a share of one GPU on one node for a shared job
    (:func:`shared_gres`), ``gpu:gpus/N`` on N nodes otherwise, pinned to the placed nodes."""
    if allocation.gpus <= 0:
        return SlurmRequest(gres=None)
    if allocation.shared:
        gres = shared_gres(allocation, settings)
        return SlurmRequest(gres=gres, num_nodes=1, nodes=allocation.nodes[:1])
    num_nodes = max(len(allocation.nodes), 1)
    per_node = max(allocation.gpus // num_nodes, 1)
    return SlurmRequest(gres=Gres("gpu", per_node), num_nodes=num_nodes, nodes=allocation.nodes)


def shared_gres(allocation: Allocation, settings: Settings) -> Gres:
    """The GRES of a shared job, of the kind ``sharing.gres`` names.

    - ``shard:K``: K = shards a GPU / jobs a GPU (Slurm enforces no limit: kernels are
      time-sliced);
    - ``mps:N``: N = the job's predicted utilisation (eq 8) x the GPU's MPS count, rounded
      down (the sharing rule keeps a GPU's predicted utilisation <= 100 %, so the shares of
      its jobs fit its MPS count), at least 1 and leaving 1 for each other job the GPU may
      take; Slurm then sets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = N / count x 100. A
      decision without a prediction asks for an equal part, as shards do.
    """
    jobs = max(settings.sharing.max_jobs_per_gpu, 1)
    if settings.sharing.gres == "shard":
        return Gres("shard", max(settings.slurm.shards_per_gpu // jobs, 1))
    count = settings.slurm.mps_per_gpu
    util = allocation.predicted_util
    if util is None or not 0 <= util <= 1:  # (a NaN fails the test too)
        return Gres("mps", max(count // jobs, 1))
    share = math.floor(util * count + 1e-9)
    return Gres("mps", min(max(share, 1), max(count - (jobs - 1), 1)))


def matches(state: SlurmJobState, target: SlurmRequest) -> bool:
    """Whether a Slurm job already has the target's resources (nodes aside). A running
    ``mps`` job keeps its share when a round asks for another ``mps`` count on the same
    footing: the prediction moves a little every round, and a requeue for that alone would
    cost more than the share it corrects."""
    if state.num_nodes != target.num_nodes:
        return False
    held, wanted = state.gres, target.gres
    if held is not None and wanted is not None and state.holds_resources:
        return held.kind == wanted.kind and (held.kind == "mps" or held.count == wanted.count)
    return held == wanted


def runs_as(job: JobSnapshot, target: Any) -> bool:
    """Whether a job runs as an intent's ``target`` (its params) asks: its resources match
    and it holds no more, nodes included (:func:`overreaches`)."""
    state = job.slurm
    if state is None or not state.holds_resources or not isinstance(target, Mapping):
        return False
    return matches(state, SlurmRequest.from_params(target)) and not overreaches(job, target)


def overreaches(job: JobSnapshot, granted: Mapping[str, Any] | None) -> bool:
    """Whether a running job holds more than the controller last released it with
    (``granted``, :attr:`Snapshot.granted`): GPUs while the controller held it, on a node
    it was not given, on more nodes, more whole GPUs on a node, a whole GPU for a share or
    a larger share. Only its owner can have done that (``scontrol release`` and ``update``
    of their own job, or a dependency that keeps a released job pending until they change
    it). No intent done yet (a job released before an upgrade): no."""
    state = job.slurm
    if granted is None or state is None or not state.holds_resources:
        return False
    given = SlurmRequest.from_params(granted)
    held = state.gres
    if given.gres is None:
        return True  # held by the controller: released by its owner
    if given.nodes and not set(job.current.nodes) <= set(given.nodes):
        return True
    if state.num_nodes > given.num_nodes:
        return True
    if given.gres.shared:  # (a share's GPUs are not compared: Slurm may split its shards)
        return held is not None and (
            held.kind == "gpu" or (held.kind == given.gres.kind and held.count > given.gres.count)
        )
    by_node = state.gpus_by_node or ()
    return any(n > given.gres.count for _, n in by_node) or (
        held is not None and held.kind == "gpu" and held.count > given.gres.count
    )


def action_for(job: JobSnapshot, target: SlurmRequest, moved: bool = False) -> Action:
    """What reconcile must do to bring the job to ``target``. ``moved``: this round placed
    the job on other nodes than the last round did. A job released but not started yet
    (pending, not held) is pinned to the nodes it was released to: when a round moves it,
    it is updated to the new nodes (else it could wait for ever on nodes another job got);
    when a round tells it to wait, it is held again (else Slurm would start it anyway)."""
    state = job.slurm
    if state is not None and state.finished and launch_refused(state):
        return "stop" if target.gres is None else "change"  # requeue held, then restart
    if state is None or state.finished:
        return "none"
    if state.holds_resources:
        if target.gres is None:
            return "stop"
        return "none" if matches(state, target) else "change"
    if target.gres is None:
        return "stop" if state.state == "PENDING" and not state.held else "none"
    if state.state == "PENDING" and (state.held or moved or not matches(state, target)):
        return "start"
    return "none"


def run_dir_of(checkpoint_path: str) -> str:
    """``<workdir>/checkpoints/ckpt-N.pt`` -> ``<workdir>`` (the trainer's layout); else ""."""
    head, sep, _ = checkpoint_path.rpartition("/checkpoints/")
    return head if sep and head else ""


def held_mps(
    jobs: tuple[JobSnapshot, ...], allocations: Mapping[int, Allocation]
) -> dict[str, dict[int, int]]:
    """node -> {job id: its mps count} of the running mps jobs the round keeps shared on
    that node: they keep their share (:func:`matches`), which a job joining them must fit
    beside."""
    out: dict[str, dict[int, int]] = {}
    for j in jobs:
        state, alloc = j.slurm, allocations.get(j.id)
        if state is None or state.gres is None or alloc is None:
            continue
        if state.holds_resources and state.gres.kind == "mps" and alloc.shared:
            node = alloc.nodes[0] if alloc.nodes else ""
            if node and node in j.current.nodes:
                out.setdefault(node, {})[j.id] = state.gres.count
    return out


def _job_plan(
    job: JobSnapshot,
    alloc: Allocation,
    reason: str,
    settings: Settings,
    *,
    moved: bool,
    held: Mapping[str, Mapping[int, int]] | None = None,
    overreach: bool = False,
    at_open_target: bool = False,
) -> JobPlan:
    target = target_of(alloc, settings)
    node = target.nodes[0] if target.nodes else ""
    others = {i: n for i, n in (held or {}).get(node, {}).items() if i != job.id}
    if target.gres is not None and target.gres.kind == "mps" and others:
        # a running mps job on the node keeps its share (it may be more than this round
        # predicts for it): ask for no more than the largest such share leaves of a GPU,
        # so that this job fits beside whichever of them it joins
        room = max(settings.slurm.mps_per_gpu - max(others.values()), 1)
        if target.gres.count > room:
            target = replace(target, gres=Gres("mps", room))
    action = action_for(job, target, moved)
    if overreach and action == "none":  # (the target matches but for its nodes or share)
        action = "change"
    return JobPlan(
        job_id=job.id,
        slurm_job_id=job.job.slurm_job_id,
        owner_uid=job.job.owner_uid,
        allocation=alloc,
        target=target,
        action=action,
        reason=reason,
        run_dir=run_dir_of(job.job.progress.checkpoint_path),
        overreach=overreach,
        at_open_target=at_open_target,
    )
