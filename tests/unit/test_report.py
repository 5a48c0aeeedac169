"""The reports' pure parts: time formats, field lists, GPU-hour integration and counts."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.errors import InputError
from icefrog_slurm.report import jobs, timefmt
from icefrog_slurm.report.envelope import envelope, seconds
from icefrog_slurm.report.select import (
    parse_ids,
    parse_names,
    parse_partitions,
    parse_states,
    visible_owner,
)
from icefrog_slurm.report.table import (
    Field,
    field_index,
    parse_format,
    parse_letter_format,
    parse_long_format,
    parse_sort,
    render_table,
    sort_rows,
)
from icefrog_slurm.report.timefmt import format_duration, format_time, parse_time
from icefrog_slurm.store.views import Decided


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


NOW = ts("2026-03-10T15:30:20")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01", "2026-03-01T00:00:00"),
        ("2026-03-01T07:05", "2026-03-01T07:05:00"),
        ("2026-03-01T07:05:09", "2026-03-01T07:05:09"),
        ("03/01", "2026-03-01T00:00:00"),
        ("3/1/25-07:05", "2025-03-01T07:05:00"),
        ("12:00", "2026-03-10T12:00:00"),
        ("16:00:01", "2026-03-09T16:00:01"),  # still to come today: yesterday's
        ("now", "2026-03-10T15:30:20"),
        ("NOW-2hours", "2026-03-10T13:30:20"),
        ("now-90", "2026-03-10T15:28:50"),
        ("now-3days", "2026-03-07T15:30:20"),
        ("now-1w", "2026-03-03T15:30:20"),
        ("now+5min", "2026-03-10T15:35:20"),
        ("today", "2026-03-10T00:00:00"),
        ("midnight", "2026-03-10T00:00:00"),
        ("noon", "2026-03-10T12:00:00"),
        ("teatime", "2026-03-09T16:00:00"),  # 16:00 is still to come at 15:30
    ],
)
def test_parse_time_accepts_sacct_formats(text: str, expected: str) -> None:
    assert format_time(parse_time(text, now=NOW)) == expected


@pytest.mark.parametrize(
    "text", ["", "yesterday", "2026-02-30", "2026-3-1", "25:00", "now-2fortnights", "03/01-7"]
)
def test_parse_time_refuses_the_rest_naming_it(text: str) -> None:
    with pytest.raises(InputError, match=f"-S {text!r}: not a time"):
        parse_time(text, now=NOW, option="-S")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, ""), (0, "00:00:00"), (59.6, "00:01:00"), (3725, "01:02:05"), (-5, "00:00:00")],
)
def test_format_duration_like_sacct_elapsed(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_duration_days_and_absent_times() -> None:
    assert format_duration(2 * 86400 + 3 * 3600 + 4) == "2-03:00:04"
    assert format_time(None) == "Unknown"


FIELDS = field_index(
    [Field[str]("Name", 6, lambda r: r), Field[str]("Len", 4, lambda r: str(len(r)), left=True)]
)


def test_format_widths_justification_and_truncation() -> None:
    columns = parse_format("name,LEN", FIELDS, option="--format")
    assert render_table(columns, ["abc", "abcdefghi"], header=True) == [
        "  Name Len",
        "------ ----",
        "   abc 3",
        "abcde+ 9",
    ]
    columns = parse_format("Name%-3, Len%2", FIELDS, option="--format")
    assert render_table(columns, ["abcd"], header=True) == ["Nam Le", "--- --", "ab+  4"]
    squeue = render_table(columns, ["a"], header=True, squeue_style=True)
    assert squeue == ["NAM LE", "a    1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Name,Nope", "unknown field 'Nope'; valid fields: Name, Len"),
        ("Name%x", "unknown field 'Name%x'"),
        ("Name%0", "'Name%0': the width must be at least 1"),
        (" , ", "no fields given"),
    ],
)
def test_bad_format_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_format(text, FIELDS, option="--format")


def test_job_ids_and_states() -> None:
    assert parse_ids("1, 107,12_3", option="-j") == {"1", "107", "12_3"}
    with pytest.raises(InputError, match="-j: 'x1' is not a job id"):
        parse_ids("1,x1", option="-j")
    assert parse_states("r,PD,completed,Cancelled", option="-s") == {
        "running",
        "pending",
        "finished",
        "cancelled",
    }
    assert parse_states("running,all", option="-s") is None
    with pytest.raises(InputError, match="unknown job state 'DONE'"):
        parse_states("DONE", option="-s")


def d(
    round_no: int, t: float, gpus: int, *nodes: str, shared: bool = False, frozen: int = 0
) -> Decided:
    return Decided(
        round_no,
        t,
        Allocation(job_id=1, gpus=gpus, batch=64, frozen=frozen, shared=shared, nodes=nodes),
    )


def test_gpu_seconds_integrates_each_decision_until_the_next_within_the_run() -> None:
    history = [d(1, 0, 2, "a"), d(2, 100, 4, "a", "b"), d(3, 250, 0), d(4, 400, 1, "a")]
    # started at 50, ended at 450: 2·50 + 4·150 + 0 + 1·50
    assert jobs.gpu_seconds(history, start=50, end=450) == 750
    # ended before the last decisions: nothing after the end counts
    assert jobs.gpu_seconds(history, start=0, end=120) == 2 * 100 + 4 * 20
    # started after every decision: only the last one, from the start
    assert jobs.gpu_seconds(history, start=420, end=500) == 80
    assert jobs.gpu_seconds(history, start=None, end=500) == 0
    assert jobs.gpu_seconds([], start=0, end=500) == 0


def test_restarts_and_reallocations() -> None:
    history = [
        d(1, 0, 0),  # waits
        d(2, 1, 2, "a"),  # first start: neither
        d(3, 2, 2, "a", frozen=3),  # frozen layers alone: applied in place
        d(4, 3, 2, "b"),  # moved: both
        d(5, 4, 0),  # preempted: a reallocation
        d(6, 5, 0),
        d(7, 6, 2, "b"),  # resumed: a restart
        d(8, 7, 1, "b", shared=True),  # resized onto a shared GPU: both
    ]
    assert jobs.restarts_and_reallocations(history) == (3, 3)
    assert jobs.restarts_and_reallocations([d(1, 0, 2, "a", "b"), d(2, 1, 2, "b", "a")]) == (0, 0)
    assert jobs.restarts_and_reallocations([]) == (0, 0)


# --- SLURM_TIME_FORMAT, squeue -O and --sort, privacy ---------------------------------


@pytest.fixture
def _standard_time_style() -> Iterator[None]:
    yield
    timefmt.use_time_style(timefmt.STANDARD)


@pytest.mark.usefixtures("_standard_time_style")
@pytest.mark.parametrize(
    ("style", "when", "expected"),
    [
        (None, "2026-03-10T09:05:00", "2026-03-10T09:05:00"),
        ("standard", "2026-03-10T09:05:00", "2026-03-10T09:05:00"),
        ("relative", "2026-03-10T09:05:07", "09:05:07"),  # today
        ("relative", "2026-03-09T09:05:07", "Ystday 09:05"),
        ("relative", "2026-03-11T09:05:07", "Tomorr 09:05"),
        ("relative", "2026-03-13T09:05:07", "Fri 09:05"),  # the coming week
        ("relative", "2026-04-25T09:05:07", "25 Apr"),
        ("relative", "2012-06-06T09:05:07", "6 Jun 2012"),
        ("%H:%M %d/%m", "2026-03-10T09:05:00", "09:05 10/03"),
    ],
)
def test_slurm_time_format_styles(style: str | None, when: str, expected: str) -> None:
    timefmt.use_time_style(timefmt.parse_time_style(style, now=NOW))
    assert format_time(ts(when)) == expected
    assert format_time(None) == "Unknown"


@pytest.mark.parametrize("bad", ["fancy", "%H\n%M", "%" * 300, "relative "])
def test_slurm_time_format_bad_values(bad: str) -> None:
    with pytest.raises(InputError, match="SLURM_TIME_FORMAT"):
        timefmt.parse_time_style(bad, now=NOW)


FIELDS3 = field_index(
    [
        Field("A", 3, lambda r: str(r[0])),
        Field("B", 4, lambda r: str(r[1])),
    ]
)


def test_long_format_items() -> None:
    cols = parse_long_format("a,B:.6,a:2|", FIELDS3, option="-O")
    assert [(c.field.name, c.width, c.left, c.suffix) for c in cols] == [
        ("A", 20, True, ""),  # squeue -O: 20 columns without a size
        ("B", 6, False, ""),
        ("A", 2, True, "|"),
    ]
    # no separator, values cut without a mark, trailing spaces kept: as squeue prints -O
    assert render_table(cols, [(1, "xy"), ("abc", "toolong")], header=True, squeue_style=True) == [
        "A" + " " * 24 + "BA |",
        "1" + " " * 23 + "xy1 |",
        "abc" + " " * 17 + "toolonab|",
    ]


def test_letter_format_items() -> None:
    letters = {"a": "A", "b": "B"}
    cols = parse_letter_format("[%.4a|%b]", letters, FIELDS3, option="-o")
    assert [(c.prefix, c.width, c.left, c.suffix) for c in cols] == [
        ("[", 4, False, ""),
        ("|", 0, True, "]"),  # no size: the value's own width
    ]
    assert render_table(cols, [(12345, "xy")], header=True, squeue_style=True) == [
        "[   A|B]",
        "[1234|xy]",  # cut to 4 without a mark, as squeue
    ]
    with pytest.raises(InputError, match="'%z' is not a field here"):
        parse_letter_format("%a %z", letters, FIELDS3, option="-o")
    with pytest.raises(InputError, match="printable"):
        parse_letter_format("%a\x1b[2J%b", letters, FIELDS3, option="-o")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("C", "unknown field 'C'"),
        ("A:0", "at least 1"),
        ("A:9999999", "at most"),
        ("A:5\x1b[2J", "printable"),
        (",", "no fields"),
    ],
)
def test_long_format_bad_items(text: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        parse_long_format(text, FIELDS3, option="-O")


def test_sort_rows_numbers_by_value_then_text() -> None:
    rows = [(10, "b"), (9, "a"), (10, "a"), ("x", "c")]
    assert sort_rows(rows, parse_sort("A", FIELDS3, option="--sort")) == [
        (9, "a"), (10, "b"), (10, "a"), ("x", "c"),
    ]  # fmt: skip
    assert sort_rows(rows, parse_sort("-A,+B", FIELDS3, option="--sort")) == [
        ("x", "c"), (10, "a"), (10, "b"), (9, "a"),
    ]  # fmt: skip
    with pytest.raises(InputError, match="unknown field 'Z'"):
        parse_sort("A,-Z", FIELDS3, option="--sort")


@pytest.mark.parametrize(
    ("uid", "groups", "private", "operator_gid", "owner"),
    [
        (1001, frozenset({100}), False, None, None),  # Slurm's default: everyone's jobs
        (1001, frozenset({100}), True, None, 1001),
        (0, frozenset({0}), True, None, None),  # root
        (1001, frozenset({100, 50}), True, 50, None),  # an operator
        (1001, frozenset({100}), True, 50, 1001),
    ],
)
def test_visible_owner(
    uid: int, groups: frozenset[int], private: bool, operator_gid: int | None, owner: int | None
) -> None:
    assert (
        visible_owner(uid=uid, groups=groups, private=private, operator_gid=operator_gid) == owner
    )


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_names, "a,\x07b", "is not a job name"),
        (parse_names, "x" * 2000, "is not a job name"),
        (parse_names, ",", "give at least one item"),
        (parse_partitions, "gpu,debug queue", "is not a partition name"),
        (parse_partitions, "", "give at least one item"),
    ],
)
def test_names_and_partitions_bad(parse: Any, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse(text, option="--x")


def test_envelope_shape_and_whole_seconds() -> None:
    doc = envelope([{"job_id": 1}])
    assert list(doc) == ["meta", "errors", "warnings", "jobs"]
    assert doc["meta"]["Slurm"]["version"] == {"major": 22, "micro": 0, "minor": 5}
    assert (seconds(None), seconds(2.6), seconds(1779000000.4)) == (None, 3, 1779000000)
