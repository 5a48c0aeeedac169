"""Which ClusterPort adapter the controller uses: ``slurm.backend`` -> an adapter."""

from __future__ import annotations

from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.port import ClusterPort


def make_cluster(backend: str = "cli") -> ClusterPort:
    """``cli`` -> ``SlurmCliBackend``; ``pyslurm`` -> ``SlurmPyslurmBackend`` (imports pyslurm
    now, raising ``PyslurmMissing`` with the reason when it is absent)."""
    if backend == "cli":
        return SlurmCliBackend()
    if backend == "pyslurm":
        from icefrog_slurm.slurm.pyslurm_backend import SlurmPyslurmBackend

        return SlurmPyslurmBackend()
    raise ValueError(f"unknown slurm backend {backend!r} (cli or pyslurm)")
