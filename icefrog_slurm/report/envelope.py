"""The ``--json`` envelope of the reports, shaped like Slurm 22.05's ``squeue/sacct --json``.

Slurm 22.05 (openapi v0.0.38, the Slurm of this project's hosts) prints ``{"meta":
{"plugin": {"type", "name"}, "Slurm": {"version": {"major", "micro", "minor"},
"release"}}, "errors": [], "warnings": [], "jobs": [...]}``; newer releases spell the
version ``meta.slurm.version``. The reports print 22.05's spelling: ``meta.Slurm`` names the
Slurm release whose envelope the output follows (not a version read from a running
Slurm), ``meta.plugin`` says the jobs are icefrog's, and ``meta.icefrog.version`` is this
icefrog. Times and durations in ``jobs`` are whole seconds, as Slurm prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icefrog_slurm import __version__

SLURM_SHAPE = {"version": {"major": 22, "micro": 0, "minor": 5}, "release": "22.05"}


def envelope(jobs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``jobs`` inside Slurm's envelope (no errors or warnings: a report that fails exits
    with a one-line error instead)."""
    return {
        "meta": {
            "plugin": {"type": "icefrog", "name": "icefrog-slurm reports"},
            "Slurm": SLURM_SHAPE,
            "icefrog": {"version": __version__},
        },
        "errors": [],
        "warnings": [],
        "jobs": list(jobs),
    }


def seconds(value: float | None) -> int | None:
    """A time or a duration as whole seconds (None stays None): Slurm prints integers."""
    return None if value is None else round(value)
