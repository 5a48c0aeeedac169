"""Reading the controller's ``decision.json`` (icefrog_slurm.protocol.Decision) on the job
side. A missing file means "no decision yet"; an unreadable or invalid one is reported on
stderr and ignored (the job keeps its current configuration rather than crash).
"""

from __future__ import annotations

import sys
from pathlib import Path

from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import Decision, parse_decision


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
    except InputError as exc:
        print(f"icefrog trainer: ignoring {path}: {exc}", file=sys.stderr)
        return None
