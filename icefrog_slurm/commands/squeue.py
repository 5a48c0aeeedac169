"""``icefrog squeue``: the active icefrog jobs and the controller's latest decision for each.

Options follow squeue: ``-u USER[,USER]``, ``--me``, ``-j ID[,ID]`` (icefrog id or any
Slurm job id of a job's chain), ``-t STATE[,STATE]`` (default: pending and running;
``all``), ``-n NAME[,NAME]``, ``-p PARTITION[,PARTITION]``, ``-h`` (no header),
``-o/--format`` (comma list of field names, ``%N`` widths as in sacct; or squeue's letters,
``%.18i %.8u %R``: ``report/squeue.LETTERS``), ``-O/--Format`` (squeue's
``name[:[.][size][suffix]]``), ``-S/--sort [+|-]FIELD[,...]``, ``-i/--iterate SECONDS``
(print again every SECONDS until interrupted, a time stamp above each header), ``--json``
(Slurm's envelope), ``--helpformat``. Without ``-o``/``-O`` the format comes from
``SQUEUE_FORMAT2`` (``-O`` syntax), else ``SQUEUE_FORMAT`` (``-o`` syntax), else the
default. Fields: ``report/squeue.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime

from icefrog_slurm.commands import downnotice, storeargs
from icefrog_slurm.commands.reportview import env_value, report_view
from icefrog_slurm.commands.storeargs import (
    add_store_arguments,
    open_store,
    print_json,
    print_lines,
)
from icefrog_slurm.domain.records import ACTIVE_STATES
from icefrog_slurm.errors import InputError
from icefrog_slurm.report import squeue
from icefrog_slurm.report.envelope import envelope
from icefrog_slurm.report.queries import read_queue
from icefrog_slurm.report.select import (
    JobFilter,
    parse_ids,
    parse_names,
    parse_partitions,
    parse_states,
    parse_users,
)
from icefrog_slurm.report.table import (
    Column,
    field_index,
    parse_format,
    parse_letter_format,
    parse_long_format,
    parse_sort,
    render_table,
    sort_rows,
)

MAX_ITERATE_S = 86400


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # squeue's -h is --noheader: a group made with the "resolve" handler takes -h from
    # argparse's help (--help stays).
    parser.conflict_handler = "resolve"
    output = parser.add_argument_group("output")
    output.add_argument("-h", "--noheader", action="store_true", help="no header line")
    add_store_arguments(parser)
    parser.add_argument("-u", "--user", metavar="USER_LIST", help="user names or uids")
    parser.add_argument("--me", action="store_true", help="my jobs (as -u with my uid)")
    parser.add_argument("-j", "--jobs", metavar="JOB_ID_LIST", help="icefrog or Slurm job ids")
    parser.add_argument(
        "-t", "--states", metavar="STATE_LIST", help="job states (default pending,running; all)"
    )
    parser.add_argument("-n", "--name", metavar="NAME_LIST", help="job names")
    parser.add_argument("-p", "--partition", metavar="PARTITION_LIST", help="partitions")
    style = parser.add_mutually_exclusive_group()
    style.add_argument("-o", "--format", help="comma list of fields, FIELD%%N")
    style.add_argument("-O", "--Format", help="comma list of fields, FIELD[:[.][SIZE][SUFFIX]]")
    parser.add_argument("-S", "--sort", metavar="SORT_LIST", help="[+|-]FIELD, comma list")
    parser.add_argument("-i", "--iterate", metavar="SECONDS", help="print again every SECONDS")
    parser.add_argument("--json", action="store_true", help="every field of each job as JSON")
    parser.add_argument("--helpformat", action="store_true", help="list the fields")


def _columns(args: argparse.Namespace) -> list[Column[squeue.QueueRow]]:
    fields = field_index(squeue.FIELDS)
    if args.Format is not None:
        return parse_long_format(args.Format, fields, option="--Format")
    if args.format is not None:
        return _short_format(args.format, "--format")
    if (text := env_value("SQUEUE_FORMAT2")) is not None:
        return parse_long_format(text, fields, option="SQUEUE_FORMAT2")
    if (text := env_value("SQUEUE_FORMAT")) is not None:
        return _short_format(text, "SQUEUE_FORMAT")
    return parse_format(squeue.DEFAULT_FORMAT, fields, option="--format")


def _short_format(text: str, option: str) -> list[Column[squeue.QueueRow]]:
    """``-o``: squeue's letters when it starts with ``%`` (``%.18i %.8u %R``), else icefrog
    field names (``JobID,User%8``)."""
    fields = field_index(squeue.FIELDS)
    if text.lstrip().startswith("%"):
        return parse_letter_format(text, squeue.LETTERS, fields, option=option)
    return parse_format(text, fields, option=option)


def _iterate(text: str | None) -> int | None:
    if text is None:
        return None
    value = text.strip()
    digits = value.isascii() and value.isdigit() and len(value) <= 6
    if not digits or not 1 <= int(value) <= MAX_ITERATE_S:
        raise InputError(f"--iterate {text[:40]!r}: give whole seconds, 1 to {MAX_ITERATE_S}")
    return int(value)


def run(args: argparse.Namespace) -> int:
    if args.helpformat:
        print_lines(f"{f.name:<18}{f.help}" for f in squeue.FIELDS)
        return 0
    columns = _columns(args)
    keys = (
        None
        if args.sort is None
        else parse_sort(args.sort, field_index(squeue.FIELDS), option="--sort")
    )
    every = _iterate(args.iterate)
    users = parse_users(args.user, option="--user")
    if args.me:
        users = users | {str(os.getuid())}
    t = storeargs.now()
    view = report_view(args, now=t)
    flt = JobFilter(
        users=users,
        ids=parse_ids(args.jobs, option="--jobs"),
        states=(
            frozenset(ACTIVE_STATES)
            if args.states is None
            else parse_states(args.states, option="--states")
        ),
        names=parse_names(args.name, option="--name"),
        partitions=parse_partitions(args.partition, option="--partition"),
        partition=view.partition,
        owner_uid=view.owner_uid,
    )
    while True:
        store = open_store(args)
        try:
            downnotice.warn_if_down(store, now=t)
            rows = [
                squeue.QueueRow(queued=q, now=t, partition=view.partition)
                for q in read_queue(store, flt, now=t)
            ]
        finally:
            store.close()
        if keys is not None:
            rows = sort_rows(rows, keys)
        if args.json:
            print_json(envelope([squeue.queue_json(r) for r in rows]))
        else:
            if every is not None and not args.noheader:  # squeue -i: a time stamp each time
                print_lines([datetime.fromtimestamp(t).strftime("%a %b %d %H:%M:%S %Y")])
            print_lines(render_table(columns, rows, header=not args.noheader, squeue_style=True))
        if every is None:
            return 0
        print_lines([""])
        sys.stdout.flush()
        time.sleep(every)
        t = storeargs.now()
