"""The controller's log as journald reads it: a syslog priority on every line, quiet libraries,
and every line about a job names it (``job=<id> slurm_job=<id>``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from icefrog_slurm.commands.controller import THIRD_PARTY_LOGGERS, setup_logging
from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.settings import Settings, settings_from_mapping
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import TraceJob
from icefrog_slurm.store.inbox import DrainResult
from tests.integration.store.helpers import spec
from tests.support.trusting_inbox import signed, trusting_inbox


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


# ----- every line about a job names it: ``journalctl -u icefrog-controller | grep -w job=N``
JOB_FIELDS = re.compile(r"^job=(\d+) slurm_job=(\d+): ")


def test_the_controllers_lines_about_a_job_carry_job_and_slurm_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The production controller over the simulated cluster, two jobs from submission to
    their end: the round's line for each job it starts, each reconcile step's line and each
    state change's line start with ``job=<icefrog id> slurm_job=<Slurm id>``, the very ids
    of the plan."""
    jobs = [TraceJob(f"j{i}", 0.0, "resnet18-cifar10", 1, 128) for i in range(2)]
    engine = Engine(jobs, StandInPolicy(), settings=Settings(), options=SimOptions(gpus=4))
    pairs: set[tuple[str, str]] = set()
    engine.controller.on_tick = lambda r: pairs.update(
        (str(j.job_id), j.slurm_job_id) for j in r.plan.jobs
    )
    with caplog.at_level(logging.INFO, logger="icefrog_slurm.controller"):
        result = engine.run()  # closes the engine
    assert all(j.finish is not None for j in result.jobs)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("icefrog_slurm.")]
    about_jobs = [m for m in lines if JOB_FIELDS.match(m)]
    said: dict[tuple[str, str], list[str]] = {}
    for m in about_jobs:
        match = JOB_FIELDS.match(m)
        assert match is not None
        said.setdefault(match.group(1, 2), []).append(m[match.end() :])
    assert set(said) == pairs and len(pairs) == 2  # the plan's ids, both jobs
    for story in said.values():
        assert re.fullmatch(r"round 1: start to 1 GPU\(s\), batch \d+, 0 frozen", story[0])
        assert re.fullmatch(r"start done \(released as gpu:1 on sim\d+\)", story[1]), story
        assert "now running" in story[2:], story  # read off Slurm at a later tick
    # the lines about no one job: the rounds and the reconcile passes
    others = [m for m in lines if m not in about_jobs]
    assert others and all(m.startswith(("round ", "reconcile: ")) for m in others), others


def test_the_inboxs_lines_about_a_report_carry_job_and_slurm_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Accepted and rejected reports of a job are logged with its icefrog and Slurm ids; a
    file name a user chose cannot forge a line (it is printed escaped, on the same line)."""
    sid = "4242"
    with trusting_inbox(tmp_path) as inbox:
        folder = tmp_path / "inbox" / sid
        folder.mkdir()
        register = json.loads(json.dumps(dataclasses.asdict(spec())))
        (folder / "0-register.json").write_text(signed(sid, "register", 0, register))
        with caplog.at_level(logging.INFO, logger="icefrog_slurm.store.inbox"):
            assert inbox.drain() == DrainResult(accepted=1)
            with inbox.store.transaction() as tx:
                job = tx.job_by_slurm_id(sid)
            assert job is not None
            progress = {"epoch": 1, "samples_done": 5, "effective_samples_done": 4.5}
            (folder / "1-progress.json").write_text(signed(sid, "progress", 1, progress))
            forged = json.loads(signed(sid, "progress", 2, progress))
            forged["payload"]["samples_done"] = 6  # the credential signs other content
            (folder / "2-progress.json").write_text(json.dumps(forged))
            (folder / "3-x.json\nINFO job=999 slurm_job=1: forged").write_text("{}")
            assert inbox.drain() == DrainResult(accepted=1, rejected=2)
    lines = [r.getMessage() for r in caplog.records]
    fields = f"job={job.id} slurm_job={sid}: report {sid}/"
    assert len(lines) == 4 and all(line.startswith(fields) for line in lines)
    said = sorted(line[len(fields) :].split(" ", 2)[0:2] for line in lines)
    assert said == [
        ["0-register.json", "accepted"],
        ["1-progress.json", "accepted"],
        ["2-progress.json", "rejected:"],
        ["3-x.json\\x0aINFO", "job=999"],  # escaped: one line, led by the true fields
    ]
    assert all("\n" not in line for line in lines)


class _SharedFromRound2(StandInPolicy):
    """The stand-in, but from the second round on every job it places is shared."""

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        result = super().decide(snapshot, settings=settings)
        if snapshot.last_round is None:
            return result
        shared = {i: replace(a, shared=a.gpus > 0) for i, a in result.allocations.items()}
        return PolicyResult(allocations=shared, reasons=result.reasons)


def test_a_resubmitted_job_is_followed_to_its_new_slurm_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A running job moved from a whole GPU to a shared one is resubmitted as a new Slurm
    job: the line of the link names both, and the lines after it carry the new id."""
    jobs = [TraceJob("j0", 0.0, "resnet18-cifar10", 1, 128)]
    engine = Engine(jobs, _SharedFromRound2(), settings=Settings(), options=SimOptions(gpus=4))
    with caplog.at_level(logging.INFO, logger="icefrog_slurm.controller"):
        engine.run()
    story = [m for m in (r.getMessage() for r in caplog.records) if m.startswith("job=1 ")]
    [link] = [m for m in story if "resubmitted" in m]
    match = re.fullmatch(r"job=1 slurm_job=(\d+): resubmitted, was Slurm job (\d+)", link)
    assert match is not None and match.group(1) != match.group(2), link
    new, old = match.group(1, 2)
    before, after = story[: story.index(link)], story[story.index(link) + 1 :]
    assert before and all(m.startswith(f"job=1 slurm_job={old}: ") for m in before), before
    assert any(m.startswith(f"job=1 slurm_job={new}: change done") for m in after), after
