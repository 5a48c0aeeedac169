"""Reading the controller's ``decision.json`` (icefrog_slurm.protocol.Decision) on the job
side. A missing file means "no decision yet"; an unreadable or invalid one is reported on
stderr and ignored (the job keeps its current configuration rather than crash).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from icefrog_slurm.protocol import Decision


def _int(data: dict[str, Any], key: str, minimum: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}: must be an integer >= {minimum}")
    return value


def parse_decision(text: str) -> Decision:
    """Validate a decision document; ValueError names the bad field."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    unknown = sorted(set(data) - {"round", "gpus", "batch", "frozen", "shared", "extra"})
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field")
    extra = data.get("extra", {})
    if not isinstance(extra, dict):
        raise ValueError("extra: must be an object")
    return Decision(
        round=_int(data, "round", 0),
        gpus=_int(data, "gpus", 0),
        batch=_int(data, "batch", 1),
        frozen=_int(data, "frozen", 0),
        shared=bool(data.get("shared", False)),
        extra=extra,
    )


def read_decision(path: str | Path) -> Decision | None:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        print(f"icefrog trainer: cannot read {path}: {exc}", file=sys.stderr)
        return None
    try:
        return parse_decision(text)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        print(f"icefrog trainer: ignoring {path}: {exc}", file=sys.stderr)
        return None
