"""The one thing pyproject.toml cannot say: the top-level ``db/`` folder (alembic's
environment and migrations) installs as the package ``icefrog_slurm.db``, beside the
packages found under ``icefrog_slurm/`` and ``launcher/``. Everything else is in
pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["icefrog_slurm*", "launcher*"]), "icefrog_slurm.db"],
    package_dir={"icefrog_slurm.db": "db"},
)
