"""End-to-end tests use the integration suite's real local cluster and job folders."""

from tests.integration.conftest import (  # noqa: F401 (fixtures)
    _cluster_for_slurm_tests,
    job_dir,
    slurm_cluster,
)
