"""Times and durations the way Slurm's sacct/squeue print and read them (local time zone).

- :func:`format_time`: ``YYYY-MM-DDTHH:MM:SS``, ``Unknown`` when absent.
- :func:`format_duration`: ``[D-]HH:MM:SS`` (sacct's Elapsed; days unpadded like Slurm).
- :func:`parse_time`: the subset of sacct's ``-S/-E`` formats listed in its docstring.

The current time is always passed in; nothing here reads a clock.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from icefrog_slurm.errors import InputError

UNKNOWN = "Unknown"

_UNITS = {
    "": 1,
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}
_RELATIVE = re.compile(r"^now(?:([+-])(\d+)([a-z]*))?$")
_ISO = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:t(\d{1,2}):(\d{2})(?::(\d{2}))?)?$")
_SLASH = re.compile(r"^(\d{1,2})/(\d{1,2})(?:/(\d{2}))?(?:-(\d{1,2}):(\d{2})(?::(\d{2}))?)?$")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_NAMED = {"midnight": (0, 0), "noon": (12, 0), "teatime": (16, 0)}


def format_time(t: float | None) -> str:
    """Seconds since the epoch as local ``YYYY-MM-DDTHH:MM:SS``; ``Unknown`` for None."""
    if t is None:
        return UNKNOWN
    return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


def format_duration(seconds: float | None) -> str:
    """``[D-]HH:MM:SS`` (rounded to the second, never negative); empty for None."""
    if seconds is None:
        return ""
    total = max(round(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def parse_time(text: str, *, now: float, option: str = "time") -> float:
    """A sacct ``-S/-E`` time as seconds since the epoch (local time zone).

    Accepted: ``YYYY-MM-DD[THH:MM[:SS]]``; ``MM/DD[/YY][-HH:MM[:SS]]``; ``HH:MM[:SS]``
    (today, or yesterday when that is still to come, as sacct does for past times);
    ``now``, ``today``, ``midnight``, ``noon``, ``teatime`` (16:00); and
    ``now[+|-]COUNT[seconds|minutes|hours|days|weeks]`` (default unit seconds; ``s``,
    ``min``, ``h``, ``d``, ``w`` and singular forms too). Anything else is an InputError
    naming ``option`` and the text.
    """
    value = text.strip().lower()
    try:
        t = _parse(value, now)
        datetime.fromtimestamp(t)  # a time this host can show (years 1 to 9999)
        return t
    except (ValueError, OverflowError, OSError, _NoMatch):  # 25:00, year 0, now-10**20days
        pass
    raise InputError(
        f"{option} {text!r}: not a time sacct accepts here; use YYYY-MM-DD[THH:MM[:SS]], "
        "MM/DD[/YY][-HH:MM[:SS]], HH:MM[:SS], now[-N(seconds|minutes|hours|days|weeks)], "
        "today, midnight or noon"
    )


class _NoMatch(Exception):
    pass


def _parse(value: str, now: float) -> float:
    today = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if m := _RELATIVE.match(value):
        sign, count, unit = m.groups()
        if sign is None:
            return now
        if unit not in _UNITS:
            raise _NoMatch
        delta = int(count) * _UNITS[unit]
        return now + delta if sign == "+" else now - delta
    if value == "today":
        return today.timestamp()
    if value in _NAMED:
        hour, minute = _NAMED[value]
        return _most_recent(today.replace(hour=hour, minute=minute), now)
    if m := _ISO.match(value):
        y, mo, d, hh, mm, ss = (int(g) if g else 0 for g in m.groups())
        return datetime(y, mo, d, hh, mm, ss).timestamp()
    if m := _SLASH.match(value):
        mo, d, yy, hh, mm, ss = (int(g) if g else 0 for g in m.groups())
        year = today.year if m.group(3) is None else 2000 + yy
        return datetime(year, mo, d, hh, mm, ss).timestamp()
    if m := _CLOCK.match(value):
        hh, mm, ss = (int(g) if g else 0 for g in m.groups())
        return _most_recent(today.replace(hour=hh, minute=mm, second=ss), now)
    raise _NoMatch


def _most_recent(stamp: datetime, now: float) -> float:
    """A time of day: today's, or yesterday's when today's is still to come."""
    t = stamp.timestamp()
    return t if t <= now else (stamp - timedelta(days=1)).timestamp()
