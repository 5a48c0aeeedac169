"""The domain: the nouns every stage of the scheduler passes on, as plain immutable values.

- ``cluster``: GRES, the icefrog tag, a Slurm job as a poll observes it, partition capacity;
- ``records``: a job and its progress, a round's allocations, reconcile intents, the Slurm
  audit log's actions, and the store snapshot a tick reads;
- ``snapshot``: the immutable input of a controller tick;
- ``plan``: the policy interface, its result, and the plan a tick emits.

Pure: it imports the standard library, icefrog_slurm.core, the wire types of
icefrog_slurm.protocol, the settings and the errors, nothing else (import-linter contracts
in pyproject.toml). The store, the Slurm adapters, the controller, the policies, the
reports and the simulator all import it; it imports none of them.
"""
