"""The migrations match the models on both databases, and `icefrog db upgrade` runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from icefrog_slurm.cli import main
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.store import migrate
from icefrog_slurm.store.models import Base
from icefrog_slurm.store.sql import SqlStore, make_engine


def test_upgrade_on_empty_db_matches_the_models(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
            assert ctx.get_current_revision() == migrate.head_revision()
            tables = set(inspect(conn).get_table_names())
        assert set(Base.metadata.tables) <= tables
        migrate.upgrade(empty_db_url)  # a second upgrade is a no-op
        migrate.alembic_config(empty_db_url)
        from alembic import command

        command.downgrade(migrate.alembic_config(empty_db_url), "base")
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()


def test_store_refuses_an_unmigrated_db(empty_db_url: str) -> None:
    with pytest.raises(IcefrogError, match="icefrog db upgrade"):
        SqlStore(empty_db_url)


def test_cli_db_upgrade_from_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state" / "x.db"
    config = tmp_path / "icefrog.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{db}"\n')
    assert main(["db", "upgrade", "--config", str(config)]) == 0
    assert migrate.head_revision() in capsys.readouterr().out
    SqlStore(f"sqlite:///{db}").close()  # migrated: the store opens it


def test_cli_db_upgrade_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "icefrog.toml"
    config.write_text("[store]\nurll = 'x'\n")
    assert main(["db", "upgrade", "--config", str(config)]) == 2
    assert "store.urll: unknown field" in capsys.readouterr().err
    assert main(["db", "upgrade", "--url", "nosuchdb://x"]) == 2


def test_a_wheel_install_can_migrate(tmp_path: Path) -> None:
    """Admins `pip install` a wheel: the migrations must be inside it. Build the wheel, install
    it into a bare folder, and run `icefrog db upgrade` from there (not from this checkout)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(repo), "-w", str(tmp_path / "w")],
        check=True,
        cwd=tmp_path,
    )
    [wheel] = (tmp_path / "w").glob("icefrog_slurm-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    code = (
        "import sys, icefrog_slurm; from icefrog_slurm.cli import main; "
        f"assert icefrog_slurm.__file__.startswith({str(site)!r}), icefrog_slurm.__file__; "
        f"sys.exit(main(['db', 'upgrade', '--url', {url!r}]))"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            revision = MigrationContext.configure(conn).get_current_revision()
        assert revision == migrate.head_revision()
    finally:
        engine.dispose()
