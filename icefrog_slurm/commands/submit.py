"""``icefrog submit [icefrog options] [sbatch options] SCRIPT [ARGS]``: write a job's batch
script and submit it held, like ``sbatch`` (it prints ``Submitted batch job <id>``, or the
id alone with ``--parsable``).

SCRIPT is a Python training script (``train.py``: the job runs ``icefrog launch -- train.py
ARGS``), or a batch script of bash with ``#SBATCH`` lines, whose body runs as the job and
starts training with the line ``icefrog launch -- train.py ARGS`` (docs/user-guide.md).
Options follow sbatch (``icefrog_slurm/slurm/sbatch_options.py``): those of SCRIPT's header
combined with the command line's, which win; an option the controller decides (GPUs,
nodes, features, tasks, hold...) is refused with its reason, and so is a partition other
than the controller's. The options kept (``--time``, ``--account``, ``--qos``...) are
written into the job's script as ``#SBATCH`` lines, so that every resubmission of that
script by the controller (as the owner, with ``sbatch``) applies them again; the
controller's own options go on its command line and win.

The script (:func:`batch_script`, pure) runs ``icefrog launch`` in the background and
``wait``s for it, with traps that pass USR1 and TERM on: bash runs a trap only when its
foreground child returns, so a foreground launcher would never see the controller's
``scancel --batch --signal=USR1`` (see docs/user-guide.md). In a batch script's body the
``icefrog`` shell function of the wrapper does the same for its ``icefrog launch`` line.

The job's environment is recorded in the script as ``export`` lines (``--export`` as
sbatch reads it: ALL by default, NONE, or a list), and sbatch runs with the same minimal
environment at submission as at the controller's resubmissions: every run of the job sees
the same variables. The script is written mode 0600 (it holds them). PATH starts with this
Python's bin folder (icefrog, torchrun); PYTHONPATH, when set here, is kept.

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

The inbox and partition come from ``--config``, else the controller's settings file when
the user may read it, else the site file every user may read (``ICEFROG_REPORTS_CONFIG``,
else ``/etc/icefrog/reports.toml``), else the defaults; a controller settings file the user
may not read, with no site file, is one line saying what to give instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from icefrog_slurm import declaration, security
from icefrog_slurm.commands import downnotice
from icefrog_slurm.commands.db import DEFAULT_CONFIG
from icefrog_slurm.commands.jobscript import (
    batch_script,
    job_environment,
    launcher_env,
    read_script,
    shell_options,
)
from icefrog_slurm.commands.storeargs import ENV_REPORTS_CONFIG, REPORTS_CONFIG
from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.protocol import PROTOCOL_VERSION, Envelope
from icefrog_slurm.settings import Settings, SlurmSettings, load_settings
from icefrog_slurm.slurm import sbatch_options
from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.port import SubmitRequest
from icefrog_slurm.slurm.sbatch_options import Given, Kind

SCRIPT_NAME = "job.sbatch"
UNKNOWN_LAYERS = (1.0,)
"""Layer FLOPs and parameter bytes a job declares before its trainer has measured them."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class _SubmitParser(argparse.ArgumentParser):
    """Splits the command line as sbatch does (``sbatch_options.parse``): icefrog's options
    and sbatch's before SCRIPT, then SCRIPT and its arguments. icefrog's own (and sbatch's
    that are icefrog's: ``-J``, ``-o``, ``-p``, ``-D``, ``--export``...) go to argparse;
    the others are kept as ``args.sbatch``, checked by :func:`run`."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        table = sbatch_options.Table([*self._own_specs(), *sbatch_options.SBATCH])
        error = None
        try:
            given, script = sbatch_options.parse(argv, table, where="command line")
        except InputError as exc:
            given, script, error = [], [], str(exc)
        own = [g.token() for g in given if g.spec.kind is Kind.ICEFROG]
        ns, extra = super().parse_known_args(own, namespace)
        ns.script = script
        ns.sbatch = [g for g in given if g.spec.kind is not Kind.ICEFROG]
        ns.sbatch_error = error
        return ns, extra

    def _own_specs(self) -> list[sbatch_options.Spec]:
        specs = []
        for action in self._actions:
            longs = [o[2:] for o in action.option_strings if o.startswith("--")]
            shorts = [o[1:] for o in action.option_strings if len(o) == 2]
            arg = "" if action.nargs == 0 else "="
            for name in longs:
                short = shorts[0] if shorts else ""
                specs.append(sbatch_options.Spec(name, short, arg, Kind.ICEFROG))
        return specs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.__class__ = _SubmitParser  # sbatch's option syntax (see _SubmitParser)
    parser.usage = "icefrog submit [icefrog options] [sbatch options] SCRIPT [ARGS...]"
    parser.epilog = (
        "SCRIPT: a Python training script, or a bash batch script with #SBATCH lines whose "
        "body runs 'icefrog launch -- train.py ARGS'. sbatch options (--time, --account, "
        "--qos, --mail-type...) are kept across the controller's resubmissions; those the "
        "controller decides (--gres, --nodes, --constraint, --ntasks, --hold...) are refused. "
        "The job is submitted held; the icefrog controller gives it its GPUs and releases it."
    )
    declaration.add_arguments(parser)
    parser.add_argument(
        "--job-name",
        "-J",
        default=None,
        type=_nonempty,
        help="job name (default: the script's stem)",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        type=_nonempty,
        help="the job's own folder: script, checkpoints, decision.json (default ./<job name>)",
    )
    parser.add_argument(
        "--chdir",
        "-D",
        default=None,
        type=_nonempty,
        help="where a batch script's body runs (default: the current folder, as sbatch)",
    )
    parser.add_argument(
        "--output",
        "-o",
        default=None,
        type=_nonempty,
        help="Slurm output file (default <workdir>/slurm-%%j.out)",
    )
    parser.add_argument(
        "--export",
        default=None,
        type=_nonempty,
        help="the job's environment as sbatch takes it: ALL (default), NONE, or "
        "[ALL,]NAME[=VALUE],...; recorded in the job's script",
    )
    parser.add_argument("--seed", type=int, default=0, help="data order and RNG seed")
    parser.add_argument(
        "--parsable", action="store_true", help="print the job id alone, as sbatch --parsable"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        type=_nonempty,
        help=f"controller settings: inbox and partition (default {DEFAULT_CONFIG} if you may "
        f"read it, else {REPORTS_CONFIG})",
    )
    parser.add_argument(
        "--inbox", default=None, type=_nonempty, help="the controller's report inbox (overrides)"
    )
    parser.add_argument(
        "--partition",
        "-p",
        default=None,
        type=_nonempty,
        help="the controller's Slurm partition, where its settings cannot be read (another "
        "one is refused)",
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


def _settings(args: argparse.Namespace) -> Settings:
    """The settings that give the inbox, the partition and [submit] (module docstring)."""
    if args.config:
        return _load(args.config, why="--config")
    site = os.environ.get(ENV_REPORTS_CONFIG) or REPORTS_CONFIG
    if _readable(DEFAULT_CONFIG):
        return load_settings(DEFAULT_CONFIG)
    if _readable(site):
        return _load(site, why="site settings")
    if not os.path.lexists(DEFAULT_CONFIG):
        return Settings()
    if not (args.inbox and args.partition):
        raise InputError(
            f"{DEFAULT_CONFIG} (controller settings): not readable by you: give --inbox DIR "
            f"and --partition NAME, or ask your administrator to set [inbox] dir and [slurm] "
            f"partition in {REPORTS_CONFIG} (docs/admin-guide.md)"
        )
    return Settings(slurm=SlurmSettings(partition=args.partition))  # the one given


def _readable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.R_OK)


def _load(path: str, *, why: str) -> Settings:
    if os.path.exists(path) and not os.access(path, os.R_OK):
        raise InputError(f"{path} ({why}): not readable by you")
    return load_settings(path)


def _job_name(given: str | None, script: list[str]) -> str:
    name = given or Path(script[0]).stem
    if not _NAME.fullmatch(name):
        raise InputError(
            f"--job-name: {name!r}: use 1-64 letters, digits, '_', '.', '-' (start alphanumeric)"
        )
    return name


def _checked(options: list[Given]) -> list[Given]:
    """``options``, once none is refused (``sbatch_options.refuse``, ``check_value``)."""
    for option in options:
        sbatch_options.refuse(option)
        sbatch_options.check_value(option)
    return options


def _last_each(options: Sequence[Given]) -> list[Given]:
    """One option a name, the last given (the command line's after the header's)."""
    last = {o.spec.name: o for o in options}
    return [o for o in options if last[o.spec.name] is o]


def _absolute(option: Given) -> Given:
    """``--error`` and ``--input`` relative to the folder you submit from, as ``--output``
    (sbatch would take them relative to the job's working directory, the workdir)."""
    value = option.value
    if option.spec.name not in ("error", "input") or not value or value.lower() == "none":
        return option
    return dataclasses.replace(option, value=os.path.abspath(value))


def _last(options: Sequence[Given], name: str) -> Given | None:
    found = [o for o in options if o.spec.name == name]
    return found[-1] if found else None


def _typed(option: Given | None, parse: Any) -> Any:
    """An icefrog option's value from a header or an SBATCH_ variable, checked by the same
    parser as on the command line."""
    if option is None or option.value is None:
        return None
    try:
        return parse(option.value)
    except argparse.ArgumentTypeError as exc:
        raise InputError(f"--{option.spec.name} ({option.where}): {exc}") from None


def run(args: argparse.Namespace) -> int:
    if args.sbatch_error:
        raise InputError(args.sbatch_error)
    # refused first, before a missing script is: --wrap says why it is refused
    given_here = _checked([*sbatch_options.environment_options(os.environ), *args.sbatch])
    script = list(args.script)
    if not script:
        raise InputError(
            "give the script to submit: a Python training script (train.py ARGS) or a "
            "batch script with #SBATCH lines"
        )
    path = Path(script[0])
    text = read_script(path) if path.is_file() else None
    shell = shell_options(path, text) if text is not None else None
    batch = shell is not None
    header = sbatch_options.read_header(text, path.name) if text is not None else []
    # sbatch's order: the script's header, its input variables, the command line
    options = [*_checked(header), *given_here]
    passed = [_absolute(o) for o in _last_each([o for o in options if o.spec.kind is Kind.PASS])]
    # icefrog's options from the header and SBATCH_ variables (the command line's: args)
    own = [o for o in options if o.spec.kind is Kind.ICEFROG]

    def given(name: str) -> Any:
        value = getattr(args, name.replace("-", "_"))
        last = _last(own, name)
        return value if value is not None or last is None else last.value

    def where(name: str) -> str:
        last = _last(own, name)
        cli = getattr(args, name.replace("-", "_")) is not None
        return "command line" if cli or last is None else last.where

    if not batch and given("chdir") is not None:
        raise InputError(
            "-D/--chdir: sets where a batch script's body runs; a Python script runs in --workdir"
        )
    declared = declaration.from_args(args)
    name = _job_name(given("job-name"), script)
    settings = _settings(args)
    partition = settings.slurm.partition
    if given("partition") not in (None, partition):
        raise InputError(
            f"--partition ({where('partition')}): {given('partition')!r}: the icefrog "
            f"controller plans the GPUs of partition {partition!r} alone: leave the option out"
        )
    inbox = os.path.abspath(args.inbox or settings.inbox.dir)
    if not os.path.isdir(inbox):
        raise InputError(f"inbox {inbox}: no such folder (is the controller set up? see --config)")
    if text is None:  # as sbatch, which cannot open it
        what = "not a regular file" if path.exists() else "no such file"
        raise InputError(f"{script[0]}: {what}: give the script to submit")
    # symlinks resolved (a /home that is a link): the controller writes decision.json only
    # into a folder it reaches without following any link
    workdir = Path(os.path.realpath(args.workdir or name))
    script[0] = os.path.abspath(script[0])
    mem = args.mem_per_gpu
    if mem is None:
        mem = _typed(_last(own, "mem-per-gpu"), mem_size)
    cpus = args.cpus_per_gpu
    if cpus is None:
        cpus = _typed(_last(own, "cpus-per-gpu"), cpu_count)
    env = launcher_env(job_environment(given("export"), os.environ))
    launch = [sys.executable, "-m", "icefrog_slurm", "launch", *declared.launch_options()]
    launch += [f"--workdir={workdir}", f"--inbox={inbox}", f"--job-name={name}"]
    launch += [f"--seed={args.seed}", "--"]
    key = uuid.uuid4().hex[:12]
    lines = sbatch_options.header_lines(passed)
    source = f" from {script[0]!r}" if batch else ""  # repr: no line break gets in
    lines += f"# icefrog job {name} (key {key}), written by icefrog submit{source}\n"
    if batch and text is not None:
        body = text.split("\n", 1)[1] if text.startswith("#!") and "\n" in text else text
        rundir = os.path.abspath(given("chdir") or os.getcwd())
        job = batch_script(
            launch=launch, env=env, header=lines, body=body, rundir=rundir, args=script[1:],
            shell=shell or "",
        )  # fmt: skip
    else:
        job = batch_script(launch=[*launch, *script], env=env, header=lines)
    path_written = _write_script(workdir, job)
    output = given("output")
    request = SubmitRequest(
        script=str(path_written),
        tag=IcefrogTag(key=key),
        name=name,
        gres=Gres("gpu", declared.gpus[0]),
        partition=partition,
        output=os.path.abspath(output) if output else str(workdir / "slurm-%j.out"),
        workdir=str(workdir),
        mem_per_gpu_mb=_first(mem, settings.submit.mem_per_gpu_mb),
        cpus_per_gpu=_first(cpus, settings.submit.cpus_per_gpu),
    )
    backend = SlurmCliBackend()
    job_id = backend.submit_held(request=request)
    try:
        register(inbox=inbox, slurm_job_id=job_id, name=name, declared=declared)
    except (IcefrogError, OSError) as exc:
        backend.cancel(job_id=job_id)
        raise IcefrogError(f"job {job_id} cancelled: cannot register it: {exc}") from exc
    parsable = args.parsable or _last(own, "parsable") is not None
    print(job_id if parsable else f"Submitted batch job {job_id}")
    downnotice.warn_for_submit(config=args.config)  # a held job waits for the controller
    return 0


def _write_script(workdir: Path, text: str) -> Path:
    """The batch script in the job's folder (made when missing), mode 0600: it holds the
    job's environment."""
    path = workdir / SCRIPT_NAME
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(text)
    except OSError as exc:
        raise InputError(
            f"--workdir {workdir}: cannot write {SCRIPT_NAME}: {exc.strerror}"
        ) from None
    return path


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
