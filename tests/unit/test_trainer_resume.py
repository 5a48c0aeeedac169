"""A Trainer stopped and resumed in this process (one rank, CPU): where a stop signal is
served, and that the resumed run goes on as the uninterrupted one would (the optimizer's
param groups, the RNG streams, the step count and the epoch's gradient statistics)."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from torch.nn import functional as F  # noqa: E402

from icefrog_launcher import checkpoint  # noqa: E402
from icefrog_launcher.config import JobConfig  # noqa: E402
from icefrog_launcher.trainer import Trainer  # noqa: E402
from icefrog_slurm.runfiles import CHECKPOINT_MARKER  # noqa: E402
from tests.unit import tiny_task  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("keep_signal_handlers")]


def _trainer(workdir: Path, epochs: int, lr: float = 0.1) -> tuple[Trainer, Any]:
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    config = JobConfig(workdir=str(workdir), batch=(8, 16), max_epochs=epochs)
    return Trainer(model, optimizer, tiny_task.data(), config=config, env={}), optimizer


def _stop() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)  # the trainer's handler: served at a boundary


def test_a_stop_during_the_evaluation_is_served_at_the_epoch_end(tmp_path: Path) -> None:
    """USR1 while the loop evaluates after its epoch's loader: rank 0 exits 75 right after
    the epoch end's checkpoint (the whole epoch and its metric), before the next epoch
    starts. Before, the next epoch started and the stop waited for its first step."""
    trainer, optimizer = _trainer(tmp_path, 3)
    started = []
    with pytest.raises(SystemExit) as stopped:
        for epoch in trainer.epochs():
            started.append(epoch)
            for x, y in trainer.loader:
                optimizer.zero_grad()
                F.cross_entropy(trainer.model(x), y).backward()
                optimizer.step()
            _stop()  # the evaluation runs
            trainer.report_metric(0.5)
    assert stopped.value.code == 75 and started == [0]
    assert checkpoint.latest_number(tmp_path / "checkpoints") == 0  # one checkpoint
    found = checkpoint.load_latest(tmp_path / "checkpoints")
    assert found is not None
    assert (found[1]["epoch"], found[1]["position"], found[1]["samples_done"]) == (1, 0, 200)
    assert (tmp_path / CHECKPOINT_MARKER).exists()


def _warm_up_run(workdir: Path, lrs: list[float], stop_at: tuple[int, int] | None = None) -> None:
    """A per-epoch warm-up (LinearLR from 0.1 x lr over 2 epochs) made after the Trainer
    and registered; ``stop_at`` (epoch, step): a USR1 there. Each epoch's lr into ``lrs``."""
    trainer, optimizer = _trainer(workdir, 5, lr=1.0)
    warm_up = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=2)
    trainer.register_state("warm_up", warm_up)
    for epoch in trainer.epochs():
        lrs.append(optimizer.param_groups[0]["lr"])
        for i, (x, y) in enumerate(trainer.loader):
            if (epoch, i) == stop_at:
                _stop()
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()
            optimizer.step()
        warm_up.step()
        trainer.report_metric(0.0)


def test_a_scheduler_made_after_the_trainer_keeps_the_learning_rate(tmp_path: Path) -> None:
    """The warm-up's constructor multiplies the restored lr by 0.1; the first epoch puts
    the checkpoint's back, so each resume goes on at the uninterrupted run's lr. Before,
    the lr dropped 10x at every resume, for good."""
    whole: list[float] = []
    _warm_up_run(tmp_path / "whole", whole)
    assert whole == pytest.approx([0.1, 0.55, 1.0, 1.0, 1.0])
    split: list[float] = []
    for stop_at in [(1, 3), (3, 3)]:
        with pytest.raises(SystemExit):
            _warm_up_run(tmp_path / "split", split, stop_at)
    _warm_up_run(tmp_path / "split", split)
    assert split == [0.1, 0.55, 0.55, 1.0, 1.0, 1.0, 1.0]  # epochs 0-1, 1-3, 3-4


def _drawing_run(workdir: Path, stop_at: tuple[int, int] | None = None) -> dict[Any, Any]:
    """2 epochs whose loop draws from numpy's, torch's and Python's global generators at
    every step (dropout, augmentation); ``stop_at`` (epoch, step): a USR1 there. The draws
    by (epoch, step), and at the end the step count and the last epoch's statistics."""
    np.random.seed(123)  # the script's own seeding, at every start
    random.seed(123)
    trainer, optimizer = _trainer(workdir, 2)
    seen: dict[Any, Any] = {}
    for epoch in trainer.epochs():
        for i, (x, y) in enumerate(trainer.loader, start=trainer.position // 8 - 1):
            if (epoch, i) == stop_at:
                _stop()
            seen[epoch, i] = (np.random.rand(), torch.rand(()).item(), random.random())
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()
            optimizer.step()
        trainer.report_metric(0.0)
    seen["end"] = (trainer.step, trainer.stats.last_var, trainer.stats.last_sqr)
    return seen


STOPS = [(1, 3), (0, 0)]  # mid-epoch; and after a measured step whose pair comes after


@pytest.mark.parametrize("stop_at", STOPS)
def test_a_resumed_run_draws_as_the_uninterrupted_one(
    tmp_path: Path, stop_at: tuple[int, int]
) -> None:
    """Stopped mid-epoch and resumed: every later draw from numpy's, torch's and Python's
    global generators is the uninterrupted run's. Before, numpy's restarted from the
    script's seed."""
    whole = _drawing_run(tmp_path / "whole")
    with pytest.raises(SystemExit):
        _drawing_run(tmp_path / "split", stop_at)
    resumed = _drawing_run(tmp_path / "split")
    del whole["end"], resumed["end"]
    assert resumed == {k: v for k, v in whole.items() if k > stop_at}


@pytest.mark.parametrize("stop_at", STOPS)
def test_a_resumed_run_measures_as_the_uninterrupted_one(
    tmp_path: Path, stop_at: tuple[int, int]
) -> None:
    """Stopped mid-epoch and resumed: the optimizer step count and the epoch's gradient
    statistics are the uninterrupted run's (the same steps measured, the sums so far kept,
    and a measured step's gradients kept for its pair after the stop). Before,
    ``trainer.step`` restarted at 0 and the epoch's partial statistics were lost."""
    whole = _drawing_run(tmp_path / "whole")
    with pytest.raises(SystemExit):
        _drawing_run(tmp_path / "split", stop_at)
    resumed = _drawing_run(tmp_path / "split")
    assert resumed["end"] == whole["end"] and whole["end"][0] == 2 * 25


def test_a_one_cycle_schedule_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OneCycleLR counts optimizer steps and raises past its total, and a decision for a
    smaller batch makes more steps an epoch: registering one says so; another does not."""
    trainer, optimizer = _trainer(tmp_path, 2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    trainer.register_state("cosine", cosine)
    assert "warning" not in capsys.readouterr().err
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=50)
    trainer.register_state("one_cycle", one_cycle)
    assert "'one_cycle' is a OneCycleLR: its total_steps counts" in capsys.readouterr().err
