"""The simulator's ablation switches: settings overrides (--set) and profile noise."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.commands import simulate
from icefrog_slurm.errors import InputError
from icefrog_slurm.settings import Settings, apply_overrides
from icefrog_slurm.sim.calibration import shipped_calibration
from icefrog_slurm.sim.catalog import shipped_catalog
from icefrog_slurm.sim.engine import SimOptions, check_steps
from icefrog_slurm.sim.truth import (
    MEMORY_NOISE,
    PROFILE_TIME_NOISE,
    UTIL_NOISE,
    ProfileNoise,
    TaskTruth,
)

TASK = "resnet18-cifar10"


def truth() -> TaskTruth:
    catalog = shipped_catalog()
    return TaskTruth(catalog.get(TASK), catalog.layers(TASK), shipped_calibration()[TASK], seed=1)


# ----- --set ---------------------------------------------------------------------------------


def test_overrides_change_only_the_named_fields() -> None:
    base = Settings()
    s = apply_overrides(base, ["sharing.speed_factor=0.6", "controller.round_period_s=60"])
    assert s.sharing.speed_factor == 0.6 and s.controller.round_period_s == 60.0
    assert s.sharing.memory_safety == base.sharing.memory_safety
    assert s.controller.reallocation_overhead_s == base.controller.reallocation_overhead_s
    assert s.solver == base.solver and s.store == base.store
    assert apply_overrides(base, ["solver.method=fast"]).solver.method == "fast"  # bare string
    assert apply_overrides(base, []) == base


@pytest.mark.parametrize(
    ("pair", "named"),
    [
        ("policy.nosuch=1", "policy.nosuch"),  # unknown key
        ("policy.freezing=sometimes", "policy.freezing"),  # not one of its values
        ("sharing.speed_factor=1.5", "sharing.speed_factor"),  # out of bounds
        ("controller.round_period_s=soon", "controller.round_period_s"),  # wrong type
        ("nosuch.key=1", "nosuch"),  # unknown section
        ("sharing.speed_factor", "sharing.speed_factor"),  # no value
        ("speed_factor=0.5", "speed_factor"),  # no section
    ],
)
def test_overrides_reject_unknown_keys_and_bad_values_naming_them(pair: str, named: str) -> None:
    with pytest.raises(InputError, match=named.replace(".", r"\.")):
        apply_overrides(Settings(), [pair])


def _workload(tmp_path: Path) -> Path:
    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\n")
    return wl


def test_simulate_cli_rejects_a_bad_set_with_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["simulate", "--workload", str(_workload(tmp_path)), "--out", str(tmp_path / "o")]
    assert main([*base, "--set", "sharing.no_such_key=1"]) == 2
    assert "sharing.no_such_key" in capsys.readouterr().err
    assert main([*base, "--set", "controller.round_period_s=-5"]) == 2
    assert "controller.round_period_s" in capsys.readouterr().err
    assert main([*base, "--profile-noise", "-0.1"]) == 2
    assert main([*base, "--share-noise", "nan"]) == 2
    assert not (tmp_path / "o" / "summary.json").exists()


def test_simulate_cli_records_the_switches(tmp_path: Path) -> None:
    out = tmp_path / "o"
    rc = main(["simulate", "--workload", str(_workload(tmp_path)), "--gpus", "4",
               "--policy", "optimus+", "--seed", "1", "--out", str(out), "--quiet",
               "--set", "controller.round_period_s=120", "--profile-noise", "0.4",
               "--share-noise", "0.5"])  # fmt: skip
    assert rc == 0
    opts = json.loads((out / "summary.json").read_text())["options"]
    assert opts["profile_noise"] == 0.4 and opts["share_noise"] == 0.5


# ----- noise -----------------------------------------------------------------------------------


def _samples(noise: ProfileNoise, n: int = 400) -> list[tuple[float, float, float]]:
    t, rng = truth(), np.random.default_rng(7)
    out = []
    for _ in range(n):
        s = t.observe_profile(rng, gpus=1, batch=128, frozen=0, noise=noise)
        out.append((s.t_iter_s, s.peak_mem_bytes, s.gpu_util))
    return out


def _log_sd(values: list[float]) -> float:
    return float(np.std(np.log(values)))


def test_profile_noise_sets_the_spread_of_the_profiled_times() -> None:
    t = truth()
    true_iter = t.times(gpus=1, batch=128, frozen=0)[3]
    exact = _samples(ProfileNoise(time=0.0))
    assert all(math.isclose(it, true_iter, rel_tol=1e-12) for it, _, _ in exact)
    for sd in (0.1, 0.5):
        got = _log_sd([it for it, _, _ in _samples(ProfileNoise(time=sd))])
        assert got == pytest.approx(sd, rel=0.15)
    # the mean stays on the truth (mean-one noise), so a model fit is unbiased, only noisier
    noisy = [it for it, _, _ in _samples(ProfileNoise(time=0.5), n=2000)]
    assert float(np.mean(noisy)) == pytest.approx(true_iter, rel=0.05)


def test_share_noise_sets_the_spread_of_memory_and_utilisation() -> None:
    quiet = _samples(ProfileNoise(memory=0.0, util=0.0))
    assert len({m for _, m, _ in quiet}) == 1 and len({u for _, _, u in quiet}) == 1
    loud = _samples(ProfileNoise(memory=0.5, util=0.2))
    assert _log_sd([m for _, m, _ in loud]) == pytest.approx(0.5, rel=0.15)
    assert float(np.std([u for _, _, u in loud])) > 0.05  # clipped to 0..1, so below 0.2


def test_default_noise_draws_as_before() -> None:
    """The default reproduces the old module-constant draws exactly (same order, same sd)."""
    t = truth()
    sample = t.observe_profile(np.random.default_rng(3), gpus=2, batch=64, frozen=1)
    rng = np.random.default_rng(3)
    fwd, bwd, _, it = t.times(gpus=2, batch=64, frozen=1)
    sd = PROFILE_TIME_NOISE
    f, b, i = np.array([fwd, bwd, it]) * np.exp(rng.normal(-0.5 * sd * sd, sd, 3))
    util = t.utilisation(batch=64, frozen=1) + rng.normal(0.0, UTIL_NOISE)
    mem = t.memory(batch=64, frozen=1) * math.exp(rng.normal(-0.5 * MEMORY_NOISE**2, MEMORY_NOISE))
    assert sample.t_fwd_s == f and sample.t_bwd_s == b and sample.t_iter_s == i
    assert sample.gpu_util == min(max(util, 0.0), 1.0) and sample.peak_mem_bytes == mem
    assert SimOptions().noise() == ProfileNoise()


def test_sim_options_noise_and_its_checks() -> None:
    n = SimOptions(profile_noise=0.25, share_noise=1.0).noise()
    assert (n.time, n.memory, n.util) == (0.25, 1.0, 1.0)
    with pytest.raises(InputError, match="time"):
        SimOptions(profile_noise=-1.0).noise()


# ----- --out -----------------------------------------------------------------------------------


def test_an_out_that_takes_no_files_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("simulated before --out was found unwritable")

    monkeypatch.setattr(simulate.Engine, "run", never)
    if os.geteuid() == 0:  # root writes through permission bits: a folder that takes no file
        out = Path("/proc")
    else:
        out = tmp_path / "ro"
        out.mkdir()
        out.chmod(0o555)
    argv = ["simulate", "--workload", str(_workload(tmp_path)), "--out", str(out), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: cannot write there" in err


def test_each_policy_is_kept_as_it_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--policy all rewrites summary.json after each policy (``pending``: those left), so
    an interrupted run keeps what finished; the complete file has no ``pending``."""
    real = simulate.Engine.run
    ran: list[str] = []

    def second_interrupted(self: simulate.Engine, *a: object, **k: object) -> object:
        ran.append(self.policy.name)
        if len(ran) == 2:
            self.close()  # as run's own finally does
            raise KeyboardInterrupt
        return real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(simulate.Engine, "run", second_interrupted)
    out = tmp_path / "o"
    argv = ["simulate", "--workload", str(_workload(tmp_path)), "--gpus", "4", "--out",
            str(out), "--quiet", "--policy", "all"]  # fmt: skip
    assert main(argv) == 130
    doc = json.loads((out / "summary.json").read_text())
    assert list(doc["policies"]) == ["icefrog"]
    assert doc["pending"] == ["lucid+", "optimus+", "pollux+", "slurm"]
    assert doc["policies"]["icefrog"]["totals"]["finished"] == 1
    assert doc["run"]["argv"][:2] == ["icefrog", "simulate"]
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]  # no temporary file
    monkeypatch.setattr(simulate.Engine, "run", real)
    assert main(argv) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert list(doc["policies"]) == list(simulate.ALL) and "pending" not in doc
    assert not list(out.glob(".*"))


@pytest.mark.parametrize(
    ("pair", "needs"),
    [
        ("controller.round_period_s=86401", "controller.round_period_s: the simulator needs 1 to "
         "86400 s, got 86401"),
        ("controller.round_period_s=1e300", "controller.round_period_s: the simulator needs"),
        ("controller.reconcile_poll_s=1e300", "controller.reconcile_poll_s: the simulator needs"),
    ],
)  # fmt: skip
def test_a_round_or_poll_longer_than_a_day_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pair: str, needs: str
) -> None:
    """A step past a day left the jobs' times to a clock too coarse to count seconds (a
    round of 1e300 s gave negative JCTs, exit 0)."""
    argv = ["simulate", "--workload", str(_workload(tmp_path)), "--gpus", "4", "--policy",
            "icefrog", "--out", str(tmp_path / "o"), "--quiet", "--set", pair]  # fmt: skip
    assert main(argv) == 2
    assert needs in capsys.readouterr().err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_round_longer_than_the_simulation_is_refused() -> None:
    settings = apply_overrides(Settings(), ["controller.round_period_s=7200"])
    with pytest.raises(InputError, match="round_period_s: the simulator needs 1 to 3600 s"):
        check_steps(settings, SimOptions(max_sim_s=3600.0))
    check_steps(settings, SimOptions())  # the default 60 days: fine
