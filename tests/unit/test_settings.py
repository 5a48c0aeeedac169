"""Settings: strict TOML loading, documented fields, and the example file covers them all."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import tomllib
import typing
from pathlib import Path

import pytest

from icefrog_slurm import settings as settings_module
from icefrog_slurm.errors import InputError
from icefrog_slurm.settings import Settings, load_settings, settings_from_mapping

EXAMPLE = Path(__file__).resolve().parents[2] / "slurm_conf" / "icefrog.toml.example"


def _sections() -> list[tuple[str, type]]:
    hints = typing.get_type_hints(Settings)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(Settings)]


def test_defaults() -> None:
    s = Settings()
    assert s.controller.round_period_s == 300.0 and s.controller.reallocation_overhead_s == 60.0
    assert s.store.url == "sqlite:////var/lib/icefrog/icefrog.db"
    assert s.inbox.dir == "/var/lib/icefrog/inbox"
    assert (s.slurm.partition, s.slurm.gpu_mem_gb) == ("gpu", 80.0)
    assert (s.sharing.memory_safety, s.sharing.speed_factor, s.sharing.max_jobs_per_gpu) == (
        1.1,
        0.9,
        2,
    )
    assert s.metrics.port is None and s.logging.level == "INFO"
    assert (s.sharing.gres, s.slurm.shards_per_gpu, s.slurm.mps_per_gpu) == ("shard", 2, 100)


def test_derived_paths_follow_the_state_dir() -> None:
    s = settings_from_mapping({"state": {"dir": "/srv/ice"}, "inbox": {"archive_dir": "/srv/a"}})
    assert s.store.url == "sqlite:////srv/ice/icefrog.db"
    assert (s.inbox.dir, s.inbox.archive_dir) == ("/srv/ice/inbox", "/srv/a")


def test_the_example_loads_sets_every_field_to_its_default() -> None:
    text = EXAMPLE.read_text()
    data = tomllib.loads(text)
    assert load_settings(EXAMPLE) == Settings()
    for section, cls in _sections():
        for f in dataclasses.fields(cls):
            if f.name in data.get(section, {}):
                continue
            # Only optional fields may be left out, shown as a commented line.
            assert f.default is None, f"{section}.{f.name} is missing from the example"
            assert f"# {f.name} = " in text, f"{section}.{f.name}: no commented example line"


def test_every_field_has_a_docstring() -> None:
    tree = ast.parse(inspect.getsource(settings_module))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    for cls in [Settings, *(c for _, c in _sections())]:
        body = classes[cls.__name__].body
        documented = {
            stmt.target.id
            for stmt, nxt in itertools.pairwise(body)
            if isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        }
        assert documented == {f.name for f in dataclasses.fields(cls)}, cls.__name__


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"sharing": {"lamda": 0.9}},
            "sharing.lamda: unknown field; allowed: before_samples, gres, max_jobs_per_gpu",
        ),
        ({"metric": {}}, "metric: unknown field; allowed: controller, inbox, logging"),
        (
            {"controller": {"round_period_s": "300"}},
            'controller.round_period_s: must be a number, got "300"',
        ),
        ({"controller": {"round_period_s": 0}}, "controller.round_period_s: must be >= 1"),
        # a careless admin's values that cannot work: a loop made hot, paths relative to
        # wherever the command runs
        ({"controller": {"round_period_s": 1e-300}}, "controller.round_period_s: must be >= 1"),
        ({"controller": {"reconcile_poll_s": 1e-300}}, "reconcile_poll_s: must be >= 0.05"),
        ({"inbox": {"poll_s": 1e-300}}, "inbox.poll_s: must be >= 0.05"),
        ({"inbox": {"munge_retry_s": 1e-300}}, "inbox.munge_retry_s: must be >= 1"),
        ({"state": {"dir": "var/icefrog"}}, "state.dir: must be an absolute path, got 'var/"),
        ({"inbox": {"dir": "inbox"}}, "inbox.dir: must be an absolute path"),
        ({"inbox": {"archive_dir": "./archive"}}, "inbox.archive_dir: must be an absolute path"),
        ({"sharing": {"max_jobs_per_gpu": 2.5}}, "sharing.max_jobs_per_gpu: must be an integer"),
        ({"sharing": {"max_jobs_per_gpu": 4}}, "sharing.max_jobs_per_gpu: must be <= 2"),
        ({"sharing": {"speed_factor": 1.5}}, "sharing.speed_factor: must be <= 1"),
        ({"metrics": {"port": 70000}}, "metrics.port: must be <= 65535"),
        (
            {"logging": {"level": "LOUD"}},
            "logging.level: must be one of DEBUG, INFO, WARNING, ERROR",
        ),
        (
            {"policy": {"freezing": "freezout"}},
            "policy.freezing: must be one of penalty, freezeout",
        ),
        ({"slurm": "gpu"}, "slurm: must be a table"),
        ({"sharing": {"gres": "gpu"}}, "sharing.gres: must be one of shard, mps, got 'gpu'"),
        ({"sharing": {"gres": 1}}, "sharing.gres: must be a"),
        ({"slurm": {"mps_per_gpu": 0}}, "slurm.mps_per_gpu: must be >= 1"),
        ({"store": {"url": ""}}, "store.url: must be a non-empty string"),
    ],
)
def test_bad_settings_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=r"^x\.toml: ") as err:
        settings_from_mapping(data, where="x.toml")
    assert message in str(err.value)


def test_bad_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_settings(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[controller\n")
    with pytest.raises(InputError, match="not valid TOML"):
        load_settings(bad)
