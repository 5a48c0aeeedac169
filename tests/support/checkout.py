"""A copy of this checkout's source, for tests that build a wheel from it (the checkout's
own build/ may hold stale files that setuptools would put in the wheel)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def source_copy(dest: Path) -> Path:
    """The working tree's files (tracked and untracked, not ignored) copied to ``dest``:
    what a checkout holds, without this one's build outputs."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest
