"""``icefrog controller --check`` on the real cluster: the Slurm check is the backend's own
capacity call, and a host made ready by ``icefrog db upgrade`` and a first start passes
every check (real munged, real sinfo/squeue)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.commands import preflight
from icefrog_slurm.settings import load_settings, settings_from_mapping

pytestmark = pytest.mark.slurm


def test_the_slurm_check_reads_the_partition(sharing: str) -> None:
    settings = settings_from_mapping({"slurm": {"partition": "gpu"}, "sharing": {"gres": sharing}})
    line = preflight.check_slurm(settings)
    per_gpu = {"shard": 2, "mps": 100}[sharing]
    assert re.fullmatch(
        r"partition gpu: \d+ GPUs on \d+ nodes, \d+ free of foreign jobs; "
        rf"GPUs shared by {sharing}, {per_gpu} a GPU",
        line,
    )
    with pytest.raises(preflight.Failed, match="partition nosuch"):
        preflight.check_slurm(settings_from_mapping({"slurm": {"partition": "nosuch"}}))


def test_the_slurm_check_refuses_a_sharing_kind_the_nodes_do_not_offer(sharing: str) -> None:
    other = {"shard": "mps", "mps": "shard"}[sharing]
    wrong = settings_from_mapping({"sharing": {"gres": other}})
    with pytest.raises(preflight.Failed) as err:
        preflight.check_slurm(wrong)
    why = str(err.value)
    assert f'sharing.gres = "{other}" but node node1 of partition gpu offers gres/{sharing}' in why
    assert f'set sharing.gres = "{sharing}"' in why
    field = {"shard": "shards_per_gpu", "mps": "mps_per_gpu"}[sharing]
    miscounted = settings_from_mapping({"sharing": {"gres": sharing}, "slurm": {field: 3}})
    with pytest.raises(preflight.Failed, match=rf"slurm.{field} = 3 but node node1 has {sharing}:"):
        preflight.check_slurm(miscounted)
    off = settings_from_mapping({"sharing": {"gres": other, "max_jobs_per_gpu": 1}})
    assert preflight.check_slurm(off).endswith("sharing off (sharing.max_jobs_per_gpu = 1)")


def test_a_ready_host_passes_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "icefrog.toml"
    config.write_text(f'[state]\ndir = "{tmp_path}/state"\n')
    assert main(["db", "upgrade", "--config", str(config)]) == 0
    preflight.first_start(load_settings(config), config=str(config))
    capsys.readouterr()
    code = main(["controller", "--check", "--config", str(config)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert len(out.splitlines()) == 9 and "FAIL" not in out, out
    assert re.search(r"^slurm +ok: partition gpu: \d+ GPUs", out, re.MULTILINE), out
