"""``icefrog admin install-files DEST [--force]``: the files an admin installs by hand.

The wheel carries the systemd unit, the example settings, the slurm.conf and gres.conf
examples (the repository's ``slurm_conf/``, installed as the package
``icefrog_slurm.examples``) and the guides (``docs/``, as ``icefrog_slurm.docs``); this
command copies them out of wherever pip put them: the guides into ``DEST`` and the rest
into ``DEST/examples``. An existing file is kept unless ``--force``; each file written or
kept is printed. A file is written under a temporary name in its folder and renamed over
the target, so a link planted at a target's name is replaced, never followed; a link or a
non-folder where a folder must be is refused.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.jsonio import printable

_CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Shipped:
    """One group of shipped files: the package holding them in a wheel, the repository
    folder it is built from, the file patterns (those of pyproject's package-data) and
    where under DEST they go."""

    package: str
    checkout: str
    patterns: tuple[str, ...]
    under: str


SHIPPED = (
    Shipped("icefrog_slurm.docs", "docs", ("*.md",), "."),
    Shipped("icefrog_slurm.examples", "slurm_conf", ("*.example", "*.service"), "examples"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    files = sub.add_parser(
        "install-files",
        help="copy the systemd unit, example configs and guides to DEST",
        description="Copy the guides to DEST and the systemd unit, the example settings "
        "and the slurm.conf/gres.conf examples to DEST/examples (e.g. DEST = "
        "/usr/share/doc/icefrog-slurm, which the unit's Documentation= names).",
    )
    files.add_argument("dest", metavar="DEST", help="target folder (created if missing)")
    files.add_argument("--force", action="store_true", help="replace files that exist")


def run(args: argparse.Namespace) -> int:
    if not args.dest:
        raise InputError("DEST: must not be empty")
    dest = Path(args.dest)
    for group in SHIPPED:
        source = shipped_folder(group)
        names = sorted({p.name for pattern in group.patterns for p in source.glob(pattern)})
        if not names:
            raise IcefrogError(f"no {group.package} files in {source}: a broken installation")
        folder = _folder(dest / group.under if group.under != "." else dest)
        for name in names:
            target = folder / name
            if _exists(target) and not args.force:
                print(f"kept {printable(str(target), 500)} (it exists; --force replaces it)")
                continue
            _write(target, (source / name).read_bytes())
            print(f"wrote {printable(str(target), 500)}")
    return 0


def shipped_folder(group: Shipped) -> Path:
    """The folder holding ``group``'s files: the installed package (a wheel, an editable
    install), else the repository's folder beside the package (a checkout on PYTHONPATH)."""
    spec = importlib.util.find_spec(group.package)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if Path(location).is_dir():
            return Path(location)
    checkout = _CHECKOUT / group.checkout
    if checkout.is_dir():
        return checkout
    raise IcefrogError(f"the package {group.package} is missing: a broken installation")


def _folder(path: Path) -> Path:
    """``path`` made a folder (with its parents), refusing a link or a file there."""
    try:
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{printable(str(path), 500)}: exists and is not a folder") from None
    except NotADirectoryError:
        raise InputError(f"{printable(str(path), 500)}: a part of it is not a folder") from None
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
        raise InputError(f"{printable(str(path), 500)}: a link or not a folder; give a folder")
    return path


def _exists(path: Path) -> bool:
    try:
        mode = os.lstat(path).st_mode  # a dangling link counts: replaced only with --force
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(mode):
        raise InputError(f"{printable(str(path), 500)}: is a folder, not a file")
    return True


def _write(target: Path, data: bytes) -> None:
    """``data`` into ``target`` (mode 0644): a new temporary file beside it, renamed over it."""
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            os.fchmod(out.fileno(), 0o644)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
