"""The one line users see while the icefrog controller is down.

A running controller records a round every round period, with or without jobs; a job
``icefrog submit`` makes waits held until a round releases it. So when the store's latest
round is older than :data:`DOWN_AFTER_ROUNDS` round periods, ``icefrog squeue`` and
``icefrog submit`` print on stderr::

    icefrog: the icefrog controller has not run since 2026-12-02T04:10:00: new jobs stay
    held until it returns; ask your administrator

(one line), and the command goes on and succeeds. The period is read from the store, the
shortest gap between its latest rounds (a round is never recorded sooner than a period
after the last), or the default period while fewer than two rounds exist. A store with no
round at all says the controller has not run yet. The notice is a courtesy: a store that
cannot be read for it adds nothing and fails nothing.
"""

from __future__ import annotations

import sys
import time
from itertools import pairwise

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from icefrog_slurm.commands.storeargs import open_source, report_source
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.report.timefmt import format_time
from icefrog_slurm.settings import ControllerSettings
from icefrog_slurm.store.models import RoundRow
from icefrog_slurm.store.sql import SqlStore

DOWN_AFTER_ROUNDS = 3
"""Round periods without a round after which the controller counts as down."""
RECENT_ROUNDS = 10
"""Latest rounds whose gaps give the period."""
DEFAULT_PERIOD_S = ControllerSettings().round_period_s
_ADVICE = "new jobs stay held until it returns; ask your administrator"


def round_times(store: SqlStore) -> list[float]:
    """The times of the store's latest rounds, newest first."""
    query = select(RoundRow.time).order_by(RoundRow.round_no.desc()).limit(RECENT_ROUNDS)
    with store.reading() as session:
        return [float(t) for t in session.execute(query).scalars()]


def down_notice(times: list[float], *, now: float) -> str | None:
    """The notice for rounds at ``times`` seen at ``now``; None while the controller runs."""
    if not times:
        return "icefrog: the icefrog controller has not run yet: new jobs stay held until it runs"
    ordered = sorted(times, reverse=True)
    gaps = [later - earlier for later, earlier in pairwise(ordered) if later > earlier]
    period = min(gaps) if gaps else DEFAULT_PERIOD_S
    if now - ordered[0] <= DOWN_AFTER_ROUNDS * period:
        return None
    return f"icefrog: the icefrog controller has not run since {format_time(ordered[0])}: {_ADVICE}"


def warn_if_down(store: SqlStore, *, now: float) -> None:
    """Print the notice on stderr when the controller is down; never raises for the store."""
    try:
        times = round_times(store)
    except (IcefrogError, SQLAlchemyError):
        return
    line = down_notice(times, now=now)
    if line is not None:
        print(line, file=sys.stderr)


def warn_for_submit(*, config: str | None) -> None:
    """``icefrog submit``'s notice: the store the reports read (``storeargs``, with the
    controller settings file ``config`` as ``--config``), opened read-only; nothing when it
    cannot be found or read."""
    try:
        store = open_source(report_source(db=None, config=config))
    except (IcefrogError, OSError, SQLAlchemyError):
        return
    try:
        warn_if_down(store, now=time.time())
    finally:
        store.close()
