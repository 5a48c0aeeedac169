"""The job side of icefrog: ``icefrog launch`` (torchrun inside a Slurm allocation) and the
PyTorch Model Trainer. The only code of the project that imports torch; from icefrog_slurm
it imports only the protocol types and core.layers.

``from icefrog_launcher import Trainer`` loads torch; ``icefrog_launcher.launch`` and
``icefrog_launcher.config`` do not, so ``icefrog launch`` starts without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from icefrog_launcher.trainer import Trainer

__all__ = ["Trainer"]


def __getattr__(name: str) -> type[Trainer]:
    if name == "Trainer":
        from icefrog_launcher.trainer import Trainer

        return Trainer
    raise AttributeError(name)
