"""The user guide shows its examples verbatim: every block between ``<!-- example: PATH -->``
and ``<!-- /example -->`` in docs/user-guide.md is the file PATH of the repository, whole
(so the code a reader copies is the code tests/integration/test_user_guide_quickstart.py
runs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "user-guide.md"
BLOCK = re.compile(
    r"<!-- example: (?P<path>\S+) -->\n```\w*\n(?P<body>.*?)```\n<!-- /example -->", re.S
)


def blocks(text: str) -> dict[str, str]:
    return {m["path"]: m["body"] for m in BLOCK.finditer(text)}


def test_the_guide_shows_its_examples_whole() -> None:
    shown = blocks(GUIDE.read_text())
    assert {"examples/quickstart.py", "examples/quickstart.sbatch"} <= set(shown)
    for path, body in shown.items():
        assert body == (ROOT / path).read_text(), f"{path} differs from the guide's block"


def test_a_changed_block_is_noticed() -> None:
    text = GUIDE.read_text()
    path = "examples/quickstart.py"
    changed = text.replace("scheduler.step()\n", "scheduler.step()  # edited\n", 1)
    assert blocks(changed)[path] != (ROOT / path).read_text()
