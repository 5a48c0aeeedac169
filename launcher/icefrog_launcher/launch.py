"""``icefrog launch``: run the training script under torchrun inside a Slurm allocation.

Pure parts (tested with plain dicts for the environment): :func:`layout_from_env` reads
the job's :class:`NodeLayout` (nodes, processes per node) from the variables Slurm gives the
batch script, :func:`build_command` turns it into the torchrun (or ``srun ... torchrun``
across nodes) command line. The impure part, :func:`run_training`, starts that command in
the background and traps USR1/TERM.

Exit status of ``icefrog launch``:

- ``0``: the trainer finished (target reached or max epochs ran out; the ``finished``
  report says which);
- :data:`REQUEUE_EXIT_CODE` (75, ``EX_TEMPFAIL``): "requeue me". The trainers checkpointed
  and stopped because the launcher got USR1 or TERM, or because the controller's decision
  asked for a GPU count different from the one running (rank 0 writes the checkpoint
  marker ``<workdir>/checkpointed``, icefrog_slurm.runfiles, which the controller also
  watches);
- anything else: the training failed (torchrun's status).

Signals: Slurm (``scancel --batch --signal=USR1``, ``--signal=B:USR1@60``) signals the batch
shell, which passes it on to the launcher (``icefrog submit``'s script). torchrun's agent
dies on an unhandled USR1, so on one node the launcher sends torchrun TERM in every case;
torchrun forwards TERM to the trainers, whose handler checkpoints at the next step
boundary and exits. Across nodes the launcher sends ``srun`` USR1 instead: srun forwards
USR1 to the step and keeps it, whereas TERM makes srun kill the step ("forcing job
termination": the tasks are SIGKILLed after KillWait and never checkpoint). slurmstepd
delivers the forwarded USR1 to every process of the step, torchrun's agent included, so
each node's task is :mod:`icefrog_launcher.relay`: it starts torchrun with USR1 ignored (the
trainers install their own handler) and turns the USR1 it gets itself into TERM for
torchrun, for a Slurm that signals only the task's own process.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from icefrog_slurm.errors import InputError
from icefrog_slurm.runfiles import CHECKPOINT_MARKER

REQUEUE_EXIT_CODE = 75  # sysexits EX_TEMPFAIL: checkpointed, please requeue
DEFAULT_PORT = 29500
# Exported (=1) by the batch script ``icefrog submit`` writes: the job was submitted to the
# controller. For the job side only: without it the launcher prints the notice below and
# tells the trainer (JobConfig.managed, the same variable) to read no decision.json. The
# controller itself adopts a job only by its Slurm record (the icefrog tag), so exporting
# it in a plain sbatch job gains nothing but the reading of the job's own workdir's file.
MANAGED_ENV = "ICEFROG_MANAGED"


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


def stop_signal(layout: NodeLayout) -> signal.Signals:
    """What the launcher sends its child to stop the trainers: TERM to torchrun on one
    node; USR1 to ``srun`` across nodes (srun passes USR1 on to the relays; see the
    module docstring)."""
    return signal.SIGTERM if layout.nnodes == 1 else signal.SIGUSR1


def child_env(
    env: Mapping[str, str], layout: NodeLayout, extra: Mapping[str, str]
) -> dict[str, str]:
    """The environment of torchrun: the caller's, the device mapping and the job config."""
    out = dict(env)
    if layout.cuda_visible_devices is not None:
        out["CUDA_VISIBLE_DEVICES"] = layout.cuda_visible_devices
    out.update(extra)
    return out


class _Trap:
    """Remembers the first USR1/TERM and passes ``forward`` on to the child process."""

    def __init__(self, forward: signal.Signals) -> None:
        self.forward = forward
        self.signalled: int | None = None
        self.child: subprocess.Popen[bytes] | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled is None:
            self.signalled = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(self.forward)


def supervise(
    command: Sequence[str],
    env: Mapping[str, str],
    forward: signal.Signals = signal.SIGTERM,
    child_ignores: Sequence[signal.Signals] = (),
) -> tuple[int, int | None]:
    """Run ``command`` in the background, passing ``forward`` on for each USR1/TERM, and
    wait: its exit status (128 + N when signal N killed it) and the first signal seen.
    The child starts with ``child_ignores`` ignored (inherited through exec; a program
    that installs its own handler, like the trainer, still gets them)."""

    def ignore() -> None:
        for s in child_ignores:
            signal.signal(s, signal.SIG_IGN)

    trap = _Trap(forward)
    old = {s: signal.signal(s, trap) for s in (signal.SIGUSR1, signal.SIGTERM)}
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
        for s, handler in old.items():
            signal.signal(s, handler)
    return (code if code >= 0 else 128 - code), trap.signalled


def run_training(
    command: Sequence[str],
    env: Mapping[str, str],
    workdir: str,
    forward: signal.Signals = signal.SIGTERM,
) -> int:
    """Run ``command`` (:func:`supervise`, passing ``forward`` on) and map the outcome to
    the launcher's exit status."""
    marker = Path(workdir) / CHECKPOINT_MARKER
    marker.unlink(missing_ok=True)
    code, signalled = supervise(command, env, forward)
    if signalled is not None or marker.exists():
        print(
            f"icefrog launch: checkpointed; exiting {REQUEUE_EXIT_CODE} (requeue me)",
            file=sys.stderr,
        )
        return REQUEUE_EXIT_CODE
    return code


def environ() -> dict[str, str]:
    """The process environment (read here, at the edge, and nowhere else in launch)."""
    return dict(os.environ)
