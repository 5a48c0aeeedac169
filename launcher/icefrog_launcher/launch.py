"""``icefrog launch``: run the training script under torchrun inside a Slurm allocation.

Pure parts (tested with plain dicts for the environment): :func:`layout_from_env` reads
the job's :class:`NodeLayout` (nodes, processes per node) from the variables Slurm gives the
batch script, :func:`build_command` turns it into the torchrun (or ``srun ... torchrun``
across nodes) command line. The impure part, :func:`run_training`, starts that command in
the background and traps USR1/TERM (from the launcher's first step: :class:`StopTrap`).

Exit status of ``icefrog launch``:

- ``0``: the trainer finished (target reached or max epochs ran out; the ``finished``
  report says which);
- :data:`REQUEUE_EXIT_CODE` (75, ``EX_TEMPFAIL``): "requeue me". The trainers checkpointed
  and stopped because the launcher got USR1 or TERM, or because the controller's decision
  asked for a GPU count different from the one running (rank 0 writes the checkpoint
  marker ``<workdir>/checkpointed``, icefrog_slurm.runfiles, which the controller also
  watches); or the launcher got USR1 or TERM and the trainers ended without the marker
  (killed before they checkpointed): the job resumes from its last checkpoint;
- anything else: the training failed (torchrun's status).

Signals: Slurm (``scancel --batch --signal=USR1``, ``--signal=B:USR1@60``) signals the batch
shell, which passes it on to the launcher (``icefrog submit``'s script). torchrun's agent
dies on an unhandled USR1, so on one node the launcher sends torchrun TERM in every case;
torchrun forwards TERM to the trainers, whose handler checkpoints at the next step
boundary and exits; torchrun kills them :data:`SHUTDOWN_TIMEOUT_S` later. Across nodes
the launcher sends ``srun`` USR1 instead: srun forwards USR1 to the step and keeps it,
whereas TERM makes srun kill the step ("forcing job termination": the tasks are SIGKILLed
after KillWait and never checkpoint). slurmstepd delivers the forwarded USR1 to every
process of the step, torchrun's agent included, so each node's task is
:mod:`icefrog_launcher.relay`: it starts torchrun with USR1 ignored (the trainers install
their own handler) and turns the USR1 it gets itself into TERM for torchrun, for a Slurm
that signals only the task's own process.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import Decision, SharedLoad
from icefrog_slurm.runfiles import CHECKPOINT_MARKER
from icefrog_slurm.security import write_atomic

REQUEUE_EXIT_CODE = 75  # sysexits EX_TEMPFAIL: checkpointed, please requeue
DEFAULT_PORT = 29500
# Exported (=1) by the batch script ``icefrog submit`` writes: the job was submitted to the
# controller. For the job side only: without it the launcher prints the notice below and
# tells the trainer (JobConfig.managed, the same variable) to read no decision.json. The
# controller itself adopts a job only by its Slurm record (the icefrog tag), so exporting
# it in a plain sbatch job gains nothing but the reading of the job's own workdir's file.
MANAGED_ENV = "ICEFROG_MANAGED"


SUBMIT_SCRIPT_ENV = "ICEFROG_SUBMIT_SCRIPT"
"""Exported (=1) by the batch script ``icefrog submit`` writes, and emptied on that script's
own launch line: a launcher that sees it set was started some other way in such a job and
refuses (:func:`check_started_by_script`)."""


def check_started_by_script(env: Mapping[str, str]) -> None:
    """InputError when this launcher runs in a batch script ``icefrog submit`` wrote but was
    not started by its launch line (``exec icefrog launch``, ``srun icefrog launch``,
    ``timeout ... icefrog launch``): it would run with none of the job's declaration (one
    GPU, no inbox, checkpoints in the current folder) and the controller's signals would
    not reach it."""
    if env.get(SUBMIT_SCRIPT_ENV) == "1":
        raise InputError(
            "started inside a job icefrog submit wrote, but not by its launch line: write "
            "'icefrog launch -- SCRIPT ARGS' as a command of the batch script itself, not "
            "through exec, srun or another program (that line runs the job's declared "
            "launcher: its GPUs, inbox and workdir, and the controller's signals)"
        )


def is_managed(env: Mapping[str, str]) -> bool:
    """Whether this job was submitted with ``icefrog submit`` (the marker), or runs outside
    Slurm (no SLURM_JOB_ID: a test or a local run, whose decision.json is its caller's)."""
    return not env.get("SLURM_JOB_ID", "") or env.get(MANAGED_ENV) == "1"


def unmanaged_notice(env: Mapping[str, str]) -> str | None:
    """The one line a Slurm job that ``icefrog submit`` did not submit prints: it runs as an
    ordinary Slurm job (nothing sizes it; it trains with its declared limits on the
    allocation it has) and how to submit a managed one. None inside such a job, and
    outside Slurm (no SLURM_JOB_ID). The caller has checked SLURM_JOB_ID is a number."""
    if is_managed(env):
        return None
    job_id = env["SLURM_JOB_ID"]
    return (
        f"icefrog launch: Slurm job {job_id} was not submitted with icefrog "
        "submit: it runs unmanaged, as an ordinary Slurm job (no controller resizes or "
        "requeues it; it trains on the GPUs it was given); for a managed job, submit it "
        "with icefrog submit instead of sbatch (the same script, or the launch options "
        "-- train.py ARGS)"
    )


@dataclass(frozen=True)
class NodeLayout:
    """This job's nodes and what each runs: node count, processes per node, devices."""

    nnodes: int
    nproc_per_node: int
    first_node: str
    job_id: str
    cuda_visible_devices: str | None  # None: leave the variable as it is


_RANGES = re.compile(r"\[(\d+)(?:-\d+)?(?:,\d+(?:-\d+)?)*\]")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist, as ``scontrol show hostnames`` lists it first:
    ``node[03-05,9],gpu1`` -> ``node03``, ``n[001-002]x`` -> ``n001x``,
    ``rack[1-2]-node[01-02]`` -> ``rack1-node01``: each bracket group of the first item
    gives its first number (zero padding kept). Nothing is expanded."""
    text = nodelist.strip()
    if not text:
        raise InputError("SLURM_NODELIST: empty")
    first = _first_item(text)
    host = _RANGES.sub(lambda m: m.group(1), first)
    if not host or not re.fullmatch(r"[A-Za-z0-9._-]+", host) or len(first) > 1024:
        raise InputError(f"SLURM_NODELIST: cannot read {nodelist[:80]!r}")
    return host


def _first_item(text: str) -> str:
    """The text before the first comma outside brackets."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            return text[:i]
    return text


def _device_list(text: str, name: str) -> list[str]:
    devices = [d.strip() for d in text.split(",") if d.strip()]
    if not devices:
        raise InputError(f"{name}: empty device list")
    return devices


def layout_from_env(env: Mapping[str, str], procs_override: int | None = None) -> NodeLayout:
    """Read the node layout from Slurm's variables.

    Processes per node, first match wins: ``procs_override``; CUDA_VISIBLE_DEVICES (a GPU
    job on a node with real devices); GPU_DEVICE_ORDINAL (a shard job: Slurm sets no
    CUDA_VISIBLE_DEVICES, so the ordinals become it; one process per distinct GPU);
    SLURM_GPUS_ON_NODE; otherwise 1.
    """
    try:
        nnodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
    except ValueError:
        raise InputError("SLURM_JOB_NUM_NODES: must be a number") from None
    if nnodes < 1:
        raise InputError("SLURM_JOB_NUM_NODES: must be >= 1")
    visible: str | None = None
    if "CUDA_VISIBLE_DEVICES" in env:
        nproc = len(_device_list(env["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES"))
    elif "GPU_DEVICE_ORDINAL" in env:
        ordinals = _device_list(env["GPU_DEVICE_ORDINAL"], "GPU_DEVICE_ORDINAL")
        distinct = list(dict.fromkeys(ordinals))
        visible = ",".join(distinct)
        nproc = len(distinct)
    elif env.get("SLURM_GPUS_ON_NODE", "").isdigit() and int(env["SLURM_GPUS_ON_NODE"]) > 0:
        nproc = int(env["SLURM_GPUS_ON_NODE"])
    else:
        nproc = 1
    if procs_override is not None:
        if procs_override < 1:
            raise InputError("--procs-per-node: must be >= 1")
        nproc = procs_override
    nodelist = env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "localhost"))
    return NodeLayout(
        nnodes=nnodes,
        nproc_per_node=nproc,
        first_node=first_host(nodelist),
        job_id=env.get("SLURM_JOB_ID", "0"),
        cuda_visible_devices=visible,
    )


def rendezvous_host(
    layout: NodeLayout, resolves: Callable[[str], bool], fallback: str
) -> NodeLayout:
    """The c10d host: the layout's first node when its name resolves, else
    ``fallback`` (the batch host, where the launcher runs: Slurm runs the batch script on
    the first node). Node names need not resolve, e.g. on a test cluster whose nodes
    are all ``NodeHostname=localhost``."""
    if layout.nnodes == 1 or resolves(layout.first_node):
        return layout
    return dataclasses.replace(layout, first_node=fallback)


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return False
    return True


def build_command(
    layout: NodeLayout,
    script: Sequence[str],
    *,
    torchrun: str = "torchrun",
    port: int | None = None,
    relay: Sequence[str] = (),
) -> list[str]:
    """The command line: torchrun on one node, ``srun`` one torchrun per node otherwise,
    each behind ``relay`` (e.g. ``python -m icefrog_launcher.relay``; see :func:`stop_signal`).

    One node uses ``--standalone`` (a private rendezvous, no port clash between jobs
    sharing a node); several nodes rendezvous with c10d on the first node, on ``port``
    or, by default, ``DEFAULT_PORT + job_id % 1000`` so two jobs whose first node is
    the same do not collide.
    """
    if not script:
        raise InputError("launch: give the training script after '--' (e.g. -- train.py)")
    base = [torchrun, f"--nproc-per-node={layout.nproc_per_node}"]
    if layout.nnodes == 1:
        return [*base, "--standalone", "--nnodes=1", *script]
    if port is None:
        port = DEFAULT_PORT + (int(layout.job_id) % 1000 if layout.job_id.isdigit() else 0)
    rdzv = [
        f"--nnodes={layout.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={layout.first_node}:{port}",
        f"--rdzv-id={layout.job_id}",
    ]
    srun = ["srun", f"--nodes={layout.nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    return [*srun, *relay, *base, *rdzv, *script]


SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
"""torchrun's time between passing a stop on to the trainers and killing them (its
``--shutdown-timeout``, read from this variable by the torch versions that have it; 30 s
when unset, and in the versions before it)."""

SHUTDOWN_TIMEOUT_S = 120
"""The time a trainer is given to checkpoint after a stop: the controller's default
``checkpoint_timeout_s``, how long it waits for the checkpoint before requeueing the job
anyway. A trainer serves the stop at its next step boundary, or after the epoch's
evaluation when the loader is done (icefrog_launcher.trainer)."""


def shutdown_env(env: Mapping[str, str]) -> dict[str, str]:
    """torchrun's shutdown timeout for the job (:data:`SHUTDOWN_TIMEOUT_ENV`): the job's
    own when its environment sets one, otherwise :data:`SHUTDOWN_TIMEOUT_S`."""
    return {SHUTDOWN_TIMEOUT_ENV: env.get(SHUTDOWN_TIMEOUT_ENV) or str(SHUTDOWN_TIMEOUT_S)}


def stop_signal(layout: NodeLayout) -> signal.Signals:
    """What the launcher sends its child to stop the trainers: TERM to torchrun on one
    node; USR1 to ``srun`` across nodes (srun passes USR1 on to the relays; see the
    module docstring)."""
    return signal.SIGTERM if layout.nnodes == 1 else signal.SIGUSR1


def child_env(
    env: Mapping[str, str],
    layout: NodeLayout,
    extra: Mapping[str, str],
    load: SharedLoad | None = None,
) -> dict[str, str]:
    """The environment of torchrun, which every training process inherits: the caller's,
    the device mapping, the job config and, for a job sharing its GPU through CUDA MPS, its
    limits (:func:`mps_env` of the decision's ``load``)."""
    out = dict(env)
    if layout.cuda_visible_devices is not None:
        out["CUDA_VISIBLE_DEVICES"] = layout.cuda_visible_devices
    out.update(extra)
    out.update(mps_env(env, load, devices=layout.nproc_per_node))
    return out


MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
"""CUDA MPS: the share of the GPU's threads (SMs) a client may use, in percent. Slurm sets
it for a ``--gres=mps:N`` job (N over the GPU's MPS count, at least 1); a client's own
value can only lower what the MPS control daemon allows."""
MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
"""CUDA MPS: the device memory a client may allocate, ``<ordinal>=<size>`` per device the
process sees (e.g. ``0=8192M``); an allocation beyond it fails in that client alone."""
MIB = 2**20


def mps_env(env: Mapping[str, str], load: SharedLoad | None, *, devices: int = 1) -> dict[str, str]:
    """The CUDA MPS limits of a job sharing its GPU through MPS (``load.kind == "mps"``,
    the decision's predicted footprint): the variables to set in every training process.

    - :data:`MPS_THREADS`: the predicted utilisation in percent (rounded up, 1..100), or
      Slurm's (its ``mps:N`` share of the GPU) when that is lower: the job never gets more
      than Slurm allotted it, nor more than the admission rule counted for it (sum <= 100 %);
    - :data:`MPS_MEMORY`: ``memory_safety x`` the predicted peak (the admission rule's
      1.1 x), in MiB rounded up, for each of the ``devices`` ordinals the processes see
      (``0`` for a shared job's one process on its one GPU, as torch numbers it).

    Only for a job Slurm started with an MPS share (it set :data:`MPS_THREADS`): a decision
    that says MPS for a job running on a whole GPU is stale and sets nothing. Nothing
    either without such a load (an exclusive or shard job, no decision yet): Slurm's own
    variables pass on unchanged. InputError when Slurm's percentage is not a whole number
    within 1..100."""
    slurm = env.get(MPS_THREADS)
    if load is None or load.kind != "mps" or slurm is None:
        return {}
    given = _percentage(slurm)
    predicted = min(100, max(1, math.ceil(load.util * 100 - 1e-9)))
    mib = max(1, math.ceil(load.mem_limit_bytes / MIB))
    return {
        MPS_THREADS: str(predicted if given is None else min(given, predicted)),
        MPS_MEMORY: ",".join(f"{d}={mib}M" for d in range(max(devices, 1))),
    }


def _percentage(text: str) -> int:
    value = text.strip()
    if not re.fullmatch(r"[0-9]{1,3}", value) or not 1 <= int(value) <= 100:
        raise InputError(f"{MPS_THREADS}: must be a whole number within 1..100, got {text[:20]!r}")
    return int(value)


def shared_load(decision: Decision | None) -> SharedLoad | None:
    """The decision's predicted footprint when it shares the job's GPU; None otherwise."""
    if decision is None or not decision.shared:
        return None
    return decision.load


DECISION_WAIT_S = 30.0
"""How long a job Slurm started with an MPS share waits for the decision that names its
limits (the controller writes decision.json right after the pass that released the job)."""


def mps_load(
    env: Mapping[str, str],
    read: Callable[[], Decision | None],
    *,
    wait_s: float = DECISION_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    step_s: float = 1.0,
    stopped: Callable[[], bool] = lambda: False,
) -> SharedLoad | None:
    """The shared load the launcher sets MPS limits from: ``read()``'s (the job's
    decision.json), read again every ``step_s`` for up to ``wait_s`` while Slurm gave the
    job an MPS share (:data:`MPS_THREADS` set) and the decision names no MPS load yet.
    None when none comes (the job then runs under Slurm's thread percentage alone, with no
    memory limit) or when the job is not an MPS job; it stops waiting once ``stopped()``."""
    waited = 0.0
    while True:
        load = shared_load(read())
        if load is not None or MPS_THREADS not in env or waited >= wait_s or stopped():
            return load
        sleep(step_s)
        waited += step_s


class StopTrap:
    """Remembers the first USR1/TERM and passes ``forward`` on to the child process, from
    :meth:`install` to :meth:`restore`. The launcher installs it first thing: a stop
    signal that comes before the training started (while it reads its decision, say) ends
    the launch with 75 instead of killing it, and nothing is lost (Python's own start, a
    fraction of a second, is the only window left)."""

    def __init__(self, forward: signal.Signals = signal.SIGTERM) -> None:
        self.forward = forward
        self.signalled: int | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self._old: dict[signal.Signals, object] = {}

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled is None:
            self.signalled = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(self.forward)

    def stopped(self) -> bool:
        return self.signalled is not None

    def install(self) -> StopTrap:
        self._old = {s: signal.signal(s, self) for s in (signal.SIGUSR1, signal.SIGTERM)}
        return self

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._old = {}


def supervise(
    command: Sequence[str],
    env: Mapping[str, str],
    forward: signal.Signals = signal.SIGTERM,
    child_ignores: Sequence[signal.Signals] = (),
    trap: StopTrap | None = None,
) -> tuple[int, int | None]:
    """Run ``command`` in the background, passing ``forward`` on for each USR1/TERM, and
    wait: its exit status (128 + N when signal N killed it) and the first signal seen
    (also one ``trap``, installed and later restored by the caller, saw before; without
    one, a trap of its own is installed for the run). The child starts with
    ``child_ignores`` ignored (inherited through exec; a program that installs its own
    handler, like the trainer, still gets them)."""

    def ignore() -> None:
        for s in child_ignores:
            signal.signal(s, signal.SIG_IGN)

    own = trap is None
    if trap is None:
        trap = StopTrap().install()
    trap.forward = forward
    try:
        trap.child = subprocess.Popen(
            list(command), env=dict(env), preexec_fn=ignore if child_ignores else None
        )
        if trap.signalled is not None:  # a signal arrived while starting
            trap.child.send_signal(forward)
        while True:
            try:
                code = trap.child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
    finally:
        if own:
            trap.restore()
    return (code if code >= 0 else 128 - code), trap.signalled


def run_training(
    command: Sequence[str],
    env: Mapping[str, str],
    workdir: str,
    forward: signal.Signals = signal.SIGTERM,
    trap: StopTrap | None = None,
) -> int:
    """Run ``command`` (:func:`supervise`, passing ``forward`` on) and map the outcome to
    the launcher's exit status. Stopped (``trap`` saw USR1/TERM) before the training
    started, it starts nothing: it writes the checkpoint marker (the last checkpoint is
    current: nothing ran since) and asks to be requeued. Stopped later, it asks to be
    requeued in every case, and says "checkpointed" only when the trainer wrote the marker
    in this run (after its checkpoint, as it exits 75): a trainer killed before it
    checkpointed (torchrun's shutdown timeout, :data:`SHUTDOWN_TIMEOUT_S`) resumes from
    its last checkpoint, and the launcher says so."""
    marker = Path(workdir) / CHECKPOINT_MARKER
    if trap is not None and trap.stopped():
        write_atomic(marker, b"stopped before the training started\n")
        print(
            f"icefrog launch: stopped before the training started; exiting "
            f"{REQUEUE_EXIT_CODE} (requeue me)",
            file=sys.stderr,
        )
        return REQUEUE_EXIT_CODE
    marker.unlink(missing_ok=True)
    code, signalled = supervise(command, env, forward, trap=trap)
    if marker.exists():
        print(
            f"icefrog launch: checkpointed; exiting {REQUEUE_EXIT_CODE} (requeue me)",
            file=sys.stderr,
        )
        return REQUEUE_EXIT_CODE
    if signalled is not None:
        print(
            f"icefrog launch: stopped by signal {signalled}, but the training ended (status "
            f"{code}) without a checkpoint since: it resumes from its last checkpoint; "
            f"exiting {REQUEUE_EXIT_CODE} (requeue me)",
            file=sys.stderr,
        )
        return REQUEUE_EXIT_CODE
    return code


def environ() -> dict[str, str]:
    """The process environment (read here, at the edge, and nowhere else in launch)."""
    return dict(os.environ)
