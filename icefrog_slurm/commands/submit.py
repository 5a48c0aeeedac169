"""``icefrog submit [launch options] -- train.py ARGS``: write a job's batch script and submit
it held, like ``sbatch`` (it prints ``Submitted batch job <id>``).

The script (:func:`batch_script`, pure) runs ``icefrog launch`` in the background and
``wait``s for it, with traps that pass USR1 and TERM on: bash runs a trap only when its
foreground child returns, so a foreground launcher would never see the controller's
``scancel --batch --signal=USR1`` (see docs/user-guide.md). It sets PATH (and PYTHONPATH,
when set here) itself, because a job the controller resubmits as its owner gets a minimal
environment.

Submission goes through the Slurm backend (``SlurmCliBackend.submit_held``: ``sbatch --hold
--requeue``, the job name, output path, working directory, the comment ``icefrog:<key>``
with a fresh key, ``--gres=gpu:<min GPUs>`` on one node, and the host memory and cores per
GPU when the user or the ``[submit]`` settings give them; else slurm.conf's ``DefMemPerGPU``
and ``DefCpuPerGPU`` apply): the controller decides the real resources and releases it.
Then the job's declaration is delivered as the ``register`` report (seq 0) into the
controller's inbox, signed with munge, so the controller knows the held job before it
ever runs. The model's layers and the epoch size are unknown until the
trainer starts and registers again with the measured ones; until then the job declares
:data:`UNKNOWN_LAYERS` (one block of unit cost: nothing can be frozen) and one sample an
epoch. If registering fails the job is cancelled.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from icefrog_slurm import declaration, security
from icefrog_slurm.commands import downnotice
from icefrog_slurm.commands.db import DEFAULT_CONFIG
from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.protocol import PROTOCOL_VERSION, Envelope
from icefrog_slurm.settings import Settings, load_settings
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.port import SubmitRequest

SCRIPT_NAME = "job.sbatch"
UNKNOWN_LAYERS = (1.0,)
"""Layer FLOPs and parameter bytes a job declares before its trainer has measured them."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "The job is submitted held; the icefrog controller gives it its GPUs and releases it."
    )
    declaration.add_arguments(parser)
    parser.add_argument(
        "--job-name", default=None, type=_nonempty, help="job name (default: the script's stem)"
    )
    parser.add_argument(
        "--workdir",
        default=None,
        type=_nonempty,
        help="the job's own folder: script, checkpoints, decision.json (default ./<job name>)",
    )
    parser.add_argument(
        "--output",
        default=None,
        type=_nonempty,
        help="Slurm output file (default <workdir>/slurm-%%j.out)",
    )
    parser.add_argument("--seed", type=int, default=0, help="data order and RNG seed")
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        type=_nonempty,
        help=f"controller settings: inbox and partition (default {DEFAULT_CONFIG} if it exists)",
    )
    parser.add_argument(
        "--inbox", default=None, type=_nonempty, help="the controller's report inbox (overrides)"
    )
    parser.add_argument(
        "--partition", default=None, type=_nonempty, help="Slurm partition (overrides)"
    )
    parser.add_argument(
        "--mem-per-gpu",
        metavar="SIZE",
        default=None,
        type=mem_size,
        help="host memory per GPU, megabytes or with K/M/G/T as sbatch "
        "(default [submit] mem_per_gpu_mb, else slurm.conf's DefMemPerGPU)",
    )
    parser.add_argument(
        "--cpus-per-gpu",
        metavar="N",
        default=None,
        type=cpu_count,
        help="cores per GPU (default [submit] cpus_per_gpu, else slurm.conf's DefCpuPerGPU)",
    )
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- train.py ARGS...")


MAX_MEM_PER_GPU_MB = 64 * 1024 * 1024
"""64 TB: no node has more; a larger size is a typo, refused before Slurm sees it."""
MAX_CPUS_PER_GPU = 4096
_SIZE = re.compile(r"^([0-9]{1,12})([KMGT]?)$")
_UNIT_KB = {"K": 1, "": 1024, "M": 1024, "G": 1024**2, "T": 1024**3}


def mem_size(text: str) -> int:
    """``--mem-per-gpu``: sbatch's size syntax (``900``, ``900M``, ``80G``: megabytes
    unless a K/M/G/T suffix says otherwise) -> whole megabytes, at least 1."""
    m = _SIZE.match(text.strip().upper()) if text.isascii() else None
    if m is None:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r}: give a size like 900 (MB), 900M, 80G or 1T"
        )
    mb = -(-int(m.group(1)) * _UNIT_KB[m.group(2)] // 1024)
    if not 1 <= mb <= MAX_MEM_PER_GPU_MB:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be 1M to 64T")
    return mb


def cpu_count(text: str) -> int:
    """``--cpus-per-gpu``: a whole number of cores, 1 to 4096."""
    if not (text.isascii() and text.isdigit() and len(text) <= 5):
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: give a whole number of cores")
    if not 1 <= int(text) <= MAX_CPUS_PER_GPU:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 1 to {MAX_CPUS_PER_GPU}")
    return int(text)


def _nonempty(text: str) -> str:
    """An option given as '' is an error, never its default."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def batch_script(*, launch: list[str], env: dict[str, str], header: str = "") -> str:
    """The batch script: ``launch`` (an ``icefrog launch`` argv) in the background, signals
    passed on, and the launcher's exit status as the job's (75: checkpointed, requeue me).
    Its output file is appended to (``--open-mode=append``): a requeued job's runs share
    one Slurm job id, hence one file, and Slurm would otherwise write each run over it."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    return (
        "#!/bin/bash\n"
        "#SBATCH --open-mode=append\n"
        f"{header}"
        "# USR1/TERM go to the launcher, which makes the trainers checkpoint and exit.\n"
        f"{exports}"
        "pid=\n"
        "trap 'kill -USR1 \"$pid\" 2>/dev/null' USR1\n"
        "trap 'kill -TERM \"$pid\" 2>/dev/null' TERM\n"
        f"{shlex.join(launch)} &\n"
        "pid=$!\n"
        "# wait returns early when a trap runs: wait again until the launcher is gone\n"
        'while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done\n'
        'wait "$pid"\n'
        "exit $?\n"
    )


def _settings(args: argparse.Namespace) -> Settings:
    if args.config:
        return load_settings(args.config)
    if Path(DEFAULT_CONFIG).is_file():
        return load_settings(DEFAULT_CONFIG)
    return Settings()


def _job_name(args: argparse.Namespace, script: list[str]) -> str:
    name = args.job_name or Path(script[0]).stem
    if not _NAME.match(name):
        raise InputError(
            f"--job-name: {name!r}: use 1-64 letters, digits, '_', '.', '-' (start alphanumeric)"
        )
    return name


def _launcher_env() -> dict[str, str]:
    """PATH with this Python's bin folder first (icefrog, torchrun), and PYTHONPATH if set."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def _write_script(workdir: Path, text: str) -> Path:
    """The batch script in the job's folder (made when missing)."""
    path = workdir / SCRIPT_NAME
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise InputError(
            f"--workdir {workdir}: cannot write {SCRIPT_NAME}: {exc.strerror}"
        ) from None
    return path


def run(args: argparse.Namespace) -> int:
    script = list(args.script)
    if script and script[0] == "--":
        script = script[1:]
    if not script:
        raise InputError("submit: give the training script after '--' (e.g. -- train.py)")
    declared = declaration.from_args(args)
    name = _job_name(args, script)
    settings = _settings(args)
    inbox = os.path.abspath(args.inbox or settings.inbox.dir)
    if not os.path.isdir(inbox):
        raise InputError(f"inbox {inbox}: no such folder (is the controller set up? see --config)")
    # symlinks resolved (a /home that is a link): the controller writes decision.json only
    # into a folder it reaches without following any link
    workdir = Path(os.path.realpath(args.workdir or name))
    if not Path(script[0]).is_absolute() and Path(script[0]).is_file():
        script[0] = os.path.abspath(script[0])
    launch = [sys.executable, "-m", "icefrog_slurm", "launch", *declared.launch_options()]
    launch += [f"--workdir={workdir}", f"--inbox={inbox}", f"--job-name={name}"]
    launch += [f"--seed={args.seed}", "--", *script]
    key = uuid.uuid4().hex[:12]
    header = f"# icefrog job {name} (key {key}), written by icefrog submit\n"
    path = _write_script(workdir, batch_script(launch=launch, env=_launcher_env(), header=header))
    request = SubmitRequest(
        script=str(path),
        tag=IcefrogTag(key=key),
        name=name,
        gres=Gres("gpu", declared.gpus[0]),
        partition=args.partition or settings.slurm.partition,
        output=os.path.abspath(args.output) if args.output else str(workdir / "slurm-%j.out"),
        workdir=str(workdir),
        mem_per_gpu_mb=_first(args.mem_per_gpu, settings.submit.mem_per_gpu_mb),
        cpus_per_gpu=_first(args.cpus_per_gpu, settings.submit.cpus_per_gpu),
    )
    backend = SlurmCliBackend()
    job_id = backend.submit_held(request=request)
    try:
        register(inbox=inbox, slurm_job_id=job_id, name=name, declared=declared)
    except (IcefrogError, OSError) as exc:
        backend.cancel(job_id=job_id)
        raise IcefrogError(f"job {job_id} cancelled: cannot register it: {exc}") from exc
    print(f"Submitted batch job {job_id}")
    downnotice.warn_for_submit(config=args.config)  # a held job waits for the controller
    return 0


def _first(given: int | None, default: int | None) -> int | None:
    return given if given is not None else default


def register(
    *, inbox: str, slurm_job_id: str, name: str, declared: declaration.Declaration
) -> Path:
    """Drop the signed ``register`` report (seq 0) of a held job into the inbox, with the
    placeholders of the module docstring for what only the trainer can measure."""
    spec = declared.job_spec(
        samples_per_epoch=1, layer_flops=UNKNOWN_LAYERS, layer_param_bytes=UNKNOWN_LAYERS
    )
    envelope = Envelope(
        version=PROTOCOL_VERSION,
        kind="register",
        slurm_job_id=slurm_job_id,
        job_name=name,
        seq=0,
        time=time.time(),
        payload=json.loads(json.dumps(asdict(spec))),
    )
    return security.drop_report(inbox, security.sign(envelope))
