"""An unmanaged job (a plain sbatch running ``icefrog launch``) reads no decision.json: the
launcher tells the trainer (JobConfig.managed, ICEFROG_MANAGED) and the trainer then keeps
what Slurm gave it, even with a stale decision left in its workdir."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import TensorDataset  # noqa: E402

from icefrog_launcher.config import JobConfig  # noqa: E402
from icefrog_launcher.launch import MANAGED_ENV  # noqa: E402
from icefrog_launcher.trainer import Trainer  # noqa: E402
from icefrog_slurm.cli import main  # noqa: E402
from icefrog_slurm.errors import InputError  # noqa: E402
from icefrog_slurm.protocol import Decision  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("keep_signal_handlers")]

STALE = Decision(round=7, gpus=1, batch=24, frozen=1, shared=True)


def _start(workdir: Path, managed: bool) -> Trainer:
    """A one-rank trainer whose workdir holds a decision from an earlier run; its first
    epoch started (the decision, if read at all, applied)."""
    (workdir / "decision.json").write_text(STALE.to_json())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    data = TensorDataset(torch.randn(64, 4), torch.zeros(64, dtype=torch.long))
    config = JobConfig(workdir=str(workdir), batch=(8, 32), max_epochs=1, managed=managed)
    trainer = Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), data, config=config, env={}
    )
    next(trainer.epochs())
    return trainer


def test_an_unmanaged_trainer_ignores_a_stale_decision(tmp_path: Path) -> None:
    (tmp_path / "managed").mkdir()
    managed = _start(tmp_path / "managed", managed=True)
    assert (managed.decision_round, managed.batch, managed.shared) == (7, 24, True)
    (tmp_path / "plain").mkdir()
    plain = _start(tmp_path / "plain", managed=False)
    assert (plain.decision_round, plain.batch, plain.shared) == (-1, 8, False)
    assert plain.frozen == 0


def test_the_launcher_carries_managed_to_the_trainer() -> None:
    for managed in (True, False):
        env = JobConfig(managed=managed).to_env()
        assert env[MANAGED_ENV] == ("1" if managed else "0")
        assert JobConfig.from_env(env).managed is managed
    assert JobConfig.from_env({}).managed  # a trainer started without the launcher
    with pytest.raises(InputError, match="ICEFROG_MANAGED: must be 0 or 1"):
        JobConfig.from_env({MANAGED_ENV: "yes"})


@pytest.mark.parametrize(("marker", "want"), [(None, "0"), ("1", "1"), ("yes", "0")])
def test_launch_in_a_slurm_job_exports_whether_it_is_managed(
    marker: str | None,
    want: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    if marker is None:
        monkeypatch.delenv(MANAGED_ENV, raising=False)
    else:
        monkeypatch.setenv(MANAGED_ENV, marker)
    assert main(["launch", "--dry-run", "--", "t.py"]) == 0
    assert f"{MANAGED_ENV}={want}\n" in capsys.readouterr().out
