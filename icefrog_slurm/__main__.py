"""``python -m icefrog_slurm`` is the ``icefrog`` command."""

from icefrog_slurm.cli import main

raise SystemExit(main())
