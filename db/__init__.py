"""The state store's alembic environment (``env.py``) and revisions (``versions/``).

This folder is the top-level ``db/`` of the repository; setuptools installs it as the
package ``icefrog_slurm.db`` (``setup.py``'s ``package_dir``) so that a wheel, an editable
install and a source checkout all hold it, and ``icefrog_slurm.store.migrate`` finds it
with ``importlib.resources``. Nothing imports ``env.py``: alembic runs it.
"""
