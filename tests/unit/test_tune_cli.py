"""``icefrog tune`` end to end: the spec's section 11 example and bad input (exit code 2)."""

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.cli import main

REPO = Path(__file__).resolve().parents[2]


def section11(suffix_var: float = 70.0) -> dict[str, Any]:
    return {
        "layers": 20,
        "max_frozen": 18,
        "frozen_candidates": [0, 10],
        "frozen_now": 10,
        "gpus": 2,
        "shared": False,
        "batch_sizes": [64],
        "throughput": [
            {"gpus": 2, "batch": 64, "frozen": 0, "samples_per_s": 800},
            {"gpus": 2, "batch": 64, "frozen": 10, "samples_per_s": 1200},
        ],
        # prefix variance 30 taken at freeze time (3 a layer), suffix `suffix_var` now
        "grad_var": [3.0] * 10 + [suffix_var / 10] * 10,
    }


def run_tune(doc: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    path = tmp_path / "job.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    code = main(["tune", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_section11_freezes_ten_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_tune(section11(70.0), tmp_path, capsys)
    assert code == 0
    result = json.loads(out)
    assert set(result) == {"batch", "frozen", "psi", "throughput", "effective_progress"}
    assert result["batch"] == 64 and result["frozen"] == 10
    assert result["psi"] == pytest.approx(0.7)
    assert result["throughput"] == pytest.approx(1200)
    assert result["effective_progress"] == pytest.approx(840)


def test_section11_next_epoch_thaws(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_tune(section11(30.0), tmp_path, capsys)
    result = json.loads(out)
    assert code == 0 and result["frozen"] == 0
    assert result["psi"] == 1.0 and result["effective_progress"] == pytest.approx(800)


def test_through_python_m_and_stdin() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "icefrog_slurm", "tune", "-"],
        input=json.dumps(section11(70.0)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["effective_progress"] == pytest.approx(840)


def test_unmeasured_configurations_are_predicted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = section11(70.0)
    del doc["frozen_candidates"]
    doc["batch_sizes"] = [32, 64, 128]
    code, out, _ = run_tune(doc, tmp_path, capsys)
    result = json.loads(out)
    assert code == 0
    assert 0 <= result["frozen"] <= 18
    # The winner is at least as good as the best measured option.
    assert result["effective_progress"] >= 840 - 1e-6
    assert result["effective_progress"] == pytest.approx(result["psi"] * result["throughput"])


def test_shared_applies_lambda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = section11(70.0)
    doc.update(gpus=1, shared=True, frozen_candidates=[0])
    doc["throughput"] = [{"gpus": 1, "batch": 64, "frozen": 0, "samples_per_s": 500}]
    code, out, _ = run_tune(doc, tmp_path, capsys)
    assert code == 0 and json.loads(out)["throughput"] == pytest.approx(450)


def _without(key: str) -> dict[str, Any]:
    doc = section11()
    del doc[key]
    return doc


def _with(**changes: Any) -> dict[str, Any]:
    doc = section11()
    doc.update(changes)
    return doc


BAD = [
    (_without("gpus"), "gpus: missing"),
    (_without("grad_var"), "grad_var: missing"),
    (_without("throughput"), "throughput: missing"),
    (_with(gpus=0), "gpus: must be >= 1"),
    (_with(gpus="2"), "gpus: must be an integer"),
    (_with(layers=0), "layers: must be >= 1"),
    (_with(grad_var=[1.0] * 19), "grad_var: has 19 values for 20 layers"),
    (_with(grad_var=[1.0] * 19 + [-1.0]), r"grad_var\[19\]: must be >= 0"),
    (_with(batch_sizes=[]), "batch_sizes: must not be empty"),
    (_with(batch_sizes=[64, 0]), r"batch_sizes\[1\]: must be >= 1"),
    (_with(frozen_candidates=[0, 19]), r"frozen_candidates\[1\]: must be <= 18"),
    (_with(max_frozen=21), "max_frozen: must be <= 20"),
    (_with(frozen_now=-1), "frozen_now: must be >= 0"),
    (_with(shared=True), "shared: only a 1-GPU job"),
    (_with(shared="no"), "shared: must be true or false"),
    (_with(layer_flops=[1.0] * 3), "layer_flops: has 3 values for 20 layers"),
    (_with(layer_param_bytes=[0.0] * 20), "layer_param_bytes: the layers' total"),
    (_with(extra=1), "extra: unknown field"),
    (_with(throughput=[]), "throughput: needs at least one"),
    (
        _with(throughput=[{"gpus": 2, "batch": 64, "frozen": 0}]),
        r"throughput\[0\].samples_per_s: missing",
    ),
    (
        _with(throughput=[{"gpus": 2, "batch": 64, "frozen": 0, "samples_per_s": 0}]),
        r"throughput\[0\].samples_per_s: must be > 0",
    ),
    (
        _with(throughput=[{"gpus": 2, "batch": 64, "frozen": 0, "samples_per_s": 1, "x": 1}]),
        r"throughput\[0\].x: unknown field",
    ),
    (
        _with(throughput=[{"gpus": 2, "batch": 64, "frozen": 21, "samples_per_s": 1}]),
        r"throughput\[0\].frozen: must be <= 20",
    ),
    (
        _with(throughput=[{"gpus": 2, "batch": 64, "frozen": 0, "samples_per_s": 1}] * 2),
        r"throughput\[1\]: a second entry",
    ),
    ("[1, 2]", "input: must be an object"),
    ("{not json", "not valid JSON"),
]


@pytest.mark.parametrize(("doc", "message"), BAD)
def test_bad_input_exits_2_naming_the_field(
    doc: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_tune(doc, tmp_path, capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("icefrog tune: error: ")
    assert re.search(message, err), err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
