"""Reading a file a user names on the command line (settings, workloads, traces).

:func:`read_text` reads at most a given size and decodes UTF-8; every fault of the file
(missing, a folder, unreadable, too large, not UTF-8) is an InputError naming it.
:func:`path_arg` is the argparse type of a path option: an empty one is an error (``Path('')``
would silently mean the current folder).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import printable


def read_text(path: str | Path, *, limit: int, kind: str) -> str:
    """The UTF-8 text of ``path`` (at most ``limit`` bytes); ``kind`` names what the file
    should be in the message of a folder (``settings file``, ``CSV file``)."""
    name = printable(str(path), 200)
    if not name:
        raise InputError(f"{kind}: the path is empty")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a folder, not a {kind}") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise InputError(f"{name}: larger than {limit} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 (byte {exc.start})") from None


def path_arg(text: str) -> Path:
    """A path given on the command line; an empty one is refused."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return Path(text)
