"""The tick, the policies and the domain load without a database library: run in a fresh
interpreter where sqlalchemy, alembic and psycopg cannot be imported.

import-linter (pyproject.toml) checks the import graph statically; this checks what Python
actually loads, package ``__init__`` modules included.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BLOCKED = ("sqlalchemy", "alembic", "psycopg", "psycopg2")

# A meta-path finder, first in line, that refuses the blocked packages and their modules.
PRELUDE = f"""
import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("blocked for this test: " + name)
        return None
sys.meta_path.insert(0, _Blocked())
"""

PURE = (
    "icefrog_slurm.domain",
    "icefrog_slurm.domain.cluster",
    "icefrog_slurm.domain.records",
    "icefrog_slurm.domain.snapshot",
    "icefrog_slurm.domain.plan",
    "icefrog_slurm.controller.tick",
    "icefrog_slurm.controller.snapshot",
    "icefrog_slurm.policies.icefrog",
    "icefrog_slurm.policies.lucid_plus",
    "icefrog_slurm.policies.optimus_plus",
    "icefrog_slurm.policies.pollux_plus",
    "icefrog_slurm.policies.standin",
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("module", PURE)
def test_loads_without_a_database_library(module: str) -> None:
    done = _run(f"import {module}\n")
    assert done.returncode == 0, done.stderr


def test_the_block_works() -> None:
    done = _run("import icefrog_slurm.store.sql\n")
    assert done.returncode != 0
    assert "blocked for this test: sqlalchemy" in done.stderr


def test_a_users_own_launcher_module_does_not_shadow_the_job_side(tmp_path: Path) -> None:
    """A training script's folder comes first on sys.path: a user's ``launcher.py`` (or
    ``config.py``...) there must not replace the job side's modules."""
    for name in ("launcher", "config", "trainer", "data"):
        (tmp_path / f"{name}.py").write_text("raise ImportError('the user\\'s own module')\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import icefrog_launcher.trainer, icefrog_launcher.cli\n"
        "from icefrog_launcher import Trainer\n"
        "print(Trainer.__module__)\n"
    )
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "icefrog_launcher.trainer"
