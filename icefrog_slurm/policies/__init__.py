"""Scheduling policies: ICEFROG and the baselines; each takes the same immutable snapshot and
returns the same plan. They learn only from observed reports, never from the simulator's
ground truth (import-linter contract in pyproject.toml)."""
