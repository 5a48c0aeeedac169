"""Checkpoints on the shared filesystem that survive a crash at any instant.

A checkpoint ``n`` is two files in the checkpoint folder:

- ``ckpt-<n>.pt``: the ``torch.save`` bytes of the state (model, optimizer, data position,
  RNG states, freeze state, progress, the registered objects' state_dicts), written
  atomically (temp, fsync, rename, fsync dir);
- ``ckpt-<n>.json``: the manifest (sha256 and size of the ``.pt``), written the same way
  AFTER the ``.pt``. The manifest is the commit marker.

:func:`load_latest` walks the manifests newest first and returns the first checkpoint whose
bytes match its manifest and unpickle; a torn or corrupt one is skipped (with a warning
on stderr), falling back to the previous good one. The newest ``keep`` are kept.

A save that fails (a full disk) leaves nothing behind: no temporary file, and no ``.pt``
without its manifest (it would never be loaded nor pruned). One killed mid-write leaves a
temporary file; the next save removes it.

Checkpoints load with ``weights_only=True`` (tensors, numbers, strings, containers: loading
runs no code). :func:`check_loadable` tells, before a save, whether a state would load so.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from icefrog_slurm.errors import InputError
from icefrog_slurm.security import write_atomic

_PREFIX = "ckpt-"


def save(folder: str | Path, number: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint ``number`` atomically and prune all but the newest ``keep``."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".{_PREFIX}*.tmp"):  # write_atomic's, from a killed save
        stale.unlink(missing_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    path = root / f"{_PREFIX}{number:08d}.pt"
    manifest = {"file": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    try:
        write_atomic(path, data)
        write_atomic(path.with_suffix(".json"), json.dumps(manifest).encode())
    except BaseException:
        path.unlink(missing_ok=True)  # (write_atomic removed its own temp file)
        raise
    for old in _numbers(root)[:-keep] if keep > 0 else []:
        for suffix in (".json", ".pt"):
            (root / f"{_PREFIX}{old:08d}{suffix}").unlink(missing_ok=True)
    return path


def check_loadable(what: str, state: Any) -> None:
    """InputError naming ``what`` unless ``state`` loads back with ``weights_only=True``, as
    :func:`load_latest` loads it. Tensors, numbers, strings, dtypes, devices and sizes in
    dicts, lists and tuples load so (tests/unit/test_trainer_state.py checks each kind
    against this torch); any other value is saved and loaded to let torch judge it, so the
    cost grows with the number of entries, not their bytes."""
    unsure = _unsure(state, [])
    if not unsure:
        return
    buffer = io.BytesIO()
    try:
        torch.save(unsure, buffer)
        buffer.seek(0)
        torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"{what}: its state_dict() would not load with weights_only=True ({first}); "
            "keep it to tensors, numbers, strings, lists, tuples and dicts"
        ) from None


SAFE_TYPES = (
    torch.Tensor,
    torch.nn.Parameter,
    bool,
    int,
    float,
    str,
    bytes,
    type(None),
    torch.dtype,
    torch.device,
    torch.Size,
)
"""Exactly these types (not subclasses) load with ``weights_only=True``."""


def _unsure(state: Any, out: list[Any]) -> list[Any]:
    """The values in ``state`` not known to load with ``weights_only=True``."""
    kind = type(state)
    if kind in (dict, OrderedDict):
        for key, value in state.items():
            _unsure(key, out)
            _unsure(value, out)
    elif kind in (list, tuple):
        for value in state:
            _unsure(value, out)
    elif kind not in SAFE_TYPES:
        out.append(state)
    return out


def _numbers(root: Path) -> list[int]:
    out = []
    for manifest in root.glob(f"{_PREFIX}*.json"):
        stem = manifest.stem[len(_PREFIX) :]
        if stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def latest_number(folder: str | Path) -> int:
    """The highest checkpoint number with a manifest, or -1."""
    root = Path(folder)
    return _numbers(root)[-1] if root.is_dir() and _numbers(root) else -1


def load_latest(folder: str | Path) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint that verifies, as ``(number, state)``; None when there is none."""
    root = Path(folder)
    if not root.is_dir():
        return None
    for number in reversed(_numbers(root)):
        state = _verified(root, number)
        if state is not None:
            return number, state
    return None


def _verified(root: Path, number: int) -> dict[str, Any] | None:
    name = f"{_PREFIX}{number:08d}"
    try:
        manifest = json.loads((root / f"{name}.json").read_text())
        data = (root / f"{name}.pt").read_bytes()
        if len(data) != manifest["size"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise ValueError("size or sha256 differs from the manifest")
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise ValueError("not a checkpoint dictionary")
        return state
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError) as exc:
        print(f"icefrog trainer: skipping checkpoint {name}: {exc}", file=sys.stderr)
        return None
