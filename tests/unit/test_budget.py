"""The work budget of a job (icefrog_launcher.budget): ``--max-epochs`` counts
full-model-equivalent epochs, so a job frozen at psi < 1 trains 1/psi more physical samples;
``--max-physical-epochs`` caps the epochs actually trained. Also the option's way from
``icefrog submit`` / ``icefrog launch`` to the trainer, its validation against hostile
values, and the finish reasons the controller accepts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import pytest

from icefrog_launcher.budget import Limit, WorkBudget
from icefrog_launcher.config import ENV_PREFIX, JobConfig
from icefrog_slurm import declaration
from icefrog_slurm.cli import main
from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import INT32_MAX, FinishedReport, parse_payload


def train(
    budget: WorkBudget, psi_of_epoch: Callable[[int], float], trained: int | None = None
) -> tuple[Limit, int, int, float]:
    """Run epochs as the trainer counts them (each step's samples x the epoch's psi) until
    the budget ends the job: (limit, epochs, samples done, effective samples done).
    ``trained``: samples an epoch actually trains (the loader may skip a remainder)."""
    per_epoch = budget.samples_per_epoch if trained is None else trained
    epochs, samples, effective = 0, 0, 0.0
    while True:
        psi = psi_of_epoch(epochs)
        for step in range(0, per_epoch, 32):  # steps of 32 samples, the last one shorter
            count = min(32, per_epoch - step)
            samples += count
            effective += psi * count
        epochs += 1
        limit = budget.ended_by(epochs=epochs, samples_done=samples, effective_done=effective)
        if limit is not None:
            return limit, epochs, samples, effective
        assert epochs < 10_000


def test_nothing_frozen_ends_after_exactly_max_epochs() -> None:
    budget = WorkBudget(max_epochs=7, samples_per_epoch=1437)
    assert train(budget, lambda e: 1.0) == ("max_epochs", 7, 7 * 1437, 7 * 1437.0)
    # an epoch that skips a remainder (fewer samples than processes) is still one epoch
    limit, epochs, samples, _ = train(budget, lambda e: 1.0, trained=1436)
    assert (limit, epochs, samples) == ("max_epochs", 7, 7 * 1436)
    assert budget.ended_by(epochs=6, samples_done=6 * 1437, effective_done=6 * 1437.0) is None


@pytest.mark.parametrize(("psi", "max_epochs"), [(0.5, 4), (0.46, 10), (0.61, 80), (0.8, 3)])
def test_frozen_job_trains_one_over_psi_more_samples(psi: float, max_epochs: int) -> None:
    budget = WorkBudget(max_epochs=max_epochs, samples_per_epoch=1500)
    limit, epochs, samples, effective = train(budget, lambda e: psi)
    assert limit == "max_epochs"
    assert effective >= budget.samples  # the full-model-equivalent work is done
    # 1/psi physical samples for each full-model one, overshooting by less than an epoch
    assert budget.samples / psi <= samples < budget.samples / psi + 1500
    assert epochs == math.ceil(max_epochs / psi - 1e-9)
    assert epochs > max_epochs  # counting physical epochs would have stopped it short


def test_frozen_then_thawed_makes_up_only_the_frozen_share() -> None:
    """Frozen at psi 0.5 for epochs 2-5, then trained whole: 4 x 0.5 epochs are owed."""
    budget = WorkBudget(max_epochs=10, samples_per_epoch=1000)
    limit, epochs, samples, effective = train(budget, lambda e: 0.5 if 2 <= e < 6 else 1.0)
    assert (limit, epochs, samples, effective) == ("max_epochs", 12, 12_000, 10_000.0)
    assert budget.effective_epochs(epochs=12, samples_done=12_000, effective_done=10_000.0) == 10


def test_physical_cap_wins_when_lower() -> None:
    budget = WorkBudget(max_epochs=4, samples_per_epoch=1500, max_physical_epochs=6)
    limit, epochs, samples, effective = train(budget, lambda e: 0.5)  # would need 8
    assert (limit, epochs, samples) == ("max_physical_epochs", 6, 9000)
    assert effective < budget.samples
    # a cap the budget reaches first does nothing
    roomy = WorkBudget(max_epochs=4, samples_per_epoch=1500, max_physical_epochs=9)
    assert train(roomy, lambda e: 0.5)[:2] == ("max_epochs", 8)
    # both at once (a cap equal to the budget, nothing frozen): the job did its work
    equal = WorkBudget(max_epochs=4, samples_per_epoch=1500, max_physical_epochs=4)
    assert train(equal, lambda e: 1.0)[:2] == ("max_epochs", 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_epochs": 0, "samples_per_epoch": 10}, "--max-epochs"),
        ({"max_epochs": 1, "samples_per_epoch": 10, "max_physical_epochs": -1}, "physical"),
        ({"max_epochs": 1, "samples_per_epoch": 0}, "empty"),
    ],
)
def test_bad_budget(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(InputError, match=message):
        WorkBudget(**kwargs)


def _declared(*argv: str) -> declaration.Declaration:
    parser = argparse.ArgumentParser()
    declaration.add_arguments(parser)
    return declaration.from_args(parser.parse_args(list(argv)))


def test_cap_travels_from_submit_to_the_trainer() -> None:
    declared = _declared("--max-epochs", "20", "--max-physical-epochs", "30")
    assert declared.max_physical_epochs == 30
    assert "--max-physical-epochs=30" in declared.launch_options()
    assert _declared(*declared.launch_options()) == declared  # icefrog submit -> launch
    assert not any("physical" in o for o in _declared().launch_options())  # none by default
    config = JobConfig(max_epochs=20, max_physical_epochs=30)
    assert config.to_env()[ENV_PREFIX + "MAX_PHYSICAL_EPOCHS"] == "30"
    back = JobConfig.from_env(config.to_env())
    assert back.declaration == declared
    assert back.budget(100) == WorkBudget(20, 100, 30)
    assert JobConfig.from_env({}).budget(100) == WorkBudget(100, 100, 0)  # no cap


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-epochs", "20", "--max-physical-epochs", "19"],  # could never spend the budget
        ["--max-physical-epochs", "-1"],
        ["--max-physical-epochs", str(INT32_MAX + 1)],
        ["--max-epochs", str(INT32_MAX + 1), "--max-physical-epochs", str(INT32_MAX + 1)],
    ],
)
def test_hostile_cap_is_refused(argv: list[str]) -> None:
    with pytest.raises(InputError, match=r"--max-(physical-)?epochs"):
        _declared(*argv)


@pytest.mark.parametrize("value", ["1; rm -rf /", "3.5", "", "0x10", "9" * 40, "-5", "19"])
def test_hostile_cap_in_the_environment_is_refused(value: str) -> None:
    env = {ENV_PREFIX + "MAX_EPOCHS": "20", ENV_PREFIX + "MAX_PHYSICAL_EPOCHS": value}
    with pytest.raises(InputError, match=r"ICEFROG_|--max-physical-epochs"):
        JobConfig.from_env(env)


def test_launch_cap_below_budget_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["launch", "--max-epochs", "5", "--max-physical-epochs", "4", "--dry-run", "--", "t"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--max-physical-epochs" in err and "\n" not in err  # one line
    argv[4] = "8"
    assert main(argv) == 0
    assert "ICEFROG_MAX_PHYSICAL_EPOCHS=8" in capsys.readouterr().out


@pytest.mark.parametrize("reason", ["target_reached", "max_epochs", "max_physical_epochs"])
def test_every_finish_reason_the_trainer_sends_parses(reason: str) -> None:
    report = parse_payload("finished", {"reason": reason, "epoch": 3, "final_metric": 0.5})
    assert report == FinishedReport(reason, 3, 0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("reason", ["budget", "MAX_EPOCHS", "max_epochs ", "", None, 3])
def test_unknown_finish_reason_is_refused(reason: object) -> None:
    with pytest.raises(InputError, match="reason"):
        parse_payload("finished", {"reason": reason, "epoch": 3, "final_metric": 0.5})
