"""The admin guide's install steps, run as written, into bare virtual environments.

The shell block between ``<!-- install:begin -->`` and ``<!-- install:end -->`` in
docs/admin-guide.md runs verbatim with bash in a copy of the working tree (its tracked and
untracked, not ignored, files), with three absolute paths moved under a temporary folder:
the virtual environment (``/opt/icefrog``), the folder of the ``icefrog`` link
(``/usr/local/bin``) and the copied guides (``/usr/share/doc/icefrog-slurm``). pip fetches
the build backend and the dependencies from the package index, as on an admin's host.
Then: the installed ``icefrog`` migrates a SQLite store, the unit's ``Documentation=``
resolves, the wheel's licence is installed. A second environment without extras shows
each missing extra's one-line error (exit 2), and that the pip line it prints installs it.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import sqlite3
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.support.checkout import source_copy

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "admin-guide.md"
BLOCK = re.compile(r"<!-- install:begin -->\n```sh\n(.*?)```\n<!-- install:end -->", re.S)
MOVED = ("/opt/icefrog", "/usr/local/bin", "/usr/share/doc/icefrog-slurm")
UNIT_DOCS = "file:///usr/share/doc/icefrog-slurm/"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _env(bin_dir: Path) -> dict[str, str]:
    """The caller's environment (pip's settings, HOME) without this venv, ``bin_dir`` first
    on PATH, the system's python3 after it."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    return env


def _run(argv: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The guide's block, run: (temporary root, source copy, the block's stdout)."""
    if shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") is None:
        pytest.skip("no python3 on the system PATH")
    root = tmp_path_factory.mktemp("install")
    src = source_copy(root / "src")
    found = BLOCK.search(GUIDE.read_text())
    assert found, "docs/admin-guide.md: no shell block between the install markers"
    script = found.group(1)
    for path in MOVED:
        assert path in script, f"the install block no longer names {path}: update this test"
    moved = dict(zip(MOVED, (root / "opt-icefrog", root / "bin", root / "doc"), strict=True))
    for path, there in moved.items():
        script = script.replace(path, str(there))
    (root / "bin").mkdir()
    done = _run(["bash", "-euo", "pipefail", "-c", script], cwd=src, env=_env(root / "bin"))
    assert done.returncode == 0, done.stdout + done.stderr
    return root, src, done.stdout


def test_the_guides_install_steps_run(installed: tuple[Path, Path, str]) -> None:
    root, _, out = installed
    venv = root / "opt-icefrog"
    assert "icefrog 0.1.0" in out.splitlines()
    assert (root / "bin" / "icefrog").resolve() == (venv / "bin" / "icefrog").resolve()
    assert f"wrote {root / 'doc' / 'admin-guide.md'}" in out
    examples = sorted(p.name for p in (root / "doc" / "examples").iterdir())
    assert "icefrog-controller.service" in examples and "icefrog.toml.example" in examples
    assert "slurm.conf.a800.example" in examples and "gres.conf.a800-4gpu.example" in examples
    # the unit's Documentation= names files the command wrote
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(root / "doc" / "examples" / "icefrog-controller.service")
    for uri in unit["Unit"]["Documentation"].split():
        assert uri.startswith(UNIT_DOCS), uri
        assert (root / "doc" / uri.removeprefix(UNIT_DOCS)).is_file(), uri
    # the licence travels in the wheel's metadata; the extras are importable
    [licence] = venv.glob("lib/python3*/site-packages/icefrog_slurm-*.dist-info/licenses/LICENSE")
    assert "Apache License" in licence.read_text()
    python = str(venv / "bin" / "python")
    done = _run([python, "-c", "import psycopg, prometheus_client"], cwd=root, env=_env(root))
    assert done.returncode == 0, done.stderr


def test_the_wheel_builds_clean_and_carries_the_files(installed: tuple[Path, Path, str]) -> None:
    """An isolated build (the pinned setuptools, fetched) warns of nothing (a licence table
    once made setuptools announce the end of such builds) and the wheel holds the licence,
    the examples (not the dev cluster) and the guides."""
    root, src, _ = installed
    pip = str(root / "opt-icefrog" / "bin" / "pip")
    argv = [pip, "wheel", "-v", "--no-deps", ".", "-w", str(root / "wheel")]
    done = _run(argv, cwd=src, env=_env(root))
    assert done.returncode == 0, done.stderr
    log = done.stdout + done.stderr
    assert not re.search(r"[Ww]arning: (?!.*byte-compiling is disabled)", log), log
    [wheel] = (root / "wheel").glob("icefrog_slurm-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        assert "License-Expression: Apache-2.0" in whl.read(metadata).decode()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    for name in ("examples/icefrog-controller.service", "examples/icefrog.toml.example",
                 "examples/slurm.conf.a800.example", "docs/admin-guide.md"):  # fmt: skip
        assert f"icefrog_slurm/{name}" in names, name
    assert not [n for n in names if "/dev/" in n or n.endswith("cluster.sh")]


def test_the_installed_icefrog_migrates_a_store(installed: tuple[Path, Path, str]) -> None:
    root, _, _ = installed
    db = root / "state" / "icefrog.db"
    argv = [str(root / "bin" / "icefrog"), "db", "upgrade", "--url", f"sqlite:///{db}"]
    done = _run(argv, cwd=root, env=_env(root / "bin"))
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as conn:
        [(revision,)] = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    assert revision


def test_without_extras_each_missing_one_is_one_line(installed: tuple[Path, Path, str]) -> None:
    root, src, _ = installed
    bare = root / "bare"
    env = _env(bare / "bin")
    assert _run(["python3", "-m", "venv", str(bare)], cwd=root, env=env).returncode == 0
    done = _run([str(bare / "bin" / "pip"), "install", "-q", "."], cwd=src, env=env)
    assert done.returncode == 0, done.stderr
    icefrog = str(bare / "bin" / "icefrog")
    hint = "needs the {0} extra: pip install 'icefrog-slurm[{0}]'"

    url = "postgresql+psycopg://icefrog:secret@127.0.0.1:1/icefrog"
    done = _run([icefrog, "db", "upgrade", "--url", url], cwd=root, env=env)
    assert (done.returncode, _last_line(done)) == (
        2,
        f"icefrog db: error: a postgresql+psycopg:// database URL {hint.format('postgres')}",
    )
    done = _run([icefrog, "launch", "--gpus", "1", "--", "train.py"], cwd=root, env=env)
    assert (done.returncode, _last_line(done)) == (
        2,
        f"icefrog launch: error: the training {hint.format('launcher')}",
    )
    config = root / "metrics.toml"
    state = root / "bare-state"
    config.write_text(
        f'[state]\ndir = "{state}"\n[store]\nurl = "sqlite:///{state}/icefrog.db"\n'
        f'[inbox]\ndir = "{state}/inbox"\narchive_dir = "{state}/archive"\n'
        "[metrics]\nport = 9464\n"
    )
    done = _run([icefrog, "controller", "--config", str(config)], cwd=root, env=env)
    assert (done.returncode, _last_line(done)) == (
        2,
        f"icefrog controller: error: metrics.port {hint.format('metrics')}",
    )
    assert not state.exists()
    # the line's advice works in the environment icefrog is in: only the extra is added
    done = _run([str(bare / "bin" / "pip"), "install", "-q", "icefrog-slurm[metrics]"],
                cwd=root, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    python = str(bare / "bin" / "python")
    done = _run([python, "-c", "import prometheus_client"], cwd=root, env=env)
    assert done.returncode == 0, done.stderr
