"""What a report command knows of its caller and site: privacy, partition, time style, the
``*_FORMAT`` environment variables.

- Privacy (``[reports] private``, Slurm's ``PrivateData=jobs``): on when one of the site's
  settings files (:data:`SITE_FILES`, those the caller can read) or the one given with
  ``--config`` says so, so a user cannot turn it off with a settings file of his own.
  Root and the members of ``reports.operator_group`` (the *operators*) see every job,
  anyone else his own (by the calling uid). While a site file makes the reports private,
  only the site files name the operator group: a ``--config`` of the user's own cannot
  make him an operator.
- Whether the caller is an operator also decides ``icefrog sacct``'s default: as Slurm's
  sacct lists the invoking user's jobs unless he is root, it lists everyone's jobs for an
  operator and his own for anyone else.
- The partition every icefrog job runs in (``slurm.partition``) for ``-p/-r``.
- ``SLURM_TIME_FORMAT`` (``report/timefmt.py``) is read here, once a report.
"""

from __future__ import annotations

import argparse
import grp
import os
from dataclasses import dataclass
from pathlib import Path

from icefrog_slurm.commands.db import DEFAULT_CONFIG
from icefrog_slurm.report.select import visible_owner
from icefrog_slurm.report.timefmt import parse_time_style, use_time_style
from icefrog_slurm.settings import Settings, load_settings

SITE_FILES = ("/etc/icefrog/reports.toml", DEFAULT_CONFIG)
"""The site's settings files, world-readable reports file first (see ``storeargs``)."""


@dataclass(frozen=True)
class ReportView:
    owner_uid: int | None  # None: every job
    partition: str
    operator: bool  # root or a member of the operator group: sees every job, even private


def report_view(args: argparse.Namespace, *, now: float) -> ReportView:
    """The caller's view, and the time style set for the report."""
    use_time_style(parse_time_style(os.environ.get("SLURM_TIME_FORMAT"), now=now))
    files = [s for s in map(_site_settings, SITE_FILES) if s is not None]
    given = None if getattr(args, "config", None) is None else load_settings(args.config)
    private = any(s.reports.private for s in (given, *files) if s is not None)
    site_private = any(s.reports.private for s in files)
    named = files if site_private else [s for s in (given, *files) if s is not None]
    group = next((s.reports.operator_group for s in named if s.reports.operator_group), None)
    partition = (given or next(iter(files), None) or Settings()).slurm.partition
    uid, groups, gid = os.getuid(), frozenset((os.getgid(), *os.getgroups())), _gid(group)
    owner = visible_owner(uid=uid, groups=groups, private=private, operator_gid=gid)
    operator = visible_owner(uid=uid, groups=groups, private=True, operator_gid=gid) is None
    return ReportView(owner_uid=owner, partition=partition, operator=operator)


def _site_settings(path: str) -> Settings | None:
    """A site file's settings; None when it is not there or this user may not read it
    (the controller's file is 0600 when it holds a password)."""
    if not Path(path).is_file() or not os.access(path, os.R_OK):
        return None
    return load_settings(path)


def _gid(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:  # a group this host does not know: nobody is in it
        return None


def env_value(name: str) -> str | None:
    """An environment variable's value, None when unset or empty."""
    value = os.environ.get(name)
    return value if value else None
