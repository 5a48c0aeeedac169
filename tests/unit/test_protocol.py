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


def _spec_doc() -> dict[str, object]:
    return {
        "min_gpus": 1,
        "max_gpus": 4,
        "min_batch": 8,
        "max_batch": 64,
        "max_frozen_fraction": 0.9,
        "target_metric": "val_acc",
        "target_op": ">=",
        "target_value": 0.9,
        "max_epochs": 10,
        "samples_per_epoch": 1000,
        "layer_flops": [1.0, 2.0],
        "layer_param_bytes": [3.0, 4.0],
    }


INT32_MAX = 2**31 - 1
SAMPLE = {
    "gpus": 1,
    "batch": 8,
    "frozen": 0,
    "t_fwd_s": 0.1,
    "t_bwd_s": 0.2,
    "t_sync_s": 0.0,
    "t_iter_s": 0.3,
    "samples_per_s": 10.0,
}


@pytest.mark.parametrize(
    ("kind", "payload", "field"),
    [
        ("metric", {"epoch": INT32_MAX + 1, "name": "a", "value": 1.0}, "epoch"),
        ("progress", {"epoch": INT32_MAX + 1, "samples_done": 1, "effective_samples_done": 1.0},
         "epoch"),
        ("grad_stats", {"epoch": INT32_MAX + 1, "frozen": 0, "grad_var": [], "grad_sqr": []},
         "epoch"),
        ("finished", {"reason": "failed", "epoch": INT32_MAX + 1, "final_metric": 0.0}, "epoch"),
        ("register", {**_spec_doc(), "max_batch": INT32_MAX + 1}, "max_batch"),
        ("register", {**_spec_doc(), "max_epochs": INT32_MAX + 1}, "max_epochs"),
        ("register", {**_spec_doc(), "layer_boundaries": [2**40]}, "layer_boundaries"),
        ("profile", {"samples": [{**SAMPLE, "batch": INT32_MAX + 1}]}, "batch"),
        ("profile", {"samples": [{**SAMPLE, "gpus": INT32_MAX + 1}]}, "gpus"),
        ("profile", {"samples": [{**SAMPLE, "frozen": INT32_MAX + 1}]}, "frozen"),
    ],
)  # fmt: skip
def test_integers_of_32_bit_columns_are_bounded(kind: str, payload: dict, field: str) -> None:  # type: ignore[type-arg]
    """Postgres stores these in ``integer`` (+-2^31): a larger value is refused here, by name,
    instead of failing the store's INSERT."""
    data = json.loads(_envelope(kind, payload).to_json())
    with pytest.raises(InputError, match=rf"{field}.*must be <="):
        parse_envelope(json.dumps(data))
    if field != "layer_boundaries":  # the largest value that fits is accepted
        fits = json.loads(json.dumps(payload).replace(str(INT32_MAX + 1), str(INT32_MAX)))
        parse_envelope(_envelope(kind, fits).to_json())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(slurm_job_id="\u00b2"), "ASCII digits"),  # '²'.isdigit() is True
        (lambda d: d.update(slurm_job_id="1" * 19), "ASCII digits"),
        (lambda d: d.update(slurm_job_id="2147483648"), "ASCII digits"),  # squeue refuses it
        (lambda d: d.update(slurm_job_id="0"), "ASCII digits"),
        (lambda d: d.update(slurm_job_id="042"), "ASCII digits"),
        (lambda d: d.update(seq=10**18), "report.seq: must be <="),
        (lambda d: d.update(job_name="a\x1b[2Jb"), "control character"),
        (lambda d: d["payload"].update(name="val\nacc"), "control character"),
    ],
)
def test_ids_names_and_seq_are_plain(mutate, message) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(_envelope("metric", {"epoch": 1, "name": "val_acc", "value": 0.5}).to_json())
    mutate(data)
    with pytest.raises(InputError, match=message):
        parse_envelope(json.dumps(data))
