"""The Model Trainer's work budget on a real run (one process, CPU, the digits MLP of
examples/train_digits.py): an epoch trained with layers frozen counts psi < 1 of an epoch,
so ``--max-epochs 2`` takes a third physical epoch; ``--max-physical-epochs 2`` stops it
after two, short of its budget. The reports are read back with the controller's parser."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.nn import functional as F  # noqa: E402

from icefrog_launcher import Trainer  # noqa: E402
from icefrog_launcher.config import JobConfig  # noqa: E402
from icefrog_slurm.protocol import Decision, parse_envelope, parse_payload  # noqa: E402
from icefrog_slurm.security import write_atomic  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("keep_signal_handlers")]

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "train_digits", ROOT / "examples" / "train_digits.py"
)
assert _spec is not None and _spec.loader is not None
digits_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(digits_example)


def _run(workdir: Path, **limits: int) -> tuple[Trainer, list[dict[str, Any]]]:
    """Train the MLP: epoch 0 on every layer, epoch 1 with the first 3 frozen (a decision
    written after epoch 0), then every layer again; one record a finished epoch."""
    config = JobConfig(
        workdir=str(workdir), inbox=str(workdir / "inbox"), slurm_job_id="7", **limits
    )
    torch.manual_seed(0)
    train, val = digits_example.digits()
    model = digits_example.make_model("mlp")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(model, optimizer, train, config=config, env={}, stats_every=4)
    decisions = {0: Decision(1, 1, 32, 3), 1: Decision(2, 1, 32, 0)}
    records: list[dict[str, Any]] = []
    for epoch in trainer.epochs():
        assert epoch < 20, "the budget never ended the job"
        frozen, psi = trainer.frozen, trainer.psi
        for x, y in trainer.loader:
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()
            optimizer.step()
        records.append(
            {"frozen": frozen, "psi": psi, "samples": trainer.samples_done,
             "effective": trainer.effective_done}
        )  # fmt: skip
        if epoch in decisions:
            write_atomic(Path(config.decision_path), decisions[epoch].to_json().encode())
        trainer.report_metric(digits_example.accuracy(model, val))
    return trainer, records


def _reports(workdir: Path, kind: str) -> list[Any]:
    paths = sorted((workdir / "inbox" / "7").glob(f"*-{kind}.json"))
    return [parse_payload(kind, parse_envelope(p.read_bytes()).payload) for p in paths]


def test_frozen_epoch_is_made_up_by_another(tmp_path: Path) -> None:
    trainer, records = _run(tmp_path, max_epochs=2)
    size = trainer.loader.size
    assert [r["frozen"] for r in records] == [0, 3, 0]
    psi = records[1]["psi"]
    assert 0.0 < psi < 1.0  # epoch 1 counted as psi of an epoch
    assert records[1]["effective"] < 2 * size  # two physical epochs did not spend the budget
    assert trainer.finished == "max_epochs" and trainer.epoch == 3
    assert trainer.samples_done == 3 * size
    assert trainer.effective_done == pytest.approx((2 + psi) * size)
    assert [f.reason for f in _reports(tmp_path, "finished")] == ["max_epochs"]
    last = _reports(tmp_path, "progress")[-1]  # what the controller's P counts
    assert last.effective_samples_done >= 2 * size


def test_physical_cap_stops_it_short(tmp_path: Path) -> None:
    trainer, records = _run(tmp_path, max_epochs=2, max_physical_epochs=2)
    assert len(records) == 2 and trainer.epoch == 2
    assert trainer.finished == "max_physical_epochs"
    assert trainer.effective_done < 2 * trainer.loader.size
    assert [f.reason for f in _reports(tmp_path, "finished")] == ["max_physical_epochs"]
