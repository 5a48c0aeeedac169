"""The Trainer in this process (one rank, CPU): registered objects in the checkpoint
(icefrog_launcher.state) and gradient accumulation for a fixed global batch
(icefrog_launcher.accumulate), against a plain PyTorch loop."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.nn import functional as F  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from icefrog_launcher import checkpoint  # noqa: E402
from icefrog_launcher.accumulate import group_counts  # noqa: E402
from icefrog_launcher.config import JobConfig  # noqa: E402
from icefrog_launcher.data import ElasticDataLoader  # noqa: E402
from icefrog_launcher.position import DataPosition  # noqa: E402
from icefrog_launcher.trainer import Trainer  # noqa: E402
from icefrog_slurm.errors import InputError  # noqa: E402
from tests.unit import tiny_task  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("keep_signal_handlers")]


class Counter:
    """A user's object: counts the optimizer steps it saw."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.n = state["n"]


class Opaque:
    """State that weights_only refuses (an instance of a class of the user's)."""

    def __init__(self) -> None:
        self.inner: object = 1

    def state_dict(self) -> dict[str, object]:
        return {"inner": self.inner}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.inner = state["inner"]


def _config(tmp_path: Path, **changes: Any) -> JobConfig:
    args: dict[str, Any] = {"workdir": str(tmp_path), "batch": (8, 16), "max_epochs": 2}
    return JobConfig(**(args | changes))


def _train(trainer: Trainer, optimizer: Any, on_step: Any = None) -> list[float]:
    """The user's loop (zero_grad after the step); the learning rate of each epoch."""
    lrs = []
    for _epoch in trainer.epochs():
        lrs.append(optimizer.param_groups[0]["lr"])
        for x, y in trainer.loader:
            F.cross_entropy(trainer.model(x), y).backward()
            optimizer.step()
            if on_step is not None:
                on_step()
            optimizer.zero_grad()
        trainer.report_metric(0.0)
    return lrs


def test_registration_errors(tmp_path: Path) -> None:
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, optimizer, tiny_task.data(), config=_config(tmp_path), env={})
    counter = Counter()
    trainer.register_state("counter", counter)
    with pytest.raises(InputError, match=r"register_state\('counter'\): that name is already"):
        trainer.register_state("counter", Counter())
    with pytest.raises(InputError, match=r"already registered as 'counter'"):
        trainer.register_state("again", counter)
    with pytest.raises(InputError, match=r"a list has no state_dict\(\)/load_state_dict\(\)"):
        trainer.register_state("numbers", [1, 2])
    for bad in ("", "a/b", "x" * 65, "../ckpt", 7):
        with pytest.raises(InputError, match="register_state: name"):
            trainer.register_state(bad, Counter())  # type: ignore[arg-type]
    opaque = Opaque()
    opaque.inner = Counter()  # not a tensor, number, string or container
    with pytest.raises(InputError, match=r"register_state\('opaque'\).*weights_only=True"):
        trainer.register_state("opaque", opaque)
    epochs = trainer.epochs()
    next(epochs)
    with pytest.raises(InputError, match="before the first epoch starts"):
        trainer.register_state("late", Counter())


def test_the_types_taken_as_loadable_load_with_weights_only() -> None:
    """checkpoint.check_loadable skips the torch round trip for SAFE_TYPES: each of them,
    in each container, really loads with weights_only=True in this torch."""
    import collections
    import io

    values = [torch.zeros(2), torch.nn.Parameter(torch.ones(1)), True, 3, 2.5, "s", b"b", None,
              torch.float16, torch.device("cpu"), torch.Size([2, 3])]  # fmt: skip
    assert {type(v) for v in values} == set(checkpoint.SAFE_TYPES)
    state = collections.OrderedDict(
        a={1: values, "t": tuple(values), torch.float16: [values]}, b=[{"k": values}]
    )
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    back = torch.load(buffer, weights_only=True)
    assert (
        back["a"]["t"][-1] == torch.Size([2, 3]) and back["a"][torch.float16][0][8] is torch.float16
    )
    checkpoint.check_loadable("all", state)
    for bad in ({1, 2}, Counter(), complex(1, 2), [lambda: 0]):
        try:
            checkpoint.check_loadable("x", {"v": bad})
        except InputError:
            continue
        buffer = io.BytesIO()
        torch.save({"v": bad}, buffer)  # accepted: then torch does load it
        buffer.seek(0)
        torch.load(buffer, weights_only=True)


def test_a_state_that_turns_unloadable_is_refused_at_save(tmp_path: Path) -> None:
    """Fine when registered, a user class inside by the epoch's end: the save names it
    and writes nothing that a resume could not load."""
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, optimizer, tiny_task.data(), config=_config(tmp_path), env={})
    opaque = Opaque()
    trainer.register_state("opaque", opaque)
    opaque.inner = Counter()
    with pytest.raises(InputError, match=r"register_state\('opaque'\).*weights_only=True"):
        _train(trainer, optimizer)
    assert checkpoint.latest_number(Path(tmp_path) / "checkpoints") == -1


def _stateful_trainer(
    tmp_path: Path, epochs: int, **config: Any
) -> tuple[Trainer, Any, Any, Any, Counter]:
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    trainer = Trainer(
        model,
        optimizer,
        tiny_task.data(),
        config=_config(tmp_path, max_epochs=epochs, **config),
        env={},
        scheduler=sched,
        scaler=scaler,
    )
    counter = Counter()
    trainer.register_state("counter", counter)
    return trainer, optimizer, sched, scaler, counter


def _train_amp(
    trainer: Trainer,
    optimizer: Any,
    sched: Any,
    scaler: Any,
    counter: Counter,
    stop_at: tuple[int, int] | None = None,
) -> list[tuple[float, float]]:
    """A loop with a GradScaler and a per-epoch scheduler: (lr, scale) of each epoch's
    start and end. ``stop_at`` (epoch, micro-step): a real USR1 to this process there."""
    seen = []
    for epoch in trainer.epochs():
        seen.append((optimizer.param_groups[0]["lr"], scaler.get_scale()))
        for i, (x, y) in enumerate(trainer.loader):
            if (epoch, i) == stop_at:
                os.kill(os.getpid(), signal.SIGUSR1)  # the trainer's handler: stop at a boundary
            optimizer.zero_grad()
            scaler.scale(F.cross_entropy(trainer.model(x), y)).backward()
            scaler.step(optimizer)
            scaler.update()
            if not trainer.accumulating:
                counter.n += 1
        seen.append((optimizer.param_groups[0]["lr"], scaler.get_scale()))
        sched.step()
        trainer.report_metric(0.0)
    return seen


def _interrupted(
    tmp_path: Path, stop_at: tuple[int, int], **config: Any
) -> tuple[list[tuple[float, float]], Any]:
    """The first part of a run stopped by USR1 at ``stop_at``: what it saw, its objects."""
    first = _stateful_trainer(tmp_path, 5, **config)
    seen: list[tuple[float, float]] = []
    with pytest.raises(SystemExit) as stopped:
        seen = _train_amp(*first, stop_at=stop_at)
    assert stopped.value.code == 75
    return seen, first


def test_registered_objects_resume_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5 epochs in one go, or stopped by a signal in epoch 2 and resumed with new objects
    from the checkpoint: the same learning rates, loss scales and counts to the last digit.
    Before, the scheduler restarted at the resume (and the scaler, the counter)."""
    whole_run = _stateful_trainer(tmp_path / "whole", 5)
    whole = _train_amp(*whole_run)
    _, (_, _, _, scaler1, counter1) = _interrupted(tmp_path / "split", (2, 5))
    second = _stateful_trainer(tmp_path / "split", 5)
    _, _, sched, scaler, counter = second
    assert sched.last_epoch == 2 and counter.n == counter1.n == 2 * 25 + 6
    assert scaler.state_dict() == scaler1.state_dict()
    rest = _train_amp(*second)
    assert rest[1:] == whole[-5:] and len(rest) == 6  # the end of epoch 2, epochs 3 and 4
    cosine = [0.5 * (1 + math.cos(math.pi * e / 5)) for e in range(5)]  # T_max 5, lr 1
    assert [lr for lr, _ in whole[::2]] == pytest.approx(cosine, abs=1e-12)
    assert len({s for _, s in whole}) > 1  # the scale did change (grew) during the run
    assert counter.n == whole_run[4].n == 5 * 25
    for a, b in zip(second[0].module.parameters(), whole_run[0].module.parameters(), strict=True):
        assert torch.equal(a, b)
    assert "warning" not in capsys.readouterr().err


def test_unknown_and_missing_names_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _interrupted(tmp_path, (0, 3))
    capsys.readouterr()
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    again = Trainer(
        model, optimizer, tiny_task.data(), config=_config(tmp_path, max_epochs=2), env={}
    )
    fresh = Counter()
    fresh.n = 41
    again.register_state("ema", fresh)  # new since the checkpoint
    next(again.epochs())
    err = capsys.readouterr().err
    assert "the checkpoint has no state for 'ema': it starts fresh" in err
    for name in ("counter", "scaler", "scheduler"):  # the script dropped them
        assert f"the checkpoint's state {name!r} belongs to no registered object" in err
    assert fresh.n == 41


def test_a_registry_given_no_dictionary_restores_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A checkpoint whose objects entry is not a dictionary of named states (edited by
    hand, or written by something else): a warning, every object fresh, no crash."""
    from icefrog_launcher.state import StateRegistry

    for bad in (["counter", {"n": 5}], {1: {"n": 5}}, "counter"):
        registry = StateRegistry()
        counter = Counter()
        registry.register("counter", counter)
        registry.restore(bad)
        assert counter.n == 0
        assert "registered states are not a dictionary" in capsys.readouterr().err


def _reference(epochs: int, global_batch: int, lr: float) -> list[Any]:
    """Plain PyTorch: the same samples in the same order, one step a global batch, mean loss."""
    from icefrog_launcher.data import epoch_order

    data, model = tiny_task.data(220), tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x_all, y_all = data.tensors
    for epoch in range(epochs):
        order = epoch_order(len(data), 0, epoch, True)
        for start in range(0, len(data), global_batch):
            idx = order[start : start + global_batch]
            optimizer.zero_grad()
            F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("global_batch", [64, 40])
def test_accumulation_matches_one_big_batch(tmp_path: Path, global_batch: int) -> None:
    """--global-batch B with per-GPU batches of at most 16 on one process: k micro-steps an
    optimizer step (64: 16 x 4; 40: 16 x 3 = 48, as near as the integer rule gets).
    The parameters equal plain PyTorch's with one step of B samples (mean loss,
    clipping between backward and step, momentum), the scheduler stepped per optimizer step
    only. Without accumulation the same job stepped every 8 samples."""
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    config = _config(tmp_path, global_batch=global_batch)
    trainer = Trainer(model, optimizer, tiny_task.data(220), config=config, env={}, scheduler=sched)

    steps_seen: list[int] = []
    for _epoch in trainer.epochs():
        for x, y in trainer.loader:
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()
            if not trainer.accumulating:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            sched.step()
            steps_seen.append(trainer.step)
        trainer.report_metric(0.0)
    m, k = 16, -(-global_batch // 16)
    per_epoch = -(-220 // (m * k))  # the last step: 28 samples, 16 + 12
    assert trainer.batch == m and trainer.accumulation.steps == k
    assert trainer.step == 2 * per_epoch == sched.last_epoch  # optimizer and scheduler
    assert len(steps_seen) == 2 * -(-220 // m)  # micro-steps
    assert trainer.samples_done == 440
    expected = _reference(2, m * k, 0.1)
    for got, want in zip(model.parameters(), expected, strict=True):
        assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


def test_accumulation_survives_zero_grad_anywhere_and_model_zero_grad(tmp_path: Path) -> None:
    """zero_grad after the step (the _train loop), or trainer.model.zero_grad() before it:
    the same parameters as the reference (without clipping: lr small, clip never binds)."""
    results = []
    for variant in ("after", "model"):
        model = tiny_task.model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        config = _config(tmp_path / variant, global_batch=64, max_epochs=1)
        trainer = Trainer(model, optimizer, tiny_task.data(), config=config, env={})
        if variant == "after":
            _train(trainer, optimizer)
        else:
            for _epoch in trainer.epochs():
                for x, y in trainer.loader:
                    trainer.model.zero_grad()
                    F.cross_entropy(trainer.model(x), y).backward()
                    optimizer.step()
                trainer.report_metric(0.0)
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_group_counts_are_the_loaders_batches() -> None:
    """The trainer weighs a step's micro-batches by this rank's samples in each, from the
    loader's rule (accumulate.group_counts): they are the batches the loader really hands
    out, remainders included."""
    cases = ((220, 16, 1, 4), (203, 16, 2, 2), (49, 4, 3, 3), (17, 8, 2, 2))
    for size, batch, world, steps in cases:
        for rank in range(world):
            position = DataPosition(batch=batch)
            taken: list[int] = []

            def record(global_count: int, _local: int, taken: list[int] = taken) -> None:
                taken.append(global_count)

            loader = ElasticDataLoader(
                TensorDataset(torch.arange(size)), position, rank=rank, world=world, on_step=record
            )
            got, planned = [], []
            for i, (x,) in enumerate(loader):
                if i % steps == 0:
                    left = size - (position.samples - taken[-1])
                    planned += group_counts(left, batch * world, world, rank, steps)
                got.append(len(x))
            assert got == planned, (size, batch, world, steps, rank)


@pytest.mark.parametrize("unscale_always", [False, True])
def test_accumulation_with_a_grad_scaler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], unscale_always: bool
) -> None:
    """The AMP loop with ``scaler=``: scale, backward, unscale (on a step's last micro-step,
    or at every one as PyTorch's AMP recipe without accumulation writes it) and clip on a
    step's last micro-step, scaler.step, scaler.update. The scaler's unscale_, step and
    update run once an optimizer step (its growth tracker counts optimizer steps), and the
    parameters are plain PyTorch's with one big batch (a power-of-two scale unscales
    exactly). Before, an unscale_ at every micro-step raised "unscale_() has already been
    called on this optimizer since the last update()"; now it is warned about once."""
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1000)
    config = _config(tmp_path, global_batch=64)
    trainer = Trainer(model, optimizer, tiny_task.data(220), config=config, env={}, scaler=scaler)
    for _epoch in trainer.epochs():
        for x, y in trainer.loader:
            optimizer.zero_grad()
            scaler.scale(F.cross_entropy(trainer.model(x), y)).backward()
            if unscale_always:
                scaler.unscale_(optimizer)
            if not trainer.accumulating:
                if not unscale_always:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        trainer.report_metric(0.0)
    assert capsys.readouterr().err.count("scaler.unscale_() before") == unscale_always
    assert trainer.step == 2 * 4  # ceil(220 / 64) optimizer steps an epoch
    assert scaler.state_dict()["_growth_tracker"] == trainer.step
    assert type(scaler).__name__ == "GradScaler" and isinstance(scaler, torch.amp.GradScaler)
    expected = _reference(2, 64, 0.1)
    for got, want in zip(model.parameters(), expected, strict=True):
        assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


def _accumulating_run(workdir: Path, stop_at: int | None = None) -> list[Any]:
    """--global-batch 64 (4 micro-steps of 16), 2 epochs; ``stop_at``: a real USR1 at that
    micro-step of epoch 0. The parameters at the end (or at the stop)."""
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    config = _config(workdir, global_batch=64)
    trainer = Trainer(model, optimizer, tiny_task.data(220), config=config, env={})
    for epoch in trainer.epochs():
        for i, (x, y) in enumerate(trainer.loader):
            if (epoch, i) == (0, stop_at):
                os.kill(os.getpid(), signal.SIGUSR1)
            optimizer.zero_grad()
            F.cross_entropy(trainer.model(x), y).backward()
            optimizer.step()
        trainer.report_metric(0.0)
    return [p.detach().clone() for p in model.parameters()]


def test_a_stop_signal_waits_for_the_optimizer_step(tmp_path: Path) -> None:
    """USR1 at the second micro-step of a step: the trainer finishes the step (2 more
    micro-steps) and checkpoints at its end, never with half a step's gradients; the
    resumed run ends with the parameters of the uninterrupted one."""
    whole = _accumulating_run(tmp_path / "whole")
    with pytest.raises(SystemExit) as stopped:
        _accumulating_run(tmp_path / "split", stop_at=5)  # step 2's second micro-step
    assert stopped.value.code == 75
    found = checkpoint.load_latest(tmp_path / "split" / "checkpoints")
    assert found is not None
    assert (found[1]["epoch"], found[1]["position"]) == (0, 2 * 64)
    resumed = _accumulating_run(tmp_path / "split")
    for a, b in zip(resumed, whole, strict=True):
        assert torch.equal(a, b)


def test_an_unwritable_inbox_fails_no_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reports are advisory: an inbox that cannot be written (here missing under a file, as
    root writes a read-only folder anyway) neither fails Trainer() nor a report of the run;
    it warns once and keeps the reports for when the inbox is back."""
    import dataclasses

    from icefrog_launcher import reports
    from icefrog_slurm import security
    from icefrog_slurm.protocol import Envelope

    def sign(envelope: Envelope, **_: object) -> Envelope:
        return dataclasses.replace(envelope, credential="MUNGE:fake")

    monkeypatch.setattr(security, "sign", sign)
    monkeypatch.setattr(reports, "FINAL_WAIT_S", 0.0)
    (tmp_path / "blocker").write_text("a file where the inbox's parent should be")
    config = _config(tmp_path, inbox=str(tmp_path / "blocker" / "inbox"), slurm_job_id="31")
    model = tiny_task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, optimizer, tiny_task.data(), config=config, env={})
    _train(trainer, optimizer)
    assert trainer.finished == "max_epochs"
    kinds = [e.kind for e in trainer.reporter.waiting]
    assert kinds[0] == "register" and kinds[-1] == "finished"
    assert capsys.readouterr().err.count("warning: reports cannot be written") == 1
