"""``python -m icefrog_launcher.relay torchrun ARGS...``: the task ``srun`` runs on each node of a
multi-node job, for the launcher's stop request (USR1, which srun forwards to the step).

slurmstepd delivers that USR1 to every process of the step. torchrun's agent dies on
USR1 (no handler), and when a task's top process dies srun (``--kill-on-bad-exit``)
kills the step, possibly while rank 0 is writing its checkpoint. So the relay starts
torchrun with USR1 ignored (the trainers install their own USR1/TERM handler and
checkpoint), and turns the USR1 it gets itself into TERM for torchrun, which passes it
to the trainers (enough where Slurm signals only the task's top process). TERM (Slurm
stopping the step) is passed on too. Exit status: torchrun's (128 + N when signal N
killed it).
"""

from __future__ import annotations

import signal
import sys

from icefrog_launcher.launch import environ, supervise


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m icefrog_launcher.relay COMMAND [ARGS...]", file=sys.stderr)
        return 2
    code, _ = supervise(argv, environ(), signal.SIGTERM, child_ignores=(signal.SIGUSR1,))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
