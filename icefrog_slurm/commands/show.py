"""``icefrog show job ID``: one job's figures, trajectory and recent Slurm actions.

``ID`` is an icefrog job id or any Slurm job id of the job's chain (``--slurm``: only a
Slurm job id). What is printed: ``report/show.py``. Under ``[reports] private`` a user
other than root or an operator gets for another user's job the answer of a job that does
not exist (``commands/reportview.py``).
"""

from __future__ import annotations

import argparse

from icefrog_slurm.commands import storeargs
from icefrog_slurm.commands.reportview import report_view
from icefrog_slurm.commands.storeargs import (
    add_store_arguments,
    open_store,
    print_json,
    print_lines,
)
from icefrog_slurm.errors import InputError
from icefrog_slurm.report.queries import read_job
from icefrog_slurm.report.select import parse_id
from icefrog_slurm.report.show import show_json, show_lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="show_what", metavar="WHAT", required=True)
    job = sub.add_parser("job", help="one job's trajectory, Slurm id chain and actions")
    job.add_argument("id", metavar="ID", help="icefrog job id or a Slurm job id of its chain")
    add_store_arguments(job)
    job.add_argument("--slurm", action="store_true", help="ID is a Slurm job id")
    job.add_argument(
        "--actions", type=int, default=10, metavar="N", help="recent Slurm actions (10)"
    )
    job.add_argument("--json", action="store_true", help="everything as JSON")
    job.set_defaults(_parser=job)  # an unknown option prints this usage


def run(args: argparse.Namespace) -> int:
    ident = parse_id(args.id.strip(), option="ID")
    if args.actions < 0:
        raise InputError(f"--actions {args.actions}: must be 0 or more")
    t = storeargs.now()
    view = report_view(args, now=t)
    store = open_store(args)
    try:
        detail = read_job(store, ident, slurm_id=args.slurm, owner_uid=view.owner_uid)
    finally:
        store.close()
    if args.json:
        print_json(show_json(detail, now=t, actions=args.actions))
    else:
        print_lines(show_lines(detail, now=t, actions=args.actions))
    return 0
