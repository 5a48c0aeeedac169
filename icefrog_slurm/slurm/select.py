"""Which ClusterPort adapter the controller uses: ``slurm.backend`` -> an adapter."""

from __future__ import annotations

from icefrog_slurm.slurm.cli_backend import SlurmCliBackend
from icefrog_slurm.slurm.identity import TagSigner
from icefrog_slurm.slurm.port import ClusterPort


def make_cluster(backend: str = "cli", *, signer: TagSigner | None = None) -> ClusterPort:
    """``cli`` -> ``SlurmCliBackend``; ``pyslurm`` -> ``SlurmPyslurmBackend`` (imports pyslurm
    now, raising ``PyslurmMissing`` with the reason when it is absent). ``signer`` signs the
    tags of resubmitted jobs (the daemon's persists in its state folder)."""
    if backend == "cli":
        return SlurmCliBackend(signer=signer)
    if backend == "pyslurm":
        from icefrog_slurm.slurm.pyslurm_backend import SlurmPyslurmBackend

        return SlurmPyslurmBackend(signer=signer)
    raise ValueError(f"unknown slurm backend {backend!r} (cli or pyslurm)")
