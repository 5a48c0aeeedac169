"""``icefrog admin install-files DEST [--force]``: the files an admin installs by hand.

The wheel carries the systemd unit, the example settings, the slurm.conf and gres.conf
examples and the Prometheus alerting rules (the repository's ``slurm_conf/``, installed as
the package ``icefrog_slurm.examples``) and the guides (``docs/``, as ``icefrog_slurm.docs``);
this command copies them out of wherever pip put them: the guides into ``DEST`` and the
rest into ``DEST/examples``. An existing file is kept unless ``--force``; each file written or
kept is printed. Each folder is opened once without following a link and everything after
works on that descriptor; a file is written under a new random name in its folder and
renamed over the target, so a link planted at a target's name is replaced, never followed;
a link or a non-folder where a folder must be is refused.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
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
    Shipped(
        "icefrog_slurm.examples",
        "slurm_conf",
        ("*.example", "*.service", "*.rules.yml"),
        "examples",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    files = sub.add_parser(
        "install-files",
        help="copy the systemd unit, example configs and guides to DEST",
        description="Copy the guides to DEST and the systemd unit, the example settings, "
        "the slurm.conf/gres.conf examples and the Prometheus alerting rules to DEST/examples "
        "(e.g. DEST = "
        "/usr/share/doc/icefrog-slurm, which the unit's Documentation= names).",
    )
    files.add_argument("dest", metavar="DEST", help="target folder (created if missing)")
    files.add_argument("--force", action="store_true", help="replace files that exist")


def run(args: argparse.Namespace) -> int:
    if not args.dest:
        raise InputError("DEST: must not be empty")
    dest = Path(args.dest)
    _make_folders(dest)
    with _opened(dest, at=None) as dest_fd:
        for group in SHIPPED:
            source = shipped_folder(group)
            names = sorted({p.name for pattern in group.patterns for p in source.glob(pattern)})
            if not names:
                raise IcefrogError(f"no {group.package} files in {source}: a broken installation")
            shown = dest if group.under == "." else dest / group.under
            with _opened(shown, at=dest_fd, name=group.under) as fd:
                for name in names:
                    target = printable(str(shown / name), 500)
                    if _exists(name, fd, target) and not args.force:
                        print(f"kept {target} (it exists; --force replaces it)")
                        continue
                    _write(name, fd, (source / name).read_bytes())
                    print(f"wrote {target}")
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


def _make_folders(dest: Path) -> None:
    """``dest`` made a folder with its parents (mode 0755), or an InputError saying why not."""
    try:
        dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{printable(str(dest), 500)}: exists and is not a folder") from None
    except NotADirectoryError:
        raise InputError(f"{printable(str(dest), 500)}: a part of it is not a folder") from None


@contextmanager
def _opened(shown: Path, *, at: int | None, name: str = ".") -> Iterator[int]:
    """The folder ``name`` (in the folder ``at``, made when missing; or ``shown`` itself
    when ``at`` is None) opened without following a link: every later step works on this
    descriptor, so a folder swapped for a link meanwhile is never written through."""
    if at is not None and name != ".":
        with suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=at)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(str(shown) if at is None else name, flags, dir_fd=at)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file, or a link (O_NOFOLLOW)
            raise InputError(
                f"{printable(str(shown), 500)}: a link or not a folder; give a folder"
            ) from None
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def _exists(name: str, fd: int, shown: str) -> bool:
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return False  # a dangling link is there: it counts, replaced only with --force
    if stat.S_ISDIR(mode):
        raise InputError(f"{shown}: is a folder, not a file")
    return True


def _write(name: str, fd: int, data: bytes) -> None:
    """``data`` into ``name`` of the folder ``fd`` (mode 0644): a new file under a random
    name beside it (created exclusively, no link followed), then renamed over it."""
    temp = f".{name}.{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    out = os.open(temp, flags, 0o644, dir_fd=fd)
    try:
        try:
            os.fchmod(out, 0o644)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
        os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=fd)
        raise
