"""``icefrog squeue``: the active icefrog jobs and the controller's latest decision for each.

Options follow squeue: ``-u USER[,USER]``, ``-j ID[,ID]`` (icefrog id or any Slurm job id
of a job's chain), ``-t STATE[,STATE]`` (default: pending and running; ``all``), ``-h``
(no header), ``-o/--format`` (comma list of field names, ``%N`` widths as in sacct),
``--json``, ``--helpformat``. Fields: ``report/squeue.py``.
"""

from __future__ import annotations

import argparse

from icefrog_slurm.commands import storeargs
from icefrog_slurm.commands.storeargs import (
    add_store_arguments,
    open_store,
    print_json,
    print_lines,
)
from icefrog_slurm.domain.records import ACTIVE_STATES
from icefrog_slurm.report import squeue
from icefrog_slurm.report.queries import read_queue
from icefrog_slurm.report.select import JobFilter, parse_ids, parse_states, parse_users
from icefrog_slurm.report.table import field_index, parse_format, render_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # squeue's -h is --noheader: a group made with the "resolve" handler takes -h from
    # argparse's help (--help stays).
    parser.conflict_handler = "resolve"
    output = parser.add_argument_group("output")
    output.add_argument("-h", "--noheader", action="store_true", help="no header line")
    add_store_arguments(parser)
    parser.add_argument("-u", "--user", metavar="USER_LIST", help="user names or uids")
    parser.add_argument("-j", "--jobs", metavar="JOB_ID_LIST", help="icefrog or Slurm job ids")
    parser.add_argument(
        "-t", "--states", metavar="STATE_LIST", help="job states (default pending,running; all)"
    )
    parser.add_argument(
        "-o", "--format", default=squeue.DEFAULT_FORMAT, help="comma list of fields, FIELD%%N"
    )
    parser.add_argument("--json", action="store_true", help="every field of each job as JSON")
    parser.add_argument("--helpformat", action="store_true", help="list the fields")


def run(args: argparse.Namespace) -> int:
    if args.helpformat:
        print_lines(f"{f.name:<18}{f.help}" for f in squeue.FIELDS)
        return 0
    columns = parse_format(args.format, field_index(squeue.FIELDS), option="--format")
    flt = JobFilter(
        users=parse_users(args.user, option="--user"),
        ids=parse_ids(args.jobs, option="--jobs"),
        states=(
            frozenset(ACTIVE_STATES)
            if args.states is None
            else parse_states(args.states, option="--states")
        ),
    )
    store = open_store(args)
    try:
        t = storeargs.now()
        rows = [squeue.QueueRow(queued=q, now=t) for q in read_queue(store, flt, now=t)]
    finally:
        store.close()
    if args.json:
        print_json({"jobs": [squeue.queue_json(r) for r in rows]})
    else:
        print_lines(render_table(columns, rows, header=not args.noheader, squeue_style=True))
    return 0
