"""The ``icefrog launch`` subcommand: parse the job's limits, build the torchrun command
from the Slurm allocation, run it, and exit 0, 75 (requeue me) or the failure status.

Registered by name in icefrog_slurm/cli.py; torch is never imported here.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
from functools import partial

from icefrog_launcher.config import JobConfig
from icefrog_launcher.decision import read_decision
from icefrog_launcher.launch import (
    DEFAULT_PORT,
    REQUEUE_EXIT_CODE,
    StopTrap,
    build_command,
    check_started_by_script,
    child_env,
    environ,
    is_managed,
    layout_from_env,
    mps_load,
    rendezvous_host,
    resolves,
    run_training,
    shutdown_env,
    stop_signal,
    unmanaged_notice,
)
from icefrog_slurm import declaration
from icefrog_slurm.extras import require, require_program


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"Exit status: 0 finished, {REQUEUE_EXIT_CODE} checkpointed and asks to be requeued, "
        "other: the training failed."
    )
    declaration.add_arguments(parser)
    parser.add_argument("--workdir", default=".", help="shared folder for checkpoints")
    parser.add_argument("--inbox", default="", help="controller's report inbox folder")
    parser.add_argument("--decision", default="", help="decision.json (default in workdir)")
    parser.add_argument("--job-name", default="", help="icefrog job name (default SLURM_JOB_NAME)")
    parser.add_argument("--seed", type=int, default=0, help="data order and RNG seed")
    parser.add_argument(
        "--procs-per-node", type=int, default=None, help="override processes per node"
    )
    parser.add_argument("--torchrun", default="torchrun", help="torchrun executable")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"c10d rendezvous port across nodes (default {DEFAULT_PORT} + job id %% 1000)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the command and environment only"
    )
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- train.py ARGS...")


def run(args: argparse.Namespace) -> int:
    trap = StopTrap().install()  # a USR1/TERM from here on checkpoints, never kills
    try:
        return _run(args, trap)
    finally:
        trap.restore()


def _run(args: argparse.Namespace, trap: StopTrap) -> int:
    env = environ()
    check_started_by_script(env)
    script = list(args.script)
    if script and script[0] == "--":
        script = script[1:]
    declared = declaration.from_args(args)
    config = JobConfig(
        gpus=declared.gpus,
        batch=declared.batch,
        max_frozen=declared.max_frozen,
        target=declared.target,
        max_epochs=declared.max_epochs,
        max_physical_epochs=declared.max_physical_epochs,
        parallelism=declared.parallelism,
        global_batch=declared.global_batch,
        workdir=os.path.abspath(args.workdir),
        inbox=os.path.abspath(args.inbox) if args.inbox else "",
        decision=os.path.abspath(args.decision) if args.decision else "",
        job_name=args.job_name or env.get("SLURM_JOB_NAME", "job"),
        slurm_job_id=env.get("SLURM_JOB_ID", "0"),
        seed=args.seed,
        managed=is_managed(env),
    )
    config.validate()
    layout = layout_from_env(env, args.procs_per_node)
    layout = rendezvous_host(layout, resolves, socket.gethostname())
    relay = [sys.executable, "-m", "icefrog_launcher.relay"]
    command = build_command(layout, script, torchrun=args.torchrun, port=args.port, relay=relay)
    extra = config.to_env() | shutdown_env(env)
    decision = config.decision_path
    read = partial(read_decision, decision)
    load = mps_load(env, read, stopped=trap.stopped) if config.managed else None
    child = child_env(env, layout, extra, load)
    if args.dry_run:  # the job's variables and what else it adds or changes (device, MPS)
        changed = {k: v for k, v in child.items() if env.get(k) != v}
        for key, value in sorted((extra | changed).items()):
            print(f"{key}={shlex.quote(value)}")
        print(shlex.join(command))
        return 0
    notice = unmanaged_notice(env)
    if notice is not None:
        print(notice, file=sys.stderr)
    # the training needs torch and its torchrun: say so in one line, not in torchrun's trace
    require("torch", "launcher", "the training", load=False)
    require_program(args.torchrun, "launcher", "the training", path=env.get("PATH"))
    os.makedirs(config.workdir, exist_ok=True)
    print(f"icefrog launch: {shlex.join(command)}", file=sys.stderr)
    sys.stdout.flush()
    return run_training(command, child, config.workdir, stop_signal(layout), trap)
