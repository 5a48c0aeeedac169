"""The cluster port and its adapters.

- ``port``: ``ClusterPort`` (what the controller may ask of Slurm), its frozen dataclasses and
  the typed errors (``SlurmUnavailable`` retryable, ``SlurmRejected`` not).
- ``commands`` / ``parse``: pure command-line builders and output parsers (22.05 and 24.11),
  pinned by tests/golden/.
- ``capacity``: the partition's GPUs minus those of foreign jobs (pure).
- ``cli_backend``: ``SlurmCliBackend``, the port over sbatch/scontrol/squeue/sinfo/scancel.
- ``pyslurm_backend``: ``SlurmPyslurmBackend``, the port over pyslurm 25.11 (optional).
- ``select``: ``make_cluster(settings.slurm.backend)``, the adapter the controller uses.
"""
