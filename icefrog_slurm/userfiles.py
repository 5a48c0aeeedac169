"""Reading a file a user names on the command line (settings, workloads, traces).

:func:`read_bytes` reads at most a given size, :func:`read_text` decodes it as UTF-8 and
:func:`load_json_file` parses it with the bounded reader ``jsonio.loads``; every fault of the
file (missing, a folder, a FIFO or device, unreadable, too large, not UTF-8, not JSON) is an
InputError naming it.
:func:`path_arg` is the argparse type of a path option: an empty one is an error (``Path('')``
would silently mean the current folder).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path
from typing import Any

from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import loads, printable

MAX_JSON_BYTES = 64 * 1024 * 1024
"""Largest JSON document a user may hand the CLI."""


def load_json_file(path: str | Path) -> Any:
    """Parse the JSON file ``path`` (``-``: stdin) with ``jsonio.loads``."""
    if str(path) == "-":
        raw = sys.stdin.buffer.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise InputError(f"-: larger than {MAX_JSON_BYTES} bytes")
        return loads(raw, "-")
    return loads(read_bytes(path, limit=MAX_JSON_BYTES, kind="JSON file"), printable(str(path)))


def read_text(path: str | Path, *, limit: int, kind: str) -> str:
    """The UTF-8 text of ``path`` (at most ``limit`` bytes); ``kind`` names what the file
    should be in the message of a folder (``settings file``, ``CSV file``)."""
    raw = read_bytes(path, limit=limit, kind=kind)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{printable(str(path), 200)}: not UTF-8 (byte {exc.start})") from None


def read_bytes(path: str | Path, *, limit: int, kind: str) -> bytes:
    """The bytes of ``path`` (at most ``limit``); ``kind`` names what the file should be in
    the message of a folder. Only a plain (regular) file is read: the file is opened without
    blocking (``O_NONBLOCK``: opening a FIFO with no writer would wait for ever) and checked
    on its descriptor, so a FIFO, device or socket swapped in meanwhile is refused too."""
    name = printable(str(path), 200)
    if not name:
        raise InputError(f"{kind}: the path is empty")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"{name}: is a folder, not a {kind}")
        if not stat.S_ISREG(mode):
            raise InputError(f"{name}: not a plain file (a FIFO, device or socket): give a {kind}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise InputError(f"{name}: larger than {limit} bytes")
    return raw


def path_arg(text: str) -> Path:
    """A path given on the command line; an empty one is refused."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return Path(text)
