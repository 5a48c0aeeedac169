"""A missing extra ends a command in one line naming the extra, exit 2, nothing started.

Each row runs ``icefrog`` in a child interpreter whose meta path refuses the extra's
modules (as an environment without the extra would), and checks the last stderr line,
the exit code, that no traceback is printed and that nothing was written.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from icefrog_slurm.extras import MissingExtra, require, require_program
from icefrog_slurm.store import migrate

REPO = Path(__file__).resolve().parents[2]

# The child: refuse the named top-level modules, then run the CLI.
_BLOCKED_CLI = """
import sys
from importlib.abc import MetaPathFinder

class Missing(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

BLOCKED = set(sys.argv[1].split(","))
sys.meta_path.insert(0, Missing())
from icefrog_slurm.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _icefrog(
    blocked: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED_CLI, blocked, *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


def _hint(extra: str) -> str:
    return f"needs the {extra} extra: pip install 'icefrog-slurm[{extra}]'"


@pytest.mark.parametrize("command", ["db upgrade --url", "sacct --db", "squeue --db"])
def test_a_postgres_url_without_psycopg(tmp_path: Path, command: str) -> None:
    """The controller's store (db upgrade, as the controller) and a report's read-only one."""
    url = "postgresql+psycopg://icefrog:secret@127.0.0.1:1/icefrog"
    code, line = _icefrog("psycopg", [*command.split(), url], tmp_path)
    name = command.split()[0]
    expected = f"icefrog {name}: error: a postgresql+psycopg:// database URL {_hint('postgres')}"
    assert (code, line) == (2, expected)
    assert "secret" not in line  # the URL's password is not repeated


def test_a_driver_no_extra_installs(tmp_path: Path) -> None:
    """A driver no extra installs: say which URL works, exit 2."""
    url = "postgresql+pg8000://u:secret@127.0.0.1:1/x"
    for argv in (["db", "upgrade", "--url", url], ["sacct", "--db", url]):
        code, line = _icefrog("pg8000", argv, tmp_path)
        assert code == 2, line
        assert line.startswith(f"icefrog {argv[0]}: error: a postgresql+pg8000:// database URL")
        assert "module pg8000" in line and "use postgresql+psycopg://" in line, line
        assert "secret" not in line


def _settings(tmp_path: Path, extra: str) -> Path:
    config = tmp_path / "icefrog.toml"
    state = tmp_path / "state"
    config.write_text(
        f'[state]\ndir = "{state}"\n[store]\nurl = "sqlite:///{state}/icefrog.db"\n'
        f'[inbox]\ndir = "{state}/inbox"\narchive_dir = "{state}/archive"\n{extra}'
    )
    return config


def test_metrics_without_prometheus_client(tmp_path: Path) -> None:
    config = _settings(tmp_path, "[metrics]\nport = 9464\n")
    code, line = _icefrog("prometheus_client", ["controller", "--config", str(config)], tmp_path)
    assert (code, line) == (2, f"icefrog controller: error: metrics.port {_hint('metrics')}")
    assert not (tmp_path / "state").exists()  # stopped before it made anything


def test_pyslurm_backend_without_pyslurm(tmp_path: Path) -> None:
    config = _settings(tmp_path, '[slurm]\nbackend = "pyslurm"\n')
    (tmp_path / "state").mkdir()
    migrate.upgrade(f"sqlite:///{tmp_path / 'state' / 'icefrog.db'}")  # a ready store
    code, line = _icefrog("pyslurm", ["controller", "--once", "--config", str(config)], tmp_path)
    assert code == 2, line
    assert line.startswith(
        f"icefrog controller: error: slurm.backend = 'pyslurm' {_hint('pyslurm')}"
    )
    assert "Slurm 25.11" in line and "slurm.backend = 'cli'" in line


LAUNCH = ["launch", "--gpus", "1", "--workdir", "work"]


def test_launch_without_torch(tmp_path: Path) -> None:
    code, line = _icefrog("torch", [*LAUNCH, "--", "train.py"], tmp_path)
    assert (code, line) == (2, f"icefrog launch: error: the training {_hint('launcher')}")
    assert not (tmp_path / "work").exists()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch installed")
def test_launch_without_torchrun(tmp_path: Path) -> None:
    """torch is there but its ``torchrun`` is not: on PATH, or the path given."""
    code, line = _icefrog("", [*LAUNCH, "--", "train.py"], tmp_path, {"PATH": str(tmp_path)})
    assert (code, line) == (
        2,
        f"icefrog launch: error: the training {_hint('launcher')} (torchrun: not on PATH)",
    )
    argv = [*LAUNCH, "--torchrun", str(tmp_path / "nope"), "--", "train.py"]
    code, line = _icefrog("", argv, tmp_path)
    assert code == 2 and line.endswith(f"({tmp_path / 'nope'}: not found)"), line
    assert not (tmp_path / "work").exists()


def test_launch_dry_run_needs_neither(tmp_path: Path) -> None:
    """--dry-run only prints the command: it runs without torch."""
    code, _ = _icefrog("torch", [*LAUNCH, "--dry-run", "--", "train.py"], tmp_path)
    assert code == 0


def test_require(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require("json", "none", "this")  # present: nothing happens
    with pytest.raises(
        MissingExtra, match=r"^it needs the sim extra: pip install 'icefrog-slurm\[sim\]'$"
    ):
        require("icefrog_no_such_module", "sim", "it")
    # installed but broken (a missing shared library, a missing dependency): says why
    (tmp_path / "icefrog_broken.py").write_text("raise ImportError('libfoo.so: cannot open')\n")
    (tmp_path / "icefrog_halfway.py").write_text("import icefrog_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        MissingExtra, match=r"\(importing icefrog_broken: libfoo\.so: cannot open\)$"
    ):
        require("icefrog_broken", "sim", "it")
    with pytest.raises(MissingExtra, match=r"importing icefrog_halfway: .*icefrog_no_such_dep"):
        require("icefrog_halfway", "sim", "it")
    # load=False looks the module up without importing it
    (tmp_path / "icefrog_heavy.py").write_text("raise SystemExit('imported')\n")
    require("icefrog_heavy", "launcher", "it", load=False)
    assert "icefrog_heavy" not in sys.modules
    monkeypatch.setitem(sys.modules, "icefrog_gone", None)
    with pytest.raises(MissingExtra, match=r"\(where to build it\)$"):
        require("icefrog_gone", "launcher", "it", load=False, hint="where to build it")
    assert MissingExtra("it", "sim").exit_code == 2


def test_require_program(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert require_program("tool", "launcher", "it", path=str(tmp_path)) == str(tool)
    assert require_program(str(tool), "launcher", "it", path="") == str(tool)
    with pytest.raises(MissingExtra, match=r"\(other: not on PATH\)$"):
        require_program("other", "launcher", "it", path=str(tmp_path))
