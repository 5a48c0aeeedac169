"""Field lists and their output the way sacct prints them: fixed-width table or parsable.

A report declares its fields (:class:`Field`: a name, a default width, how to turn a row
into text). ``--format`` is a comma list of field names, case-insensitive like sacct's,
each with an optional ``%N`` width suffix: ``%N`` right-justifies in N columns, ``%-N``
left-justifies. A value wider than its column is cut and ends in ``+``, as in sacct.

- :func:`parse_format`: the ``--format`` text to columns; an unknown name or a bad width is
  an InputError naming it and listing the valid fields.
- :func:`render_table`: a header, a dash line (sacct; squeue has none), then one line a
  row; columns are separated by one space (trailing spaces are dropped).
- :func:`render_parsable`: ``|``-separated (``-P/--parsable2``: no trailing ``|``;
  ``-p/--parsable``: a trailing ``|``), header first unless told not to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from icefrog_slurm.errors import InputError
from icefrog_slurm.limits import MAX_FORMAT_WIDTH

R = TypeVar("R")
_ITEM = re.compile(r"^([A-Za-z][A-Za-z0-9_()\-]*)(?:%(-?)(\d+))?$")


@dataclass(frozen=True)
class Field(Generic[R]):
    """One reportable field: its name (the header), default width, text of a row."""

    name: str
    width: int
    text: Callable[[R], str]
    left: bool = False  # default justification when no %N is given
    help: str = ""


@dataclass(frozen=True)
class Column(Generic[R]):
    field: Field[R]
    width: int
    left: bool

    def fit(self, value: str, *, mark: bool = True) -> str:
        """The value cut to the width (last kept character ``+`` when ``mark``), padded."""
        if len(value) > self.width:
            value = value[: self.width - 1] + "+" if mark else value[: self.width]
        return value.ljust(self.width) if self.left else value.rjust(self.width)


def field_index(fields: Iterable[Field[R]]) -> dict[str, Field[R]]:
    """Fields by lower-case name, for case-insensitive lookup."""
    return {f.name.lower(): f for f in fields}


def parse_format(text: str, fields: Mapping[str, Field[R]], *, option: str) -> list[Column[R]]:
    """``JobID,JobName%30,User%-8`` to columns (``fields`` from :func:`field_index`)."""
    columns: list[Column[R]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        match = _ITEM.match(item)
        found = fields.get(match.group(1).lower()) if match else None
        if match is None or found is None:
            name = match.group(1) if match else item
            valid = ", ".join(f.name for f in fields.values())
            raise InputError(f"{option}: unknown field {name!r}; valid fields: {valid}")
        minus, width = match.group(2), match.group(3)
        columns.append(
            Column(
                field=found,
                width=_width(width, item, option) if width is not None else found.width,
                left=bool(minus) if width is not None else found.left,
            )
        )
    if not columns:
        raise InputError(f"{option}: no fields given")
    return columns


def _width(digits: str, item: str, option: str) -> int:
    """The ``%N`` of a ``--format`` item: 1 to :data:`MAX_FORMAT_WIDTH` columns."""
    digits = digits.lstrip("0")
    if not digits:
        raise InputError(f"{option}: field {item!r}: the width must be at least 1")
    if len(digits) > 6 or int(digits) > MAX_FORMAT_WIDTH:
        raise InputError(
            f"{option}: field {item[:40]!r}: the width must be at most {MAX_FORMAT_WIDTH}"
        )
    return int(digits)


def render_table(
    columns: Sequence[Column[R]],
    rows: Iterable[R],
    *,
    header: bool,
    squeue_style: bool = False,
) -> list[str]:
    """sacct's table; ``squeue_style``: upper-case titles and no dash line, as squeue."""
    lines: list[str] = []
    if header:
        titles = (c.field.name.upper() if squeue_style else c.field.name for c in columns)
        lines.append(_join(c.fit(t, mark=False) for c, t in zip(columns, titles, strict=True)))
        if not squeue_style:
            lines.append(_join("-" * c.width for c in columns))
    lines.extend(_join(c.fit(c.field.text(row)) for c in columns) for row in rows)
    return lines


def render_parsable(
    columns: Sequence[Column[R]], rows: Iterable[R], *, header: bool, trailing: bool
) -> list[str]:
    end = "|" if trailing else ""
    lines: list[str] = []
    if header:
        lines.append("|".join(c.field.name for c in columns) + end)
    lines.extend("|".join(c.field.text(row) for c in columns) + end for row in rows)
    return lines


def _join(cells: Iterable[str]) -> str:
    return " ".join(cells).rstrip()
