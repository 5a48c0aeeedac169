"""Strict reading of the JSON documents users hand to the CLI (``icefrog tune``, ``solve``...).

Every check raises :class:`InputError` with the path of the offending field, e.g.
``jobs[2].options[0].tta_s: must be > 0``. Unknown fields are errors, never ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from icefrog_slurm.errors import InputError

JsonObject = Mapping[str, Any]


MAX_DEPTH = 32
"""Deepest nesting of arrays and objects any JSON input may have."""
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
"""Every JSON integer must fit a signed 64-bit column (SQLite and Postgres BIGINT)."""

_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


def loads(raw: str | bytes, where: str = "input") -> Any:
    """Parse untrusted JSON: nesting at most :data:`MAX_DEPTH`, integers within 64 bits,
    no NaN/Infinity, no duplicate keys, no NUL or lone surrogate in any string. Every
    failure is :class:`InputError` naming ``where``; nothing else escapes."""
    if isinstance(raw, bytes | bytearray):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{where}: not UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    depth = 0
    for m in _STRING_OR_BRACKET.finditer(text):
        ch = m.group()
        if ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        elif ch in "]}":
            depth -= 1
    try:
        value = json.loads(
            text,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=_no_constant,
            object_pairs_hook=_unique_keys,
        )
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"{where}: not valid JSON: {_printable(str(exc), 200)}") from None
    _check_strings(value, where)
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise InputError(f"integer of {len(text)} digits: out of the 64-bit range")
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise InputError(f"integer {text}: out of the 64-bit range")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"number {text[:40]}: out of the floating-point range")
    return value


def _no_constant(text: str) -> Any:
    raise InputError(f"{text} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"duplicate key {_show(key)}")
        out[key] = value
    return out


def _check_strings(value: Any, where: str) -> None:
    """No NUL and no lone surrogate anywhere (neither can be stored, logged or encoded)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _BAD_CHARS.search(item):
                raise InputError(f"{where}: a string holds NUL or a lone surrogate")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def printable(text: str, limit: int = 500) -> str:
    """``text`` safe to log and to store: valid UTF-8, no control character, no NUL, no lone
    surrogate (each such character written as ``\\xNN`` / ``\\uNNNN``), cut to ``limit``."""
    if len(text) <= limit and text.isprintable():  # (a lone surrogate is not printable)
        return text
    return _printable(text, limit)


def _printable(text: str, limit: int) -> str:
    out: list[str] = []
    size = 0
    for ch in text:
        code = ord(ch)
        if ch.isprintable() and not 0xD800 <= code <= 0xDFFF:
            piece = ch
        elif code < 0x100:
            piece = f"\\x{code:02x}"
        else:
            piece = f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        size += len(piece)
        if size > limit:
            out.append("...")
            break
        out.append(piece)
    return "".join(out)


def expect_object(value: Any, where: str) -> JsonObject:
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: must be an object")
    return value


def reject_unknown(obj: JsonObject, allowed: Iterable[str], where: str) -> None:
    """Fail on any key of ``obj`` that is not in ``allowed``, naming all of them."""
    allowed_set = set(allowed)
    unknown = sorted(k for k in obj if k not in allowed_set)
    if unknown:
        prefix = f"{where}." if where else ""
        raise InputError(
            f"{prefix}{unknown[0]}: unknown field"
            + (f" (also: {', '.join(unknown[1:])})" if len(unknown) > 1 else "")
            + f"; allowed: {', '.join(sorted(allowed_set))}"
        )


def _show(value: Any, limit: int = 60) -> str:
    """A value as JSON for an error message, cut to ``limit`` characters (messages of
    rejected reports are stored; a huge field must not be copied into them)."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def get_number(
    obj: JsonObject,
    key: str,
    where: str = "",
    *,
    default: float | None = None,
    minimum: float | None = None,
    exclusive_minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """A finite number (bools refused), with optional bounds; missing -> default or error."""
    name = _path(where, key)
    if key not in obj:
        if default is None:
            raise InputError(f"{name}: missing")
        return default
    return check_number(
        obj[key], name, minimum=minimum, exclusive_minimum=exclusive_minimum, maximum=maximum
    )


def get_int(
    obj: JsonObject,
    key: str,
    where: str = "",
    *,
    default: int | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """An integer (bools and 2.5 refused), with optional bounds; missing -> default or error."""
    name = _path(where, key)
    if key not in obj:
        if default is None:
            raise InputError(f"{name}: missing")
        return default
    return check_int(obj[key], name, minimum=minimum, maximum=maximum)


def get_bool(obj: JsonObject, key: str, where: str = "", *, default: bool | None = None) -> bool:
    name = _path(where, key)
    if key not in obj:
        if default is None:
            raise InputError(f"{name}: missing")
        return default
    value = obj[key]
    if not isinstance(value, bool):
        raise InputError(f"{name}: must be true or false, got {_show(value)}")
    return value


def get_str(obj: JsonObject, key: str, where: str = "", *, default: str | None = None) -> str:
    name = _path(where, key)
    if key not in obj:
        if default is None:
            raise InputError(f"{name}: missing")
        return default
    value = obj[key]
    if not isinstance(value, str) or not value:
        raise InputError(f"{name}: must be a non-empty string, got {_show(value)}")
    return value


def get_list(obj: JsonObject, key: str, where: str = "", *, required: bool = True) -> list[Any]:
    name = _path(where, key)
    if key not in obj:
        if required:
            raise InputError(f"{name}: missing")
        return []
    value = obj[key]
    if not isinstance(value, list):
        raise InputError(f"{name}: must be a list")
    return value


def number_list(values: list[Any], where: str, *, minimum: float | None = None) -> list[float]:
    """Every element a finite number (>= minimum when given)."""
    out: list[float] = []
    for i, value in enumerate(values):
        out.append(check_number(value, f"{where}[{i}]", minimum=minimum))
    return out


def check_number(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    exclusive_minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """``value`` as a finite float (bools refused) within the optional bounds; ``name`` is
    the field path the error names."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{name}: must be a number, got {_show(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise InputError(f"{name}: must be finite")
    if minimum is not None and number < minimum:
        raise InputError(f"{name}: must be >= {minimum:g}, got {number:g}")
    if exclusive_minimum is not None and number <= exclusive_minimum:
        raise InputError(f"{name}: must be > {exclusive_minimum:g}, got {number:g}")
    if maximum is not None and number > maximum:
        raise InputError(f"{name}: must be <= {maximum:g}, got {number:g}")
    return number


def int_list(
    values: list[Any], where: str, *, minimum: int | None = None, maximum: int | None = None
) -> list[int]:
    """Every element an integer (bools refused) within the optional bounds."""
    return [
        check_int(v, f"{where}[{i}]", minimum=minimum, maximum=maximum)
        for i, v in enumerate(values)
    ]


def check_int(
    value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as an integer (bools and 2.5 refused) within the optional bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name}: must be an integer, got {_show(value)}")
    if minimum is not None and value < minimum:
        raise InputError(f"{name}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InputError(f"{name}: must be <= {maximum}, got {value}")
    return value
