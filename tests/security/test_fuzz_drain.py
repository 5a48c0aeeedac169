"""Fuzz: the report parser and whole drains into SQLite and a real Postgres.

Random and mutated reports (deep JSON, huge integers, NaN and Infinity, NUL, lone
surrogates and control characters, wrong types, missing and unknown fields, cut or flipped
bytes) under random and hostile names (Unicode digits, bytes that are not UTF-8, tokens).
Properties: ``parse_envelope`` raises nothing but the project's own ``InputError``; a drain
raises nothing, defers nothing (no fault is transient here) and leaves no file in the inbox:
every entry ends archived or deleted, every recorded reason printable. The credential check
is a stand-in (``FAKE:<digest>``; the munge path is tested for real elsewhere); the store,
the files and the inbox are real. Derandomized and bounded (about a minute in all).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icefrog_slurm import security
from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import parse_envelope
from icefrog_slurm.store.sql import SqlStore
from tests.security.inbox_support import SlurmTable, spec_payload

JOBS = ("101", "202")
PAYLOADS: dict[str, dict[str, Any]] = {
    "register": spec_payload(),
    "metric": {"epoch": 1, "name": "val_acc", "value": 0.5},
    "progress": {"epoch": 1, "samples_done": 10, "effective_samples_done": 9.5},
    "grad_stats": {"epoch": 1, "frozen": 0, "grad_var": [1.0], "grad_sqr": [2.0]},
    "finished": {"reason": "max_epochs", "epoch": 2, "final_metric": 0.9},
    "profile": {"samples": [{"gpus": 1, "batch": 8, "frozen": 0, "t_fwd_s": 0.1,
                             "t_bwd_s": 0.2, "t_sync_s": 0.0, "t_iter_s": 0.3,
                             "samples_per_s": 30.0}]},
}  # fmt: skip
RAW_TOKENS = [
    "NaN", "Infinity", "-Infinity", "1e999", "1" * 4000, str(2**63), str(-(2**63) - 1),
    str(2**31), str(2**31 - 1), "-1", '"\\ud800"', '"a\\u0000b"', '"\\u001b[31m"',
    '"\\udfff\\ud800"', "[" * 3000 + "]" * 3000, '{"a":' * 40 + "1" + "}" * 40, "true",
    '""', "[]", "{}", '"' + "x" * 5000 + '"', "0.1", "-0.0", "1E+2",
]  # fmt: skip
MARK = '"\\u2603MARK\\u2603"'

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=12,
)  # fmt: skip


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, int, bytes]:
    """(kind, seq, bytes): an honest report of a random kind, then mutated."""
    kind = draw(st.sampled_from(sorted(PAYLOADS)))
    seq = draw(st.integers(0, 20))
    doc: dict[str, Any] = {"version": 1, "kind": kind, "slurm_job_id": draw(st.sampled_from(JOBS)),
                           "job_name": "cnn", "seq": seq, "time": 1000.0 + seq,
                           "payload": json.loads(json.dumps(PAYLOADS[kind]))}  # fmt: skip
    raw_token = None
    for _ in range(draw(st.integers(0, 3))):
        payload = doc.get("payload")
        target = draw(st.sampled_from([doc, payload] if isinstance(payload, dict) else [doc]))
        key = draw(st.sampled_from([*target, "extra"]))
        action = draw(st.sampled_from(["raw", "value", "delete"]))
        if action == "delete":
            target.pop(key, None)
        elif action == "value":
            target[key] = draw(json_values)
        elif raw_token is None:
            target[key], raw_token = "\u2603MARK\u2603", draw(st.sampled_from(RAW_TOKENS))
    body = {k: v for k, v in doc.items()}
    digest = security.body_digest(body) if _digestible(body) else "x"
    doc["credential"] = draw(st.sampled_from([f"FAKE:{digest}", "FAKE:other", "MUNGE:junk",
                                              "FAKE-DOWN", ""]))  # fmt: skip
    text = json.dumps(doc, allow_nan=True)
    if raw_token is not None:
        text = text.replace(MARK, raw_token)
    data = text.encode("utf-8", "surrogatepass")
    cut = draw(st.sampled_from([None, None, None, "cut", "flip"]))
    if cut == "cut" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif cut == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    return kind, seq, data


def _digestible(body: dict[str, Any]) -> bool:
    try:
        json.dumps(body, allow_nan=False)
    except ValueError:
        return False
    return True


odd_names = st.sampled_from(
    [b"\xc2\xb2", b"\xff", b"\xef\xbc\x91\xef\xbc\x90\xef\xbc\x91", b"101\n", b"101.",
     b"101.zz", b"-1", b"1" * 19, b"101." + b"a" * 65, b".hidden", b"0-metric.json",
     b"\xb2-metric.json", b"1-metric.json\n", b"1-METRIC.json", b"x" * 250]
) | st.binary(min_size=1, max_size=24).filter(
    lambda b: b"/" not in b and b"\x00" not in b and b not in (b".", b"..")
)  # fmt: skip
folders = st.sampled_from([j.encode() for j in JOBS] + [b"101." + b"ab" * 16]) | odd_names


@st.composite
def inbox_entries(draw: st.DrawFn) -> list[tuple[bytes, bytes, bytes]]:
    """(folder, file, content) for a few entries of one inbox."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        kind, seq, data = draw(documents())
        name = f"{seq}-{kind}.json".encode()
        out.append((draw(folders), draw(st.sampled_from([name, name, name]) | odd_names), data))
    return out


@settings(max_examples=3000, derandomize=True, deadline=None)
@given(documents())
def test_the_parser_raises_only_its_own_rejection(case: tuple[str, int, bytes]) -> None:
    with contextlib.suppress(InputError):  # anything else fails the test
        parse_envelope(case[2])


def _fake_decode(credential: str) -> security.DecodedCredential:
    if credential == "FAKE-DOWN":
        raise security.MungeUnavailable("munged: no answer")  # real munged answers: rejected
    if not credential.startswith("FAKE:"):
        raise security.MungeError("credential rejected by the stand-in")
    return security.DecodedCredential(status=0, uid=0, gid=0, payload=credential[5:])


_ids = itertools.count()


@pytest.mark.timeout(300)
@settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(entries=inbox_entries())
def test_a_drain_archives_everything_and_raises_nothing(
    store: SqlStore, tmp_path: Path, entries: list[tuple[bytes, bytes, bytes]]
) -> None:
    from icefrog_slurm.store.inbox import ReportInbox

    root = tmp_path / f"case{next(_ids)}"
    inbox = ReportInbox(
        store=store, inbox_dir=root / "inbox", archive_dir=root / "archive",
        slurm_jobs=SlurmTable({j: (0, True) for j in JOBS}), decode=_fake_decode,
        folder_grace_s=0.0,  # a dot file (being written) counts as left behind at once
    )  # fmt: skip
    inbox.prepare()
    base = os.fsencode(root / "inbox")
    for folder, name, data in entries:
        where = os.path.join(base, folder)
        if not os.path.lexists(where):
            os.mkdir(where, 0o700)
        if os.path.isdir(where) and not os.path.lexists(os.path.join(where, name)):
            with open(os.path.join(where, name), "wb") as fh:
                fh.write(data)
    result = inbox.drain()
    assert result.deferred == 0
    left = [os.path.join(top, n) for top, _d, names in os.walk(base) for n in names]
    assert left == []
    with store.transaction() as tx:
        assert all(r.reason.isprintable() and r.file.isprintable() for r in tx.rejected_reports())
