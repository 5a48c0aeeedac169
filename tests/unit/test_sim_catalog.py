"""The simulator's task catalog and its generated per-layer tables."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest

from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.protocol import parse_payload
from icefrog_slurm.sim.catalog import layer_document, load_catalog, shipped_catalog

PAPER = ("resnet18-cifar10", "resnet50-imagenet", "mobilenetv2-cifar10", "yolov3-voc",
         "ddpm-cifar10", "llama-3b-squad2", "llama-7b-sst2")  # fmt: skip
POLLUX_APPS = {"cifar10": "resnet18-cifar10", "imagenet": "resnet50-imagenet",
               "yolov3": "yolov3-voc", "bert": "bert-squad", "deepspeech2": "deepspeech2-arctic",
               "ncf": "ncf-movielens"}  # fmt: skip


def test_every_paper_task_and_pollux_app_is_there() -> None:
    catalog = shipped_catalog()
    assert set(PAPER) <= set(catalog.names)
    assert set(catalog.available("icefrog")) <= set(PAPER)
    for app, task in POLLUX_APPS.items():
        assert catalog.resolve(app) == task


@pytest.mark.parametrize("name", shipped_catalog().available())
def test_tables_are_consistent(name: str) -> None:
    catalog = shipped_catalog()
    task, layers = catalog.get(name), catalog.layers(name)
    assert layers.num_layers >= 4
    assert len(set(layers.names)) == layers.num_layers
    assert layers.theta(0) == layers.omega(0) == 1.0
    assert all(layers.theta(k) >= layers.theta(k + 1) for k in range(layers.num_layers))
    if not task.layers_ref.startswith("core:"):
        doc = layer_document(task.layers_ref)
        assert math.isclose(math.fsum(layers.flops), doc["total_flops"], rel_tol=1e-9)
        assert math.fsum(layers.param_bytes) == doc["total_params"] * doc["bytes_per_param"]
    sizes = task.batch_sizes()
    assert task.default_batch in sizes and all(m & (m - 1) == 0 for m in sizes)
    assert all(a % task.gpu_unit == 0 for a in task.gpu_counts())
    spec = task.job_spec(layers)  # what a simulated job registers must pass the protocol
    assert parse_payload("register", json.loads(json.dumps(asdict(spec)))) == spec


def test_known_architecture_sizes() -> None:
    """Parameter counts of the generated tables against the published architectures."""
    expected_m = {
        "resnet18-cifar10": 11.17,
        "resnet50-imagenet": 25.56,
        "bert-base-squad": 108.9,
        "ddpm-cifar10": 35.75,
        "mobilenetv2-cifar10": 2.24,
        "yolov3-voc": 61.6,
    }
    for ref, millions in expected_m.items():
        assert layer_document(ref)["total_params"] / 1e6 == pytest.approx(millions, rel=0.01)
    # ResNet50 at 224x224: 4.1 GMACs = 8.2 GFLOPs a sample
    assert layer_document("resnet50-imagenet")["total_flops"] == pytest.approx(8.18e9, rel=0.01)


def test_llama_tables_are_referenced_not_copied() -> None:
    catalog = shipped_catalog()
    for name in ("llama-3b-squad2", "llama-7b-sst2"):
        assert catalog.get(name).layers_ref.startswith("core:")
        try:
            layers = catalog.layers(name)
        except IcefrogError as exc:  # core.transformer_tables cannot be imported
            assert "transformer_tables" in str(exc)
            assert name not in catalog.available()
        else:
            assert layers.num_layers > 20 and name in catalog.available()


def _doc(**changes: object) -> str:
    task = {"name": "t", "model": "m", "dataset": "d", "layers": "resnet18-cifar10",
            "gpus": [1, 4], "batch": [32, 256], "default_batch": 64,
            "target": {"metric": "top1", "op": ">=", "value": 0.9}, "max_epochs": 10,
            "samples_per_epoch": 100, "size_class": "small",
            "calibration": {"scale_from": "t"}, "suite": "icefrog", "parallelism": {"kind": "ddp"},
            "aliases": []}  # fmt: skip
    task.update(changes)
    return json.dumps({"tasks": [task]})


def test_a_valid_document_loads() -> None:
    catalog = load_catalog(_doc())
    assert catalog.get("t").batch_sizes() == (32, 64, 128, 256)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"colour": "red"}, "colour: unknown field"),
        ({"size_class": "huge"}, "size_class"),
        ({"default_batch": 96}, "power of two"),
        ({"default_batch": 512}, "default_batch"),
        ({"gpus": [4, 1]}, "gpus"),
        ({"gpus": [1, 6], "parallelism": {"kind": "ddp", "unit": 4}}, "gpus: bounds must be"),
        ({"gpus": [4, 8], "parallelism": {"kind": "hp", "stages": 3, "unit": 4}}, "HP"),
        ({"parallelism": "hp"}, r"parallelism: must be an object"),
        ({"parallelism": {"kind": "hp"}}, r"parallelism.stages: hp needs >= 2"),
        ({"target": {"metric": "a", "op": "=", "value": 1}}, "target.op"),
        ({"calibration": {}}, "exactly one"),
        ({"calibration": {"scale_from": "nope"}}, "no task 'nope'"),
        ({"calibration": {"fine_tune_from": "nope"}}, "fine_tune_from: no task 'nope'"),
        ({"calibration": {"scale_from": "t", "fine_tune_from": "t"}}, "exactly one"),
        ({"calibration": {"pollux": "bert", "target_epochs": 2}}, "target_epochs: only"),
        (
            {"calibration": {"fine_tune_from": "t", "v100_step_s": {"32": 0.1, "64": 0.2}}},
            "v100_step_s: only for a scale_from",
        ),
        ({"aliases": [3]}, "aliases"),
    ],
)
def test_bad_documents_name_the_field(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_catalog(_doc(**changes))


def test_unknown_task_lists_the_known_ones() -> None:
    with pytest.raises(InputError, match=r"alexnet.*known: bert"):
        shipped_catalog().resolve("alexnet")


@pytest.mark.torch
def test_regenerated_table_matches_the_committed_one() -> None:
    pytest.importorskip("torch")
    from tools.gen_task_catalog import layer_table

    fresh = layer_table("resnet18-cifar10")
    committed = layer_document("resnet18-cifar10")
    assert fresh["layers"] == committed["layers"]
    assert fresh["total_flops"] == committed["total_flops"]
