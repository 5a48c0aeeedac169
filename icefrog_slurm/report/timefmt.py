"""Times and durations the way Slurm's sacct/squeue print and read them (local time zone).

- :func:`format_time`: ``YYYY-MM-DDTHH:MM:SS``, ``Unknown`` when absent; another style
  when ``SLURM_TIME_FORMAT`` asks for one (:func:`parse_time_style`, :func:`use_time_style`:
  ``standard``, ``relative`` or a strftime pattern holding ``%``, as Slurm reads it).
- :func:`format_duration`: ``[D-]HH:MM:SS`` (sacct's Elapsed; days unpadded like Slurm).
- :func:`parse_time`: the subset of sacct's ``-S/-E`` formats listed in its docstring.

The current time is always passed in; nothing here reads a clock. The style is set once a
report (:func:`use_time_style`) before any row is formatted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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


MAX_TIME_PATTERN = 256
"""Longest strftime pattern ``SLURM_TIME_FORMAT`` may give."""


@dataclass(frozen=True)
class TimeStyle:
    """How times print: ``standard`` (ISO), ``relative`` (Slurm's) or a strftime pattern."""

    kind: str = "standard"
    pattern: str = ""
    now: float = 0.0  # the report's time, for ``relative``


STANDARD = TimeStyle()
_style = STANDARD


def parse_time_style(
    text: str | None, *, now: float, option: str = "SLURM_TIME_FORMAT"
) -> TimeStyle:
    """``SLURM_TIME_FORMAT`` as Slurm reads it: unset or ``standard``, ``relative``, or a
    strftime pattern (it holds a ``%``); anything else is an InputError naming it."""
    if text is None or text == "" or text == "standard":
        return STANDARD
    if text == "relative":
        return TimeStyle("relative", now=now)
    if "%" in text and len(text) <= MAX_TIME_PATTERN and text.isprintable():
        try:
            datetime.fromtimestamp(now).strftime(text)
        except ValueError:
            pass
        else:
            return TimeStyle("strftime", pattern=text)
    raise InputError(
        f"{option} {text[:80]!r}: use standard, relative or a strftime pattern holding % "
        f"(printable, at most {MAX_TIME_PATTERN} characters)"
    )


def use_time_style(style: TimeStyle) -> None:
    """The style every :func:`format_time` of this report uses (set once, by the command)."""
    global _style
    _style = style


def format_time(t: float | None) -> str:
    """Seconds since the epoch as local ``YYYY-MM-DDTHH:MM:SS`` (or the style of
    :func:`use_time_style`); ``Unknown`` for None."""
    if t is None:
        return UNKNOWN
    when = datetime.fromtimestamp(t)
    if _style.kind == "strftime":
        return when.strftime(_style.pattern)
    if _style.kind == "relative":
        return _relative(when, datetime.fromtimestamp(_style.now))
    return when.strftime("%Y-%m-%dT%H:%M:%S")


def _relative(when: datetime, now: datetime) -> str:
    """Slurm's ``relative``: ``HH:MM:SS`` today; ``Ystday``/``Tomorr``/a weekday of the
    coming week with ``HH:MM``; else ``25 Apr`` this year, ``6 Jun 2012`` another."""
    days = (when.date() - now.date()).days
    if days == 0:
        return when.strftime("%H:%M:%S")
    if when.year != now.year:
        return f"{when.day} {when:%b %Y}"
    if days == -1:
        return when.strftime("Ystday %H:%M")
    if days == 1:
        return when.strftime("Tomorr %H:%M")
    if 1 < days < 7:
        return when.strftime("%a %H:%M")
    return f"{when.day} {when:%b}"


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
