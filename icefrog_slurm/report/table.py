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
  ``-p/--parsable``: a trailing ``|``; ``--delimiter`` another separator), header first
  unless told not to; a cell holding the separator is quoted as a shell word.
- :func:`parse_long_format`: squeue's ``-O/--Format`` (``name[:[.][size][suffix]]``: left
  justified unless ``.``, 20 columns without a size, a suffix printed after the value, no
  other separator), as squeue prints it.
- :func:`parse_letter_format`: squeue's ``-o "%.18i %.9P %j"`` (``%[.][SIZE]LETTER``:
  left-justified unless ``.``, the value's own width without a size, the text between
  items printed as it stands, no other separator), as squeue prints it.
- :func:`parse_sort` / :func:`sort_rows`: squeue's ``--sort`` (``[+|-]FIELD`` comma list;
  numbers compare as numbers).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from icefrog_slurm.errors import InputError
from icefrog_slurm.limits import MAX_FORMAT_WIDTH

R = TypeVar("R")
_ITEM = re.compile(r"^([A-Za-z][A-Za-z0-9_()\-]*)(?:%(-?)(\d+))?$")
_LONG_ITEM = re.compile(r"^([A-Za-z][A-Za-z0-9_()\-]*)(?::(\.?)(\d*)(.*))?$")
_LETTER_ITEM = re.compile(r"%(\.?)(\d*)(.)", re.S)
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")
MAX_SUFFIX = 64
LONG_WIDTH = 20
"""squeue -O's width of a field given without a size."""


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
    width: int  # 0: the value's own width (squeue's ``%j`` without a size)
    left: bool
    suffix: str = ""  # text after the value (squeue's -O suffix, -o's literal text)
    prefix: str = ""  # text before the value (squeue's -o literal text)
    joined: bool = False  # squeue's -o letters and -O: no separator, cut without a mark

    def fit(self, value: str, *, mark: bool = True) -> str:
        """The value cut to the width (last kept character ``+`` when ``mark``, as sacct;
        squeue's styles cut plainly), padded."""
        if self.width and len(value) > self.width:
            cut_mark = mark and not self.joined
            value = value[: self.width - 1] + "+" if cut_mark else value[: self.width]
        padded = value.ljust(self.width) if self.left else value.rjust(self.width)
        return self.prefix + padded + self.suffix


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


def parse_long_format(text: str, fields: Mapping[str, Field[R]], *, option: str) -> list[Column[R]]:
    """squeue's ``-O``: ``JobID,Name:30,GPUs:.6`` to columns (left-justified, ``.`` right)."""
    columns: list[Column[R]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        match = _LONG_ITEM.match(item)
        found = fields.get(match.group(1).lower()) if match else None
        if match is None or found is None:
            name = match.group(1) if match else item
            valid = ", ".join(f.name for f in fields.values())
            raise InputError(f"{option}: unknown field {name[:40]!r}; valid fields: {valid}")
        dot, width, suffix = match.group(2) or "", match.group(3) or "", match.group(4) or ""
        if len(suffix) > MAX_SUFFIX or not suffix.isprintable():
            raise InputError(
                f"{option}: field {item[:40]!r}: the suffix must be printable, "
                f"at most {MAX_SUFFIX} characters"
            )
        columns.append(
            Column(
                field=found,
                width=_width(width, item, option) if width else LONG_WIDTH,
                left=not dot,
                suffix=suffix,
                joined=True,
            )
        )
    if not columns:
        raise InputError(f"{option}: no fields given")
    return columns


def parse_letter_format(
    text: str, letters: Mapping[str, str], fields: Mapping[str, Field[R]], *, option: str
) -> list[Column[R]]:
    """squeue's ``%[.][SIZE]LETTER`` items to columns (``letters``: letter -> field name)."""
    columns: list[Column[R]] = []
    end = 0
    for match in _LETTER_ITEM.finditer(text):
        dot, width, letter = match.groups()
        if letter not in letters:
            known = " ".join(f"%{k}" for k in letters)
            raise InputError(
                f"{option}: {match.group(0)[:20]!r} is not a field here; known: {known}"
            )
        columns.append(
            Column(
                field=fields[letters[letter].lower()],
                width=_width(width, match.group(0), option) if width else 0,
                left=not dot,
                prefix=_literal(text[end : match.start()], option),
                joined=True,
            )
        )
        end = match.end()
    if not columns:
        raise InputError(f"{option}: no %FIELD items given")
    columns[-1] = replace(columns[-1], suffix=_literal(text[end:], option))
    return columns


def _literal(text: str, option: str) -> str:
    if len(text) > MAX_SUFFIX or not text.isprintable():
        raise InputError(
            f"{option}: the text between fields must be printable, at most {MAX_SUFFIX} characters"
        )
    return text


def parse_sort(
    text: str, fields: Mapping[str, Field[R]], *, option: str
) -> list[tuple[Field[R], bool]]:
    """``--sort -Time,User``: (field, descending) pairs, first key first."""
    keys: list[tuple[Field[R], bool]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        descending = item.startswith("-")
        name = item[1:] if item[:1] in "+-" else item
        found = fields.get(name.lower())
        if found is None:
            valid = ", ".join(f.name for f in fields.values())
            raise InputError(f"{option}: unknown field {name[:40]!r}; valid fields: {valid}")
        keys.append((found, descending))
    if not keys:
        raise InputError(f"{option}: no fields given")
    return keys


def sort_rows(rows: Sequence[R], keys: Sequence[tuple[Field[R], bool]]) -> list[R]:
    """Rows ordered by each key in turn (stable); numbers before text, numbers by value."""
    out = list(rows)
    for field, descending in reversed(keys):
        texts = {id(row): _sort_key(field.text(row)) for row in out}
        out.sort(key=lambda row: texts[id(row)], reverse=descending)
    return out


def _sort_key(text: str) -> tuple[int, float, str]:
    return (0, float(text), "") if _NUMBER.match(text) else (1, 0.0, text)


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
    joined = bool(columns) and columns[0].joined  # squeue's own styles: as squeue prints
    join = "".join if joined else _join
    lines: list[str] = []
    if header:
        titles = (c.field.name.upper() if squeue_style else c.field.name for c in columns)
        lines.append(join(c.fit(t, mark=False) for c, t in zip(columns, titles, strict=True)))
        if not squeue_style:
            lines.append(join("-" * c.width for c in columns))
    lines.extend(join(c.fit(c.field.text(row)) for c in columns) for row in rows)
    return lines


def render_parsable(
    columns: Sequence[Column[R]],
    rows: Iterable[R],
    *,
    header: bool,
    trailing: bool,
    delimiter: str = "|",
) -> list[str]:
    end = delimiter if trailing else ""
    lines: list[str] = []
    if header:
        lines.append(delimiter.join(c.field.name for c in columns) + end)
    lines.extend(
        delimiter.join(_cell(c.field.text(row), delimiter) for c in columns) + end for row in rows
    )
    return lines


def _cell(text: str, delimiter: str) -> str:
    """A parsable cell: one holding the delimiter (a job name is its owner's text) quoted as
    a POSIX shell word, so that it cannot pass for more cells."""
    return shlex.quote(text) if delimiter in text else text


def _join(cells: Iterable[str]) -> str:
    return " ".join(cells).rstrip()
