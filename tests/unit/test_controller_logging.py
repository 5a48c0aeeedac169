"""The controller's log as journald reads it: a syslog priority on every line, quiet libraries."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from icefrog_slurm.commands.controller import THIRD_PARTY_LOGGERS, setup_logging
from icefrog_slurm.settings import settings_from_mapping


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in THIRD_PARTY_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


def test_under_systemd_every_line_carries_its_priority(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging(settings_from_mapping({}), {"JOURNAL_STREAM": "8:1"})
    log = logging.getLogger("icefrog_slurm.test")
    log.info("round 3")
    log.warning("slurm unavailable")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("tick failed")
    logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
    logging.getLogger("alembic.runtime.migration").warning("a real problem")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "<6>INFO icefrog_slurm.test: round 3"
    assert lines[1] == "<4>WARNING icefrog_slurm.test: slurm unavailable"
    assert lines[2] == "<3>ERROR icefrog_slurm.test: tick failed"
    traceback = lines[3 : lines.index("<3>ValueError: boom") + 1]
    assert len(traceback) >= 3 and all(line.startswith("<3>") for line in traceback)
    assert lines[-1] == "<4>WARNING alembic.runtime.migration: a real problem"
    assert not any("Context impl" in line for line in lines)  # a library's INFO: quiet


def test_on_a_terminal_lines_have_a_time_and_no_prefix(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging(settings_from_mapping({"logging": {"level": "DEBUG"}}), {})
    logging.getLogger("alembic").debug("library detail")  # DEBUG: everything, libraries too
    [line] = capsys.readouterr().out.splitlines()
    assert not line.startswith("<") and line.endswith("DEBUG alembic: library detail")
