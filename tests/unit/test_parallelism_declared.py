"""A job's declared parallelism: the protocol's strict form, ``icefrog launch``'s flags."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from icefrog_launcher.config import JobConfig
from icefrog_slurm.cli import main
from icefrog_slurm.core.parallelism import DDP, Kind, Parallelism, parse_parallelism
from icefrog_slurm.errors import InputError
from icefrog_slurm.protocol import JobSpec, parse_payload


def _spec(**changes: object) -> JobSpec:
    base = JobSpec(
        min_gpus=4, max_gpus=16, min_batch=8, max_batch=8, max_frozen_fraction=0.9,
        target_metric="val_acc", target_op=">=", target_value=0.9, max_epochs=3,
        samples_per_epoch=1000, layer_flops=(1.0, 2.0), layer_param_bytes=(3.0, 4.0),
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _wire(spec: JobSpec) -> dict[str, object]:
    """The payload as the launcher sends it (asdict, then through JSON)."""
    doc: dict[str, object] = json.loads(json.dumps(dataclasses.asdict(spec)))
    return doc


def test_register_payload_round_trips_the_parallelism() -> None:
    hp = _spec(parallelism=Parallelism(Kind.HP, stages=2, unit=4))
    assert parse_payload("register", _wire(hp)) == hp
    # A payload from before the field existed reads as plain DDP in units of 1.
    old = _wire(_spec())
    del old["parallelism"]
    assert parse_payload("register", old).parallelism == DDP


@pytest.mark.parametrize(
    ("parallelism", "message"),
    [
        ({"kind": "tp"}, r"parallelism\.kind: must be one of"),
        ({"kind": "sdp", "unit": 0}, r"parallelism\.unit"),
        ({"kind": "sdp", "stages": 2}, "sdp has no stages"),
        ({"kind": "pp"}, "pp needs >= 2"),
        ({"kind": "ddp", "extra": 1}, r"parallelism\.extra: unknown field"),
        ({"kind": "sdp", "unit": "4"}, r"parallelism\.unit"),
        ("sdp", r"parallelism: must be an object"),
        # 4..16 GPUs hold no multiple of 32 and pure PP with 32 stages needs 32 GPUs
        ({"kind": "sdp", "unit": 32}, r"no GPU count in \[4, 16\] is legal"),
        ({"kind": "pp", "stages": 32}, r"no GPU count in \[4, 16\] is legal"),
    ],
)
def test_register_rejects_a_bad_parallelism(parallelism: object, message: str) -> None:
    doc = _wire(_spec())
    doc["parallelism"] = parallelism
    with pytest.raises(InputError, match=message):
        parse_payload("register", doc)


def test_parse_parallelism_forms() -> None:
    assert parse_parallelism("ddp") == (DDP, 0)
    assert parse_parallelism("SDP", 4) == (Parallelism(Kind.SDP, unit=4), 0)
    assert parse_parallelism("pp:4", 4) == (Parallelism(Kind.PP, stages=4, unit=4), 4)
    assert parse_parallelism("hp:2x4", 4) == (Parallelism(Kind.HP, stages=4, unit=4), 8)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--parallelism", "tp"], "expected ddp, sdp, pp:P or hp:DxP"),
        (["--parallelism", "pp"], "expected pp:P"),
        (["--parallelism", "hp:4"], "expected hp:DxP"),
        (["--parallelism", "hp:2xa"], "expected hp:DxP with positive integers"),
        (["--parallelism", "sdp:2"], "sdp takes no ':' part"),
        (["--gpu-unit", "0"], "--gpu-unit: must be >= 1"),
        (["--gpus", "1-3", "--gpu-unit", "4"], "--gpus: no count in 1-3 is legal"),
        (["--gpus", "4-8", "--parallelism", "hp:4x4", "--gpu-unit", "4"], "outside --gpus 4-8"),
        (["--gpus", "8", "--parallelism", "pp:3", "--gpu-unit", "4"], "not a multiple of the unit"),
    ],
)
def test_launch_rejects_bad_parallelism_flags(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["launch", *argv, "--dry-run", "--", "t.py"]) == 2
    assert message in capsys.readouterr().err


def test_launch_passes_the_parallelism_to_the_trainer(
    capsys: pytest.CaptureFixture[str], tmp_path: os.PathLike[str]
) -> None:
    argv = ["launch", "--gpus", "4-16", "--parallelism", "hp:2x4", "--gpu-unit", "4",
            "--workdir", os.fspath(tmp_path), "--dry-run", "--", "t.py"]  # fmt: skip
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "PARALLELISM=" in x)
    env = {"ICEFROG_PARALLELISM": line.split("=", 1)[1].strip("'"), "ICEFROG_GPUS": "4-16"}
    config = JobConfig.from_env(env)
    assert config.parallelism == Parallelism(Kind.HP, stages=4, unit=4)
    assert not config.accepts_shared  # only DDP in units of 1 may share a GPU
    assert JobConfig(gpus=(1, 4)).accepts_shared


@pytest.mark.parametrize(
    ("gpus", "parallelism", "unit"),
    [("1-4", "ddp", "1"), ("4-16", "sdp", "4"), ("4-8", "pp:4", "4"), ("4-16", "hp:2x4", "4")],
)
def test_declaration_round_trips_through_launch_options(
    gpus: str, parallelism: str, unit: str
) -> None:
    """`icefrog submit` writes launch options into the batch script; `icefrog launch` must
    read back the same declaration, parallelism included."""
    import argparse

    from icefrog_slurm import declaration

    parser = argparse.ArgumentParser()
    declaration.add_arguments(parser)
    first = declaration.from_args(
        parser.parse_args(["--gpus", gpus, "--parallelism", parallelism, "--gpu-unit", unit])
    )
    again = declaration.from_args(parser.parse_args(first.launch_options()))
    assert again == first
    assert first.accepts_shared == (parallelism == "ddp")
    assert first.job_spec(samples_per_epoch=1).parallelism == first.parallelism
