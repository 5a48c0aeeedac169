"""The learning-rate rules for a changed global batch (icefrog_launcher.lr) and how the
Trainer applies them: the step runs at the scaled lr, the optimizer (and so the checkpoint
and the user's scheduler) keeps the user's lr."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from icefrog_launcher.lr import (
    RULES,
    Scaling,
    adascale_gain,
    parse_rule,
    ramp,
    target_factor,
    training_sums,
)
from icefrog_slurm.errors import InputError
from tests.support.munge import ensure_munged
from tests.support.tiny_job import tiny_job, tiny_mlp, train


def test_fixed_rules() -> None:
    for batch, base in ((32, 32), (128, 32), (16, 32)):
        scale = batch / base
        assert target_factor("none", batch=batch, base_batch=base) == 1.0
        assert target_factor("linear", batch=batch, base_batch=base) == pytest.approx(scale)
        assert target_factor("sqrt", batch=batch, base_batch=base) == pytest.approx(
            math.sqrt(scale)
        )


def test_adascale_gain_between_one_and_the_scale() -> None:
    """All noise: the linear rule; all signal: 1; equal parts at S = 4: 2 / 1.25 = 1.6."""
    assert adascale_gain(scale=4.0, var=1.0, sqr=0.0) == pytest.approx(4.0)
    assert adascale_gain(scale=4.0, var=0.0, sqr=1.0) == pytest.approx(1.0)
    assert adascale_gain(scale=4.0, var=1.0, sqr=1.0) == pytest.approx(1.6)
    for var, sqr in ((3.0, 0.5), (0.1, 2.0), (1e-9, 1e-9)):
        gains = [adascale_gain(scale=s, var=var, sqr=sqr) for s in (1, 2, 4, 8, 16)]
        assert gains == sorted(gains) and gains[0] >= 1.0 and gains[-1] <= 16.0
    # nothing measured, hostile values: no change
    assert adascale_gain(scale=4.0, var=0.0, sqr=0.0) == 1.0
    assert adascale_gain(scale=4.0, var=-5.0, sqr=-1.0) == 1.0
    assert adascale_gain(scale=4.0, var=float("nan"), sqr=1.0) == 1.0
    assert adascale_gain(scale=float("inf"), var=1.0, sqr=1.0) == 1.0


def test_adascale_reads_per_sample_statistics_of_the_training_layers() -> None:
    """The trainer's grad_var is per-sample tr(Sigma): the base-batch variance is it / B0;
    frozen layers (before ``frozen``) are left out."""
    var, sqr = training_sums([100.0, 64.0, -3.0, 64.0], [5.0, 1.0, 1.0, -2.0], 1)
    assert (var, sqr) == (128.0, 2.0)  # negative estimates count as 0
    got = target_factor("adascale", batch=128, base_batch=32, var=var, sqr=sqr)
    v = 128.0 / 32
    assert got == pytest.approx((v + 2.0) / (v / 4 + 2.0))
    # a batch below the base: the inverse of the gain of the inverse scale
    low = target_factor("adascale", batch=16, base_batch=32, var=var, sqr=sqr)
    high = target_factor("adascale", batch=64, base_batch=32, var=var, sqr=sqr)
    assert low == pytest.approx(1.0 / high) and low < 1.0
    assert target_factor("adascale", batch=64, base_batch=32) == 1.0  # no statistics yet


def test_statistics_smoothed_over_epochs() -> None:
    s = Scaling("adascale")
    assert s.observe(4.0, 2.0) == (4.0, 2.0)  # the first epoch's as they are
    assert s.observe(8.0, 0.0) == (4.0 + 0.5 * 4.0, 1.0)  # SMOOTHING = 0.5
    assert s.observe(float("nan"), 1.0) == (6.0, 1.0)  # ignored
    t = Scaling("adascale")
    t.load_state_dict(s.state_dict())
    assert (t.var, t.sqr) == (6.0, 1.0)


def test_ramp_and_warm_up() -> None:
    assert [ramp(1.0, 3.0, step=k, warmup_steps=4) for k in range(6)] == [
        1.0, 1.5, 2.0, 2.5, 3.0, 3.0,
    ]  # fmt: skip
    assert ramp(1.0, 3.0, step=0, warmup_steps=0) == 3.0
    s = Scaling("linear", warmup_steps=2)
    s.retarget(4.0)
    seen = []
    for _ in range(3):
        seen.append(s.factor())
        s.stepped()
    assert seen == [1.0, 2.5, 4.0]
    s.retarget(2.0)  # from where it is
    assert s.factor() == 4.0
    s.stepped()
    assert s.factor() == 3.0
    a = Scaling("adascale", warmup_steps=10)
    a.retarget(2.5)
    assert a.factor() == 2.5  # AdaScale follows its gain at once


def test_state_round_trip_and_rule_change() -> None:
    s = Scaling("sqrt", warmup_steps=8)
    s.retarget(2.0)
    s.stepped()
    t = Scaling("sqrt", warmup_steps=8)
    t.load_state_dict(s.state_dict())
    assert t.factor() == s.factor() and t.since == 1
    u = Scaling("linear")
    u.load_state_dict(s.state_dict())  # another rule: fresh
    assert u.factor() == 1.0


def test_parse_rule() -> None:
    assert [parse_rule(r) for r in RULES] == list(RULES)
    assert [parse_rule(r, adam=True) for r in RULES] == list(RULES)  # a named rule is kept
    assert parse_rule("auto", adam=True) == "linear"
    assert parse_rule("auto", adam=False) == "sqrt"
    with pytest.raises(InputError, match="one of auto, none, linear, sqrt, adascale"):
        parse_rule("cubic")


def test_trainer_default_rule_follows_the_optimizer(tmp_path: Path) -> None:
    """``auto`` (the default): linear for the Adam family (subclasses included), sqrt for
    any other optimizer; a rule the user names wins. With Adam at the decided per-GPU
    batch 64 against a base of 16 the steps run at lr x 4."""
    torch = pytest.importorskip("torch")
    from icefrog_launcher import Trainer
    from icefrog_slurm.protocol import Decision

    why = ensure_munged()
    if why:
        pytest.skip(why)

    class MyAdam(torch.optim.Adam):  # a user's own subclass
        pass

    data, config = tiny_job(tmp_path, samples=64, batch=(16, 64), max_epochs=1, job_id="8")
    optim = torch.optim
    cases = [
        (optim.Adam, "auto", "linear"), (optim.AdamW, "auto", "linear"),
        (optim.NAdam, "auto", "linear"), (optim.RAdam, "auto", "linear"),
        (optim.Adamax, "auto", "linear"), (MyAdam, "auto", "linear"),
        (optim.SGD, "auto", "sqrt"), (optim.RMSprop, "auto", "sqrt"),
        (optim.Adagrad, "auto", "sqrt"), (optim.Adam, "sqrt", "sqrt"),
        (optim.SGD, "linear", "linear"),
    ]  # fmt: skip
    for kind, asked, rule in cases:
        model = tiny_mlp()
        trainer = Trainer(
            model, kind(model.parameters(), lr=0.01), data, config=config, env={}, lr_rule=asked
        )
        assert trainer.lr_scaling.rule == rule, (kind.__name__, asked)
    (tmp_path / "decision.json").write_text(Decision(1, 1, 64, 0).to_json())
    model = tiny_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer = Trainer(model, opt, data, config=config, env={}, lr_warmup_steps=0)
    factors: list[float] = []
    opt.register_step_pre_hook(lambda o, a, k: factors.append(o.param_groups[0]["lr"]))
    assert train(trainer, opt) == 1
    assert trainer.batch == 64 and factors == [pytest.approx(0.04)]
    assert opt.param_groups[0]["lr"] == 0.01


def test_trainer_steps_at_the_scaled_lr_and_keeps_the_users(tmp_path: Path) -> None:
    """One process, decided per-GPU batch 64 against a base of 16: the linear rule steps
    at lr x 4 (checked on SGD without momentum: the update is lr x 4 x grad), while the
    optimizer's param group, its state_dict and the scheduler see the user's lr."""
    torch = pytest.importorskip("torch")
    from icefrog_launcher import Trainer
    from icefrog_launcher.config import JobConfig
    from icefrog_slurm.protocol import Decision

    why = ensure_munged()  # the trainer's reports are signed by munged, or kept until it is up
    if why:
        pytest.skip(why)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    config = JobConfig(
        batch=(16, 64), workdir=str(tmp_path), max_epochs=1, inbox=str(tmp_path / "inbox"),
        slurm_job_id="7",
    )  # fmt: skip
    (tmp_path / "decision.json").write_text(Decision(1, 1, 64, 0).to_json())
    trainer = Trainer(model, opt, data, config=config, env={}, lr_rule="linear", lr_warmup_steps=0)
    assert trainer.base_batch == 16
    checked = 0
    for _ in trainer.epochs():
        assert trainer.batch == 64 and trainer.lr_factor == pytest.approx(4.0)
        for x, y in trainer.loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(trainer.model(x), y).backward()
            before = [p.detach().clone() for p in model.parameters()]
            grads = [p.grad.detach().clone() for p in model.parameters()]
            opt.step()
            for b, g, p in zip(before, grads, model.parameters(), strict=True):
                assert torch.allclose(p.detach(), b - 0.04 * g, atol=1e-7)
            assert opt.param_groups[0]["lr"] == 0.01
            assert opt.state_dict()["param_groups"][0]["lr"] == 0.01
            checked += 1
    assert checked == 4
    # the report carries the variance of a base-batch gradient, tr(Sigma) / B0 (Pollux's
    # convention, core.goodput), the trainer's own statistics stay per sample
    from icefrog_slurm.protocol import parse_envelope, parse_payload

    (path,) = sorted((tmp_path / "inbox" / "7").glob("*-grad_stats.json"))
    report = parse_payload("grad_stats", parse_envelope(path.read_bytes()).payload)
    assert any(v > 0 for v in trainer.stats.last_var)
    assert list(report.grad_var) == pytest.approx([v / 16 for v in trainer.stats.last_var])
    assert list(report.grad_sqr) == pytest.approx(trainer.stats.last_sqr)
