"""The names of the files a job and the controller share in the job's folder (its run dir).

Both sides import them from here (the job side may import this module; the controller is
:class:`~icefrog_slurm.controller.ports.FsJobFiles`):

- :data:`DECISION_FILE`: written by the controller, read by the trainer at each epoch end;
- :data:`CHECKPOINT_MARKER`: written by the trainer (rank 0) right after the checkpoint it
  makes before exiting to be requeued (asked by USR1/TERM, or by a decision for another GPU
  count); the launcher removes it when it starts, and reads it to exit 75 ("requeue me").
  The controller, having asked a running job to checkpoint, requeues it as soon as this
  file is newer than its request, rather than waiting for the job to exit (ranks other than
  0 may hang in a collective until it times out).
"""

from __future__ import annotations

DECISION_FILE = "decision.json"
CHECKPOINT_MARKER = "checkpointed"
