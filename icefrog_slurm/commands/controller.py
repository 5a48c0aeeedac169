"""``icefrog controller --config FILE [--once] [--dry-run]``: the scheduling daemon.

Runs in the foreground and logs to stdout (under systemd, where ``JOURNAL_STREAM`` is set,
each line with its syslog priority ``<N>`` and without timestamps: journald adds its own).
Wires the real adapters: ``SqlStore``, the Slurm backend (``slurm.backend``:
``SlurmCliBackend`` or ``SlurmPyslurmBackend``), the system clock, job files on the
filesystem, the report inbox and, when ``metrics.port`` is set, the Prometheus endpoint.
``--once`` makes one tick; ``--dry-run`` makes one tick, prints the plan as JSON and enacts
nothing (nothing is recorded either). ``--policy`` picks the policy: ``icefrog`` (default)
or ``standin``. It runs as root only (``preflight.require_root``), also with ``--check``.
Before anything starts, the database is checked without touching it and the state folders
are made (``preflight.first_start``); ``--check`` runs every check of ``preflight``
instead, one line each, and starts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from icefrog_slurm.commands.preflight import first_start, require_root
from icefrog_slurm.controller.daemon import Controller
from icefrog_slurm.controller.ports import FsJobFiles, SystemClock
from icefrog_slurm.domain.plan import Policy
from icefrog_slurm.errors import InputError
from icefrog_slurm.extras import require
from icefrog_slurm.settings import Settings, load_settings
from icefrog_slurm.slurm.identity import TAG_SECRET, TagSigner
from icefrog_slurm.slurm.select import make_cluster

DEFAULT_CONFIG = "/etc/icefrog/icefrog.toml"
POLICIES = ("icefrog", "standin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE", help="settings")
    parser.add_argument("--once", action="store_true", help="make one tick and exit")
    parser.add_argument(
        "--dry-run", action="store_true", help="print one tick's plan; enact nothing"
    )
    parser.add_argument("--max-ticks", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default="icefrog",
        help="icefrog (default) or standin (first come, first served, no freezing or sharing)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the settings, database, folders, munge, Slurm and metrics port; start nothing",
    )


def make_policy(name: str) -> Policy:
    if name == "icefrog":
        from icefrog_slurm.policies.icefrog import IcefrogPolicy

        return IcefrogPolicy()
    if name == "standin":
        from icefrog_slurm.policies.standin import StandInPolicy

        return StandInPolicy()
    raise InputError(f"--policy: unknown policy {name!r}")


THIRD_PARTY_LOGGERS = ("alembic", "mip", "sqlalchemy", "urllib3")
"""Libraries whose INFO lines say nothing an admin acts on: kept at WARNING (unless DEBUG)."""


class JournalFormatter(logging.Formatter):
    """Each line prefixed with its syslog priority, ``<N>`` (sd-daemon(3)): journald files
    it at that level, so ``journalctl -p warning`` shows warnings and errors only. Every line
    of a multi-line record (a traceback) gets the prefix, as journald reads line by line."""

    def format(self, record: logging.LogRecord) -> str:
        priority = _syslog_priority(record.levelno)
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).splitlines())


def _syslog_priority(levelno: int) -> int:
    for floor, priority in ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4)):
        if levelno >= floor:
            return priority
    return 6 if levelno >= logging.INFO else 7


def setup_logging(settings: Settings, environ: dict[str, str]) -> None:
    """stdout, at ``logging.level``; under systemd (``JOURNAL_STREAM`` set) with syslog
    priority prefixes and no timestamps (journald adds its own); other libraries' loggers at
    WARNING unless the level is DEBUG."""
    fmt = "%(levelname)s %(name)s: %(message)s"
    handler = logging.StreamHandler(sys.stdout)
    if "JOURNAL_STREAM" in environ:
        handler.setFormatter(JournalFormatter(fmt))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s " + fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.logging.level)
    quiet = logging.DEBUG if settings.logging.level == "DEBUG" else logging.WARNING
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(quiet)


def run(args: argparse.Namespace) -> int:
    from icefrog_slurm.store.inbox import ReportInbox, slurm_jobs_of
    from icefrog_slurm.store.sql import SqlStore

    if args.check:  # one line a check; creates, changes and starts nothing
        from icefrog_slurm.commands.preflight import check

        if args.once or args.dry_run:
            raise InputError("--check starts nothing: leave out --once and --dry-run")
        return check(args.config)
    settings = load_settings(args.config)
    require_root()
    if settings.metrics.port is not None and not args.dry_run:  # before anything starts
        require("prometheus_client", "metrics", "metrics.port")
    environ = dict(os.environ)
    setup_logging(settings, environ)
    policy = make_policy(args.policy)
    first_start(settings, config=args.config, metrics=not args.dry_run)  # before anything
    # the secret of resubmitted jobs' tags: kept across restarts, so a restarted controller
    # recognises a resubmission it was killed in the middle of
    signer = TagSigner.from_file(Path(settings.state.dir) / TAG_SECRET)
    cluster = make_cluster(settings.slurm.backend, signer=signer)  # a missing pyslurm stops here
    store = SqlStore.from_settings(settings)

    inbox = ReportInbox.from_settings(
        settings.inbox, store=store, slurm_jobs=slurm_jobs_of(cluster)
    )
    inbox.prepare()
    on_tick, on_lead = None, None
    if settings.metrics.port is not None and not args.dry_run:
        from icefrog_slurm.controller.metrics import ControllerMetrics

        metrics = ControllerMetrics(jobs_per_gpu=settings.sharing.max_jobs_per_gpu)
        metrics.serve(port=settings.metrics.port, address=settings.metrics.address)
        on_tick, on_lead = metrics.observe, metrics.lead
    controller = Controller(
        settings=settings,
        policy=policy,
        cluster=cluster,
        store=store,
        clock=SystemClock(),
        files=FsJobFiles(),
        drain=inbox.drain,
        dry_run=args.dry_run,
        on_tick=on_tick,
        on_lead=on_lead,
    )
    try:
        if args.dry_run:
            print(controller.tick_once().plan.to_json())
            return 0
        controller.run(max_ticks=1 if args.once else args.max_ticks)
    finally:
        store.close()
    return 0
