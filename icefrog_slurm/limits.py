"""The largest sizes the commands accept, checked before anything is allocated or looped over.

Each bound is far above any real use and small enough that what a command builds from it
(a node list, a range of GPU counts, a simulated clock) stays finite. What the store keeps
is bounded by ``protocol.INT32_MAX`` (batches, epochs), as in the reports that carry it. A
value beyond a bound is an InputError naming the option or field.
"""

from __future__ import annotations

MAX_JOB_GPUS = 4096
"""GPUs one job may ask for (the ``register`` report's limit)."""

MAX_CLUSTER_GPUS = 65536
"""GPUs of a cluster given to ``icefrog solve`` or ``icefrog simulate``."""

MAX_GPUS_PER_NODE = 64
"""GPUs of one node."""

MAX_SEED = 2**32 - 1
"""A random seed."""

MAX_SUBMIT_S = 10 * 365 * 86400.0
"""Latest submission time of a simulated job, seconds from the trace start (ten years);
beyond it a float clock still advances, but no simulation would ever reach the job."""

MAX_FORMAT_WIDTH = 1000
"""Widest column of a report's ``--format FIELD%N``."""
