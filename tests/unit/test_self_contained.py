"""The repository is self-contained: no code, doc, script or test points outside it.

A checkout (or a wheel) must work on a machine that has nothing else: no path on the
machine the project was written on (a work or home folder), no sibling folder beside the
checkout, no temporary folder a doc tells the reader to use. Each finding names file:line.
Kept out of the scan: ``data/pollux`` (third-party data, unchanged) and recorded Slurm
output under ``tests/golden`` (``WorkDir=`` of the job that made it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCANNED = ["icefrog_slurm", "launcher", "db", "benchmarks", "experiments", "examples",
           "slurm_conf", "tests", "docs", "README.md", "Makefile", "pyproject.toml",
           "setup.py", "data/README.md", "CHANGELOG.md"]  # fmt: skip
SKIPPED = ["tests/golden/", "tests/unit/test_self_contained.py"]
SUFFIXES = {".py", ".md", ".sh", ".toml", ".cfg", ".conf", ".service", ".json", ".mako",
            ".txt", ".yaml", ".yml", ".ini", ".sql", ".j2", ""}  # fmt: skip

# A folder of the machine the project was written on, a sibling of the checkout, a home
# folder. Written so that they do not match themselves here.
_ANYWHERE = [
    ("a work-machine path", re.compile(r"(?<![\w.])/work/")),
    ("a folder beside the checkout", re.compile(r"\.\./shared\b")),
    ("a home folder", re.compile(r"(?<![\w.])(/home/[A-Za-z_]|/root/|/Users/[A-Za-z_])")),
    # ~/ except a user's own dotfile a tool reads there (libpq's ~/.pgpass)
    ("a home folder", re.compile(r"(?<![\w$])~/(?!\.[\w.-]+\b(?!/))")),
]
# In docs: a file or folder under /tmp handed to the reader ("like /tmp" is fine).
_DOCS_ONLY = [("a temporary path in a doc", re.compile(r"(?<![\w.])/tmp/\S"))]


def _files() -> list[Path]:
    out = []
    for name in SCANNED:
        top = REPO / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            rel = path.relative_to(REPO).as_posix()
            if not path.is_file() or "__pycache__" in rel or path.suffix not in SUFFIXES:
                continue
            if any(rel == s or rel.startswith(s) for s in SKIPPED):
                continue
            out.append(path)
    return out


def _findings(path: Path) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    try:
        text = path.read_text("utf-8")
    except UnicodeDecodeError:
        return []
    rules = list(_ANYWHERE)
    if path.suffix == ".md":
        rules += _DOCS_ONLY
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in rules:
            if pattern.search(line):
                found.append(f"{rel}:{number}: {what}: {line.strip()[:120]}")
    return found


def test_the_scan_sees_the_repository() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _files()}
    assert {"README.md", "Makefile", "icefrog_slurm/cli.py", "docs/method.md"} <= names


@pytest.mark.parametrize(
    "line",
    [
        "see /work/shared/x",
        "`../shared/spec/`",
        "cd ~/src",
        "~/.config/x",
        "/home/alice/x",
        "in /tmp/x.csv",
    ],
)
def test_the_patterns_catch_what_they_mean(line: str) -> None:
    assert any(p.search(line) for _, p in [*_ANYWHERE, *_DOCS_ONLY]), line


@pytest.mark.parametrize(
    "line",
    ["like /tmp", "tmp_path / 'x'", "$HOME/.config", "var/work/x", "a/home/b", "in `~/.pgpass`"],
)
def test_the_patterns_leave_what_is_fine(line: str) -> None:
    assert not any(p.search(line) for _, p in [*_ANYWHERE, *_DOCS_ONLY]), line


def test_nothing_points_outside_the_repository() -> None:
    found = [f for path in _files() for f in _findings(path)]
    assert not found, "paths outside the repository:\n" + "\n".join(found)
