"""The controller: ``tick(snapshot) -> plan`` (pure), ``reconcile(plan)`` (idempotent, safe to
kill), and the daemon loop that runs them (spec sections 9 and 12).

- ``ports``: the edges the controller sees (clock, store, its transactions and lease, job
  files); the cluster port is :class:`icefrog_slurm.slurm.port.ClusterPort`. The
  simulator swaps them, nothing else; the controller imports no store or Slurm adapter.
- ``snapshot``: building the immutable input of a tick (store + Slurm + capacity + time).
  The snapshot, the policy interface and the plan themselves are the domain's
  (icefrog_slurm.domain).
- ``tick``: evictions, the policy's round, and the diff into per-job actions (pure).
- ``reconcile``: enacting a plan on Slurm, step by step, each step recorded.
- ``daemon``: ``Controller.run``: leader lock, one transaction a tick, backoff, metrics.
"""
