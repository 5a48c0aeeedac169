"""The job side of icefrog: ``icefrog launch`` (torchrun inside a Slurm allocation) and the
PyTorch Model Trainer. The only code of the project that imports torch; from icefrog_slurm
it imports only the protocol types and core.layers.

``from launcher import Trainer`` loads torch; ``launcher.launch`` and ``launcher.config``
do not, so ``icefrog launch`` starts without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.trainer import Trainer

__all__ = ["Trainer"]


def __getattr__(name: str) -> type[Trainer]:
    if name == "Trainer":
        from launcher.trainer import Trainer

        return Trainer
    raise AttributeError(name)
