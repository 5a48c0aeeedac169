"""The random number generators a training loop draws from, as one process's checkpoint
entry: torch's CPU generator, the CUDA generator of the process's device, Python's
``random`` and numpy's global one (``np.random.seed``/``rand``...). Each state is kept as
tensors, numbers and strings, so the checkpoint loads with ``weights_only=True``.
Generators of the script's own (a ``torch.Generator``, ``np.random.default_rng``) are not
seen here: register them (``register_state``) or seed them from the data position.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture(device: torch.device) -> dict[str, Any]:
    """This process's generator states now."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    legacy = np.random.get_state(legacy=True)
    if isinstance(legacy, tuple):  # np.random.seed keeps it an MT19937, always a tuple
        kind, keys, pos, has_gauss, gauss = legacy
        state["numpy"] = [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore(state: dict[str, Any], device: torch.device) -> None:
    """Set the generators :func:`capture` saw (those the state holds)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
