"""Host memory and cores per GPU: ``icefrog submit --mem-per-gpu/--cpus-per-gpu`` and the
``[submit]`` defaults reach sbatch, and a gpu<->shard resubmission keeps what the job
asked for (read back from ``squeue --json``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.commands import submit
from icefrog_slurm.domain.cluster import Gres, IcefrogTag
from icefrog_slurm.settings import settings_from_mapping
from icefrog_slurm.slurm import commands, parse
from icefrog_slurm.slurm.port import SubmitRequest


def _request(gres: Gres, mem: int | None, cpus: int | None) -> SubmitRequest:
    return SubmitRequest(
        script="/s.sh", tag=IcefrogTag("k"), name="n", gres=gres, mem_per_gpu_mb=mem,
        cpus_per_gpu=cpus,
    )  # fmt: skip


def test_whole_gpus_ask_per_gpu_and_a_shared_job_one_gpus_worth() -> None:
    assert commands.sbatch_held(_request(Gres("gpu", 2), 900, 2))[-2:] == (
        "--mem-per-gpu=900M",
        "--cpus-per-gpu=2",
    )
    assert commands.sbatch_held(_request(Gres("shard", 1), 900, 2))[-2:] == (
        "--mem=900M",
        "--cpus-per-task=2",
    )
    plain = commands.sbatch_held(_request(Gres("gpu", 1), None, None))
    assert not any(a.startswith(("--mem", "--cpus")) for a in plain)  # slurm.conf's defaults


def test_resubmission_builder_keeps_memory_and_cores() -> None:
    common: dict[str, Any] = dict(
        comment="c", num_nodes=1, nodes=(), partition="gpu", work_dir="/w", std_out=None,
        std_err=None, time_limit_min=None,
    )  # fmt: skip
    to_shard = commands.resubmit(
        "n", gres=Gres("shard", 1), mem_per_gpu_mb=900, cpus_per_gpu=2, **common
    )
    assert to_shard[-2:] == ("--mem=900M", "--cpus-per-task=2")
    to_gpu = commands.resubmit(
        "n", gres=Gres("gpu", 2), mem_per_gpu_mb=900, cpus_per_gpu=2, **common
    )
    assert to_gpu[-2:] == ("--mem-per-gpu=900M", "--cpus-per-gpu=2")
    assert not any(
        a.startswith("--mem") for a in commands.resubmit("n", gres=Gres("gpu", 1), **common)
    )


def _record(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job_id": 7, "user_id": 1000, "group_id": 1000, "job_state": "PENDING", "name": "n",
        "partition": "gpu", "current_working_directory": "/w",
    }  # fmt: skip
    return {**base, **fields}


@pytest.mark.parametrize(
    ("fields", "mem", "cpus"),
    [
        # 22.05: what a GPU job asked per GPU
        ({"tres_per_node": "gres:gpu:2", "memory_per_tres": "gres:gpu:900",
          "cpus_per_tres": "gres:gpu:2"}, 900, 2),
        # 24.11's layout: gres/ names and numbers as objects
        ({"tres_per_node": "gres/gpu:2", "memory_per_tres": "gres/gpu:900",
          "cpus_per_tres": "gres/gpu:2",
          "memory_per_node": {"set": True, "infinite": False, "number": 1800}}, 900, 2),
        # 22.05 shows the DefMemPerGPU/DefCpuPerGPU it filled in without "gres:"
        ({"tres_per_node": "gres:gpu:1", "memory_per_tres": "gpu:450", "cpus_per_tres": "gpu:1",
          "memory_per_cpu": 400}, 450, 1),
        # a GPU job with no per-GPU figures: nothing to keep (a per-node figure is no per-GPU one)
        ({"tres_per_node": "gres:gpu:2", "memory_per_tres": "", "cpus_per_tres": "",
          "memory_per_node": 900}, None, None),
        # a shard job icefrog gave one GPU's worth: per node, per task
        ({"tres_per_node": "gres:shard:1", "memory_per_node": 900, "cpus_per_task": 2}, 900, 2),
        # 22.05: cpus_per_task unset, -c 2 shown as 2 cores a node; 1 core is the default
        ({"tres_per_node": "gres:shard:1", "memory_per_node": 900, "cpus_per_task": None,
          "minimum_cpus_per_node": 2}, 900, 2),
        ({"tres_per_node": "gres:shard:1", "memory_per_cpu": 400, "minimum_cpus_per_node": 1},
         None, None),
        # a shard job on DefMemPerCPU
        ({"tres_per_node": "gres:shard:1", "memory_per_cpu": 450, "memory_per_node": None},
         None, None),
        # hostile or odd text never turns into a number
        ({"tres_per_node": "gres:gpu:1", "memory_per_tres": "gres:gpu:9x,gres:gpu:",
          "cpus_per_tres": "gpu:99999999999999999999"}, None, None),
    ],
)  # fmt: skip
def test_squeue_json_gives_what_the_job_asked(
    fields: dict[str, Any], mem: int | None, cpus: int | None
) -> None:
    (detail,) = parse.parse_squeue_json(_json([_record(**fields)])).values()
    assert (detail.mem_per_gpu_mb, detail.cpus_per_gpu) == (mem, cpus)


def _json(jobs: list[dict[str, Any]]) -> str:
    return json.dumps({"jobs": jobs, "errors": []})


@pytest.mark.parametrize(
    ("text", "mb"),
    [("900", 900), ("900M", 900), ("900m", 900), ("80G", 81920), ("1T", 1024**2), ("1536K", 2)],
)
def test_mem_size_reads_sbatch_sizes(text: str, mb: int) -> None:
    assert submit.mem_size(text) == mb


@pytest.mark.parametrize("text", ["", "0", "-1", "1.5G", "80GB", "\u00b2", "9" * 13, "65T", " "])
def test_mem_size_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        submit.mem_size(text)


@pytest.mark.parametrize("text", ["0", "-2", "2.5", "4097", "\u00b2", "9" * 40, ""])
def test_cpu_count_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        submit.cpu_count(text)


def test_submit_settings_section() -> None:
    s = settings_from_mapping({"submit": {"mem_per_gpu_mb": 120000, "cpus_per_gpu": 8}})
    assert (s.submit.mem_per_gpu_mb, s.submit.cpus_per_gpu) == (120000, 8)
    for bad in ({"mem_per_gpu_mb": 0}, {"cpus_per_gpu": "8"}, {"mem": 1}):
        with pytest.raises(Exception, match="submit"):
            settings_from_mapping({"submit": bad})


class _Backend:
    requests: ClassVar[list[SubmitRequest]] = []

    def submit_held(self, *, request: SubmitRequest) -> str:
        self.requests.append(request)
        return "41"

    def cancel(self, *, job_id: str) -> None:  # registering fails without munge here
        pass


@pytest.mark.parametrize(
    ("flags", "toml", "want"),
    [
        (["--mem-per-gpu", "80G", "--cpus-per-gpu", "8"], "", (81920, 8)),
        ([], "[submit]\nmem_per_gpu_mb = 1000\ncpus_per_gpu = 3\n", (1000, 3)),
        (["--cpus-per-gpu", "4"], "[submit]\nmem_per_gpu_mb = 1000\ncpus_per_gpu = 3\n", (1000, 4)),
        ([], "", (None, None)),
    ],
)
def test_submit_passes_flags_else_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], toml: str,
    want: tuple[int | None, int | None],
) -> None:  # fmt: skip
    _Backend.requests = []
    monkeypatch.setattr(submit, "SlurmCliBackend", _Backend)
    monkeypatch.setattr(submit, "register", lambda **kw: tmp_path / "r")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    config = tmp_path / "icefrog.toml"
    config.write_text(toml)
    argv = ["submit", "--config", str(config), "--inbox", str(inbox)]
    (tmp_path / "t.py").write_text("print('hi')\n")
    argv += ["--workdir", str(tmp_path / "w"), *flags, "--", str(tmp_path / "t.py")]
    assert main(argv) == 0
    (req,) = _Backend.requests
    assert (req.mem_per_gpu_mb, req.cpus_per_gpu) == want
