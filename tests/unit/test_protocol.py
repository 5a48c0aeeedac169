import json

import pytest

from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import (
    MAX_REPORT_BYTES,
    Envelope,
    GradStats,
    body_digest,
    parse_envelope,
    parse_payload,
)


def _envelope(kind: str, payload: dict[str, object]) -> Envelope:
    return Envelope(
        version=1,
        kind=kind,
        slurm_job_id="42",
        job_name="cnn",
        seq=3,
        time=1.5,
        payload=payload,
        credential="MUNGE:abc",
    )


def test_grad_stats_round_trip() -> None:
    env = _envelope(
        "grad_stats", {"epoch": 2, "frozen": 1, "grad_var": [0.5, 1.0], "grad_sqr": [2.0, 3.0]}
    )
    back = parse_envelope(env.to_json())
    assert back == env
    assert parse_payload(back.kind, back.payload) == GradStats(
        epoch=2, frozen=1, grad_var=(0.5, 1.0), grad_sqr=(2.0, 3.0)
    )


def test_digest_covers_the_payload() -> None:
    a = _envelope("metric", {"epoch": 1, "name": "val_acc", "value": 0.5})
    b = _envelope("metric", {"epoch": 1, "name": "val_acc", "value": 0.9})
    assert body_digest(a.body()) != body_digest(b.body())
    # The controller recomputes the digest from the parsed document: it must match.
    assert body_digest(parse_envelope(a.to_json()).body()) == body_digest(a.body())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(kind="drop_tables"), "report.kind"),
        (lambda d: d.update(slurm_job_id="42; rm"), "slurm_job_id"),
        (lambda d: d.update(extra=1), "report.extra: unknown field"),
        (lambda d: d["payload"].update(value=float("inf")), "Infinity is not a JSON number"),
        (lambda d: d["payload"].update(epoch=-1), "epoch"),
    ],
)
def test_malformed_reports_are_rejected(mutate, message) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(_envelope("metric", {"epoch": 1, "name": "val_acc", "value": 0.5}).to_json())
    mutate(data)
    with pytest.raises(InputError, match=message):
        parse_envelope(json.dumps(data))


def test_oversized_report_is_rejected_unread() -> None:
    with pytest.raises(InputError, match="more than the limit"):
        parse_envelope(b" " * (MAX_REPORT_BYTES + 1))


def test_rejection_reason_does_not_copy_a_huge_field() -> None:
    """Rejected reports are stored with their reason: it must name the field, not copy it."""
    data = json.loads(_envelope("metric", {"epoch": 1, "name": "val_acc", "value": 0.5}).to_json())
    data["payload"]["value"] = list(range(20_000))
    with pytest.raises(InputError, match=r"value: must be a number") as err:
        parse_envelope(json.dumps(data))
    assert len(str(err.value)) < 200
