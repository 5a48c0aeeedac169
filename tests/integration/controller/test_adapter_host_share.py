"""Both Slurm adapters submit a job with the host memory and cores it asks for besides its
GPUs, as slurm.conf's CR_Core_Memory needs: per GPU for whole GPUs (``--mem-per-gpu``,
``--cpus-per-gpu``; pyslurm's ``memory_per_gpu``, ``cpus_per_gpu``), one GPU's worth per
node for a shard job (``--mem``, ``--cpus-per-task``; ``memory_per_node``,
``cpus_per_task``), and nothing when none is asked (slurm.conf's defaults apply when the job
starts: a held job shows no per-GPU share then). What the job asked for is read back with
``scontrol show job``, not through the adapter. The adapters come from
tests/integration/test_slurm_contract.py (the pyslurm one over the stand-in where pyslurm is
not importable).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.slurm.port import ClusterPort
from tests.integration.test_slurm_contract import _request, port, script  # noqa: F401

pytestmark = pytest.mark.slurm


def _show(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True
    ).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


@pytest.mark.parametrize(
    ("gres", "asked", "expected"),
    [
        (Gres("gpu", 1), {"mem_per_gpu_mb": 300, "cpus_per_gpu": 2},
         {"MemPerTres": "gres:gpu:300", "CpusPerTres": "gres:gpu:2"}),
        (Gres("gpu", 1), {}, {"MemPerTres": None, "CpusPerTres": None}),
        (Gres("shard", 1), {"mem_per_gpu_mb": 300, "cpus_per_gpu": 2},
         {"MinMemoryNode": "300M", "CPUs/Task": "2"}),
    ],
    ids=["gpu-asked", "gpu-defaults", "shard-asked"],
)  # fmt: skip
def test_a_submission_asks_for_the_host_share_given(
    port: ClusterPort,  # noqa: F811
    script: Path,  # noqa: F811
    gres: Gres,
    asked: dict[str, int],
    expected: dict[str, str | None],
) -> None:
    key = f"hs-{gres.kind}-{len(asked)}"
    jid = port.submit_held(request=_request(script, key, gres, **asked))
    # 22.05 spells a TRES gres:gpu, 24.11 and later gres/gpu: compared in 22.05's spelling
    shown = {k: v.replace("gres/", "gres:") for k, v in _show(jid).items()}
    assert {k: shown.get(k) for k in expected} == expected, shown
