"""A database password never reaches a message: a careless admin's URLs (the password as a
libpq ``?password=`` query key, in a URL that does not parse) through every place that
shows a URL. SQLAlchemy's ``hide_password`` masks only ``user:password@``."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from icefrog_slurm.cli import main
from icefrog_slurm.commands.preflight import check_database
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.settings import Settings, StoreSettings
from icefrog_slurm.store import migrate
from icefrog_slurm.store.dburl import shown
from icefrog_slurm.store.leader import lock_path
from icefrog_slurm.store.readonly import make_readonly_engine
from icefrog_slurm.store.sql import SqlStore, make_engine

SECRET = "hunter2"
LEAKY = [
    f"postgresql+psycopg://icefrog@127.0.0.1:1/icefrog?password={SECRET}",  # libpq's key
    f"postgresql+psycopg://icefrog:pw@127.0.0.1:1/icefrog?sslpassword={SECRET}",
    f"postgresql+psycopg://icefrog:{SECRET}@dbhost:notaport/icefrog",  # does not parse
    f"postgresql+psycopg://icefrog:{SECRET}@[::1/icefrog",
    f"icefrog {SECRET}",  # no scheme at all
    f"nosuch://icefrog:pw@dbhost/icefrog?password={SECRET}",  # no such dialect
]


def test_shown_masks_every_password_and_keeps_the_rest() -> None:
    url = f"postgresql+psycopg://icefrog:{SECRET}@dbhost/icefrog?password={SECRET}&host=h2"
    assert shown(url) == "postgresql+psycopg://icefrog:***@dbhost/icefrog?host=h2&password=***"
    assert (
        shown(f"postgresql+psycopg://icefrog:{SECRET}@h:notaport/x") == "postgresql+psycopg://..."
    )
    assert shown(f"{SECRET}") == "..."
    assert shown("sqlite:////var/lib/icefrog/icefrog.db") == "sqlite:////var/lib/icefrog/icefrog.db"


@pytest.mark.parametrize("url", LEAKY)
def test_no_engine_and_no_check_shows_the_password(url: str) -> None:
    """Each refuses every URL here (the server at port 1 does not answer) in one error."""
    calls = [
        lambda: make_engine(url),
        lambda: make_readonly_engine(url),
        lambda: migrate.inspect_database(url),
        lambda: migrate.leader_locked(url).__enter__(),
        lambda: SqlStore(url),
        lambda: check_database(Settings(store=StoreSettings(url=url)), config="c.toml"),
    ]
    for call in calls:  # an engine is made without connecting: only a bad URL fails there
        try:
            call()
        except IcefrogError as exc:
            assert SECRET not in str(exc), str(exc)


@pytest.mark.parametrize("url", LEAKY)
@pytest.mark.parametrize("action", [["current"], ["downgrade", "base"], ["upgrade"]])
def test_icefrog_db_names_the_problem_without_the_password(
    url: str, action: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A port that is no number was a traceback and exit 1 in ``db current`` and
    ``db downgrade``; now one line, exit 2 (1 for a server that does not answer)."""
    code = main(["db", *action, "--url", url])
    out, err = capsys.readouterr()
    assert code in (1, 2) and "Traceback" not in err, err
    assert SECRET not in out + err, err
    if "notaport" in url:
        assert code == 2 and "its port is not a number" in err


def test_the_leader_lock_refusal_hides_the_password() -> None:
    with pytest.raises(IcefrogError) as caught:
        lock_path(make_url(f"mysql://icefrog@dbhost/icefrog?password={SECRET}"))
    assert SECRET not in str(caught.value) and "password=***" in str(caught.value)
