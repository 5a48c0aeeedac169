"""``icefrog sacct``: accounting of icefrog jobs, running and finished, like sacct.

Options follow sacct: ``-o/--format`` (comma list of fields, ``%N``/``%-N`` widths),
``-P/--parsable2``, ``-p/--parsable``, ``-n/--noheader``, ``--json``, ``-S/--starttime``,
``-E/--endtime`` (formats: ``report/timefmt.parse_time``), ``-u USER[,USER]``, ``-j
ID[,ID]`` (icefrog id or any Slurm job id of a job's chain), ``-s/--state``,
``-e/--helpformat``, ``--name NAME[,NAME]``, ``-r/--partition PARTITION[,PARTITION]``,
``--delimiter TEXT`` (with ``-p``/``-P``), ``-X/--allocations`` (accepted: an icefrog job is
one row, it has no step rows to hide). ``-A/--accounts`` is refused with exit 2: icefrog
records no Slurm account. Without ``-o`` the fields come from ``SACCT_FORMAT``, else the
default. As in sacct, the window starts at 00:00 today unless ``-S`` or ``-j`` is given,
and ends now unless ``-E`` is; a job is listed when its life overlaps it. Whose jobs, as in
sacct: those of ``-u`` when given; else everyone's with ``-a/--allusers``, with ``-j``, or
for root and the report operators (``commands/reportview.py``); else the caller's own.
Under ``[reports] private`` a user who is not an operator sees only his own whatever he
asks (sacct's ``-a`` under ``PrivateData=jobs``).
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime

from icefrog_slurm.commands import storeargs
from icefrog_slurm.commands.reportview import ReportView, env_value, report_view
from icefrog_slurm.commands.storeargs import (
    add_store_arguments,
    open_store,
    print_json,
    print_lines,
)
from icefrog_slurm.errors import InputError
from icefrog_slurm.report import sacct
from icefrog_slurm.report.envelope import envelope
from icefrog_slurm.report.queries import read_accounting
from icefrog_slurm.report.select import (
    JobFilter,
    parse_ids,
    parse_names,
    parse_partitions,
    parse_states,
    parse_users,
)
from icefrog_slurm.report.table import field_index, parse_format, render_parsable, render_table
from icefrog_slurm.report.timefmt import parse_time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_store_arguments(parser)
    parser.add_argument("-u", "--user", metavar="USER_LIST", help="user names or uids")
    parser.add_argument("-j", "--jobs", metavar="JOB_ID_LIST", help="icefrog or Slurm job ids")
    parser.add_argument("-s", "--state", metavar="STATE_LIST", help="job states (default all)")
    parser.add_argument("-S", "--starttime", metavar="TIME", help="window start (00:00 today)")
    parser.add_argument("-E", "--endtime", metavar="TIME", help="window end (now)")
    parser.add_argument("--name", metavar="NAME_LIST", help="job names")
    parser.add_argument("-r", "--partition", metavar="PARTITION_LIST", help="partitions")
    parser.add_argument("-A", "--accounts", metavar="ACCOUNT_LIST", help="(refused: no accounts)")
    parser.add_argument("-X", "--allocations", action="store_true", help="(always: no steps)")
    parser.add_argument("-o", "--format", help="comma list of fields, FIELD%%N ($SACCT_FORMAT)")
    parser.add_argument("--delimiter", metavar="TEXT", help="separator of -p/-P ('|')")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("-P", "--parsable2", action="store_true", help="'|'-separated")
    out.add_argument("-p", "--parsable", action="store_true", help="'|'-separated, ending '|'")
    out.add_argument("--json", action="store_true", help="every field of each job as JSON")
    parser.add_argument("-n", "--noheader", action="store_true", help="no header lines")
    parser.add_argument(
        "-a", "--allusers", action="store_true", help="every user's jobs (default: your own)"
    )
    parser.add_argument("-e", "--helpformat", action="store_true", help="list the fields")


def _window(args: argparse.Namespace, t: float) -> tuple[float | None, float]:
    if args.starttime is not None:
        start: float | None = parse_time(args.starttime, now=t, option="--starttime")
    elif args.jobs is not None:
        start = None
    else:
        midnight = datetime.fromtimestamp(t).replace(hour=0, minute=0, second=0, microsecond=0)
        start = midnight.timestamp()
    end = t if args.endtime is None else parse_time(args.endtime, now=t, option="--endtime")
    return start, end


MAX_DELIMITER = 16


def _delimiter(text: str | None) -> str:
    if text is None:
        return "|"
    if not text or len(text) > MAX_DELIMITER or not text.replace("\t", "").isprintable():
        raise InputError(
            f"--delimiter {text[:40]!r}: give 1 to {MAX_DELIMITER} printable characters or tabs"
        )
    return text


def _users(args: argparse.Namespace, view: ReportView) -> frozenset[str]:
    """Whose jobs (module docstring): ``-u``'s users, else none (everyone's) or the
    caller's uid alone."""
    users = parse_users(args.user, option="--user")
    if users or args.allusers or args.jobs is not None or view.operator:
        return users
    return frozenset({str(os.getuid())})


def _format(args: argparse.Namespace) -> tuple[str, str]:
    if args.format is not None:
        return args.format, "--format"
    if (text := env_value("SACCT_FORMAT")) is not None:
        return text, "SACCT_FORMAT"
    return sacct.DEFAULT_FORMAT, "--format"


def run(args: argparse.Namespace) -> int:
    if args.helpformat:
        print_lines(f"{f.name:<15}{f.help}" for f in sacct.FIELDS)
        return 0
    if args.accounts is not None:
        raise InputError(
            "-A/--accounts: icefrog records no Slurm account per job; select with -u/--user"
        )
    text, option = _format(args)
    columns = sacct.sacct_columns(parse_format(text, field_index(sacct.FIELDS), option=option))
    delimiter = _delimiter(args.delimiter)
    t = storeargs.now()
    start, end = _window(args, t)
    view = report_view(args, now=t)
    flt = JobFilter(
        users=_users(args, view),
        ids=parse_ids(args.jobs, option="--jobs"),
        states=parse_states(args.state, option="--state"),
        start=start,
        end=end,
        names=parse_names(args.name, option="--name"),
        partitions=parse_partitions(args.partition, option="--partition"),
        partition=view.partition,
        owner_uid=view.owner_uid,
    )
    store = open_store(args)
    try:
        rows = [
            sacct.acct_row(f, now=t, partition=view.partition)
            for f in read_accounting(store, flt, now=t)
        ]
    finally:
        store.close()
    header = not args.noheader
    if args.json:
        print_json(envelope([sacct.acct_json(r) for r in rows]))
    elif args.parsable2 or args.parsable:
        print_lines(
            render_parsable(
                columns, rows, header=header, trailing=args.parsable, delimiter=delimiter
            )
        )
    else:
        print_lines(render_table(columns, rows, header=header))
    return 0
