"""Scripts that print the figures quoted in docs/; run each from the repository root as a
module, ``.venv/bin/python -m benchmarks.NAME [OPTIONS]`` (its docstring has the usage).
They import the project as the installed packages ``icefrog_slurm`` and ``launcher``, and each
other as ``benchmarks.*``; the data they read by default is the repository's ``data/pollux``.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POLLUX = REPO / "data" / "pollux"
"""The Pollux data in the repository: traces/philly.csv, traces/<model>/, workloads-*/."""
