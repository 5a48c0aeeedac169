"""What pyproject.toml cannot say: three folders outside ``icefrog_slurm/`` install as its
packages, beside those found under ``icefrog_slurm/`` and the job side's
``launcher/icefrog_launcher/`` (imported as ``icefrog_launcher``: a name of the project's own,
which a user's ``launcher.py`` cannot shadow):

- ``db/`` (alembic's environment and migrations) as ``icefrog_slurm.db``;
- ``slurm_conf/`` (the systemd unit, the example settings, slurm.conf and gres.conf; not its
  ``dev/``) as ``icefrog_slurm.examples``;
- ``docs/`` (the guides the unit's ``Documentation=`` names) as ``icefrog_slurm.docs``.

``icefrog admin install-files DEST`` copies the last two out of an installed wheel. Their
files are listed under ``[tool.setuptools.package-data]`` in pyproject.toml; everything
else is there too."""

from setuptools import find_packages, setup

MAPPED = {
    "icefrog_slurm.db": "db",
    "icefrog_slurm.examples": "slurm_conf",
    "icefrog_slurm.docs": "docs",
}

DATA_FOLDERS = ["icefrog_slurm.db.versions", "icefrog_slurm.sim.data.layers"]
"""Folders of files without ``__init__.py`` (migrations, layer tables): named, so that
setuptools ships them without warning that it might not."""

setup(
    packages=[
        *find_packages(include=["icefrog_slurm*"]),
        *find_packages("launcher", include=["icefrog_launcher*"]),
        *MAPPED,
        *DATA_FOLDERS,
    ],
    package_dir={**MAPPED, "icefrog_launcher": "launcher/icefrog_launcher"},
)
