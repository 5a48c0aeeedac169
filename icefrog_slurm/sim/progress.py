"""How far a simulation is, on stderr, for the one who waits for it.

On a terminal (one with a size) a progress bar (tqdm): jobs done of the workload's, the
rate, the elapsed time and the ETA, and the simulated time beside them. Anywhere else (a log
file, a pipe, the evaluation runner's capture) plain lines, never ``\\r`` frames: one when
the job count crosses each further tenth of the workload or ``every_s`` seconds of wall time
have passed since the last line, whichever comes first, and one at the end. A line reads
``icefrog: 36/120 jobs done (30 %), 5.2 h simulated, 1m40s wall, ETA 3m53s``; the ETA
assumes the jobs left take as long each as the jobs done so far (none before the first).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TextIO

EVERY_S = 30.0  # wall seconds between two plain lines at most
STEPS = 10  # a plain line at each further tenth of the jobs


class Progress:
    """``progress(now, done, total)`` for ``Engine.run``; ``close()`` when it returned."""

    def __init__(
        self,
        name: str,
        total: int,
        stream: TextIO,
        *,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        bar: bool | None = None,
    ) -> None:
        self.name, self.stream, self.every_s, self.clock = name, stream, every_s, clock
        self.started = clock()
        self.last_line = self.started
        self.last_step = 0
        self.done, self.total = 0, total
        self.now = 0.0
        tty = bar if bar is not None else _isatty(stream)
        self.bar: Any = _tqdm(name, total, stream) if tty else None

    def __call__(self, now: float, done: int, total: int) -> None:
        self.now, self.done, self.total = now, done, total
        if self.bar is not None:
            self.bar.total = total
            self.bar.set_postfix_str(f"{now / 3600:.1f} h simulated", refresh=False)
            self.bar.update(done - self.bar.n)
            return
        step = done * STEPS // total if total else 0
        if step > self.last_step or self.clock() - self.last_line >= self.every_s:
            self.last_step = max(step, self.last_step)
            self._line()

    def close(self, now: float | None = None, done: int | None = None) -> None:
        """The bar closed, or the last plain line: where the run ended (``now``, ``done``:
        the simulated end and the jobs finished, when known)."""
        self.now = self.now if now is None else now
        self.done = self.done if done is None else done
        if self.bar is not None:
            self.bar.update(self.done - self.bar.n)
            self.bar.close()
        else:
            self._line()

    def _line(self) -> None:
        self.last_line = self.clock()
        wall = self.last_line - self.started
        pct = 100 * self.done // self.total if self.total else 0
        eta = ""
        if 0 < self.done < self.total:
            eta = f", ETA {_duration(wall / self.done * (self.total - self.done))}"
        self.stream.write(
            f"{self.name}: {self.done}/{self.total} jobs done ({pct} %), "
            f"{self.now / 3600:.1f} h simulated, {_duration(wall)} wall{eta}\n"
        )
        self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    """A terminal with a size (tqdm draws nothing on one that reports 0 columns or rows)."""
    try:
        return stream.isatty() and min(os.get_terminal_size(stream.fileno())) > 0
    except (AttributeError, ValueError, OSError):  # closed, not a file, no size
        return False


def _tqdm(name: str, total: int, stream: TextIO) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=name, unit="job", file=stream, dynamic_ncols=True, leave=True)


def _duration(seconds: float) -> str:
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
