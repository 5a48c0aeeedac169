"""Developer tools run from the repository root (``python -m tools.NAME``); not part of the
installed distribution (pyproject.toml ships only icefrog_slurm and launcher)."""
