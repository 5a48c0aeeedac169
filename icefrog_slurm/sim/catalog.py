"""The simulator's task catalog: what each simulated job trains and how it may be configured.

Owns the reading of ``icefrog_slurm/sim/data/tasks.json`` (ranges, targets, epochs, size
class, where calibration comes from) and of the per-layer tables it names:

- ``layers: NAME`` — ``icefrog_slurm/sim/data/layers/NAME.json``, generated from a real
  architecture definition by ``tools/gen_task_catalog.py`` (torch on the meta
  device, ``torch.utils.flop_counter``) and committed, so the simulator needs no torch;
- ``layers: core:NAME`` — a table shipped by ``icefrog_slurm.core.transformer_tables``
  (the LLaMA-3B/7B tables, computed analytically by the parallel-models work).
  Where that module cannot be imported, the LLaMA tasks
  report themselves unavailable (:meth:`Catalog.available`) and everything else works.

Pollux's application names (cifar10, imagenet, yolov3, bert, deepspeech2, ncf) are aliases
of catalog tasks, so Pollux-format workloads resolve to the same tasks.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.parallelism import DDP, Parallelism
from icefrog_slurm.core.tuner import powers_of_two
from icefrog_slurm.declaration import Target
from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.jsonio import (
    expect_object,
    get_int,
    get_list,
    get_number,
    get_str,
    int_list,
    reject_unknown,
)
from icefrog_slurm.protocol import JobSpec

DATA_PACKAGE = "icefrog_slurm.sim.data"
SIZE_CLASSES = ("small", "medium", "large", "xlarge")
DEFAULT_MAX_FROZEN_FRACTION = 0.9  # spec section 12: at most 90 % of the layers frozen

_TASK_FIELDS = (
    "name", "model", "dataset", "layers", "gpus", "batch", "default_batch", "target",
    "max_epochs", "samples_per_epoch", "size_class", "calibration", "suite", "parallelism",
    "aliases",
)  # fmt: skip


@dataclass(frozen=True)
class Task:
    """One catalog task. Batch sizes are per GPU; GPU counts are the legal counts of its
    declared ``parallelism`` (multiples of its allocation unit, :attr:`gpu_unit`)."""

    name: str
    model: str
    dataset: str
    layers_ref: str
    min_gpus: int
    max_gpus: int
    min_batch: int
    max_batch: int
    default_batch: int
    target: Target
    max_epochs: int
    samples_per_epoch: int
    size_class: str
    pollux_app: str | None  # calibrated from Pollux's measured traces/<app>/
    scale_from: str | None  # else scaled from this task by FLOPs and parameter bytes
    fine_tune_from: str | None  # else a fine-tuned transformer: the analytic model of
    # calibration.calibrate_fine_tune, with this task's measured sync and convergence
    suite: str  # "icefrog": the paper's tasks (what traces map to); "pollux": Pollux-only apps
    parallelism: Parallelism  # what its simulated job declares (LLaMA: SDP / HP, unit 4)
    aliases: tuple[str, ...] = field(default=())
    v100_step_s: tuple[tuple[int, float], ...] = ()  # measured (per-GPU batch, s) on 1 GPU
    target_epochs: int = 0  # a scaled or fine-tuned task's epochs to its target

    @property
    def source_task(self) -> str | None:
        """The task whose measurements a task without its own is calibrated from."""
        return self.scale_from or self.fine_tune_from

    @property
    def target_samples(self) -> int:
        """A scaled or fine-tuned task's unfrozen samples to its target at its smallest global
        batch: the convergence its calibration scales its source's curve to (``target_epochs``; the
        budget ``max_epochs`` when not given). The budget may be larger: it is what the job
        declares, not what it needs."""
        return (self.target_epochs or self.max_epochs) * self.samples_per_epoch

    def batch_sizes(self) -> tuple[int, ...]:
        """The per-GPU batches the tuner may pick: powers of two in the range."""
        return powers_of_two(self.min_batch, self.max_batch)

    @property
    def gpu_unit(self) -> int:
        """The spacing of legal GPU counts (the unit; lcm(unit, p) for HP)."""
        return self.parallelism.step

    def gpu_counts(self) -> tuple[int, ...]:
        """Legal GPU counts within [min_gpus, max_gpus] for the declared parallelism."""
        return self.parallelism.legal_gpu_counts(self.min_gpus, self.max_gpus)

    @property
    def base_samples(self) -> int:
        """P_0 = max_epochs x samples_per_epoch (spec section 4)."""
        return self.max_epochs * self.samples_per_epoch

    def job_spec(self, layers: LayerTable) -> JobSpec:
        """What a simulated job of this task registers (the ``register`` report)."""
        return JobSpec(
            min_gpus=self.min_gpus, max_gpus=self.max_gpus, min_batch=self.min_batch,
            max_batch=self.max_batch, max_frozen_fraction=DEFAULT_MAX_FROZEN_FRACTION,
            target_metric=self.target.metric, target_op=self.target.op,
            target_value=self.target.value, max_epochs=self.max_epochs,
            samples_per_epoch=self.samples_per_epoch, layer_flops=layers.flops,
            layer_param_bytes=layers.param_bytes, layer_boundaries=layers.boundaries,
            accepts_shared=self.min_gpus == 1 and self.parallelism == DDP,
            parallelism=self.parallelism,
        )  # fmt: skip


class Catalog:
    """The tasks by name, their aliases, and their layer tables (loaded once each)."""

    def __init__(self, tasks: Mapping[str, Task]) -> None:
        self._tasks = dict(tasks)
        self._aliases: dict[str, str] = {}
        for task in self._tasks.values():
            for alias in task.aliases:
                if alias in self._tasks or alias in self._aliases:
                    raise InputError(f"tasks: alias {alias!r} is used twice")
                self._aliases[alias] = task.name
        for task in self._tasks.values():
            source = task.source_task
            if source is not None and source not in self._tasks:
                kind = "scale_from" if task.scale_from else "fine_tune_from"
                raise InputError(f"{task.name}.calibration.{kind}: no task {source!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tasks)

    def resolve(self, name: str) -> str:
        """A task name or a Pollux application alias -> the task name."""
        if name in self._tasks:
            return name
        if name in self._aliases:
            return self._aliases[name]
        known = ", ".join(sorted([*self._tasks, *self._aliases]))
        raise InputError(f"task: unknown task or application {name!r}; known: {known}")

    def get(self, name: str) -> Task:
        return self._tasks[self.resolve(name)]

    def layers(self, name: str) -> LayerTable:
        """The task's per-layer table (IcefrogError when it is not shipped on this branch)."""
        return load_layer_table(self.get(name).layers_ref)

    def available(self, suite: str | None = None) -> tuple[str, ...]:
        """Tasks (of ``suite`` when given) whose layer tables load here (the LLaMA ones need
        core.transformer_tables)."""
        out = []
        for name, task in self._tasks.items():
            if suite is not None and task.suite != suite:
                continue
            try:
                self.layers(name)
            except IcefrogError:
                continue
            out.append(name)
        return tuple(out)


def load_catalog(text: str | None = None) -> Catalog:
    """Parse ``tasks.json`` (the shipped one unless ``text`` is given)."""
    raw = text if text is not None else _data_text("tasks.json")
    try:
        doc = expect_object(json.loads(raw), "tasks.json")
    except json.JSONDecodeError as exc:
        raise InputError(f"tasks.json: not valid JSON: {exc}") from None
    reject_unknown(doc, ("about", "tasks"), "tasks.json")
    tasks: dict[str, Task] = {}
    for i, item in enumerate(get_list(doc, "tasks", "tasks.json")):
        task = _parse_task(expect_object(item, f"tasks[{i}]"), f"tasks[{i}]")
        if task.name in tasks:
            raise InputError(f"tasks[{i}].name: {task.name!r} appears twice")
        tasks[task.name] = task
    return Catalog(tasks)


@cache
def shipped_catalog() -> Catalog:
    """The catalog shipped with the package (parsed once)."""
    return load_catalog()


def _parse_task(obj: Mapping[str, Any], where: str) -> Task:
    reject_unknown(obj, _TASK_FIELDS, where)
    gpus = int_list(get_list(obj, "gpus", where), f"{where}.gpus", minimum=1)
    batch = int_list(get_list(obj, "batch", where), f"{where}.batch", minimum=1)
    for key, pair in (("gpus", gpus), ("batch", batch)):
        if len(pair) != 2 or pair[0] > pair[1]:
            raise InputError(f"{where}.{key}: must be [min, max] with min <= max")
    target = expect_object(obj.get("target"), f"{where}.target")
    reject_unknown(target, ("metric", "op", "value"), f"{where}.target")
    op = get_str(target, "op", f"{where}.target")
    if op not in (">=", "<="):
        raise InputError(f"{where}.target.op: must be '>=' or '<='")
    size = get_str(obj, "size_class", where)
    if size not in SIZE_CLASSES:
        raise InputError(f"{where}.size_class: must be one of {', '.join(SIZE_CLASSES)}")
    calibration = expect_object(obj.get("calibration"), f"{where}.calibration")
    reject_unknown(
        calibration,
        ("pollux", "scale_from", "fine_tune_from", "v100_step_s", "target_epochs"),
        f"{where}.calibration",
    )
    if sum(k in calibration for k in ("pollux", "scale_from", "fine_tune_from")) != 1:
        raise InputError(
            f"{where}.calibration: needs exactly one of pollux, scale_from, fine_tune_from"
        )
    steps = expect_object(calibration.get("v100_step_s", {}), f"{where}.calibration.v100_step_s")
    task = Task(
        name=get_str(obj, "name", where), model=get_str(obj, "model", where),
        dataset=get_str(obj, "dataset", where), layers_ref=get_str(obj, "layers", where),
        min_gpus=gpus[0], max_gpus=gpus[1],
        min_batch=batch[0], max_batch=batch[1],
        default_batch=get_int(obj, "default_batch", where, minimum=batch[0], maximum=batch[1]),
        target=Target(get_str(target, "metric", f"{where}.target"), op,  # type: ignore[arg-type]
                      get_number(target, "value", f"{where}.target")),
        max_epochs=get_int(obj, "max_epochs", where, minimum=1),
        samples_per_epoch=get_int(obj, "samples_per_epoch", where, minimum=1), size_class=size,
        pollux_app=calibration.get("pollux"), scale_from=calibration.get("scale_from"),
        fine_tune_from=calibration.get("fine_tune_from"),
        suite=get_str(obj, "suite", where),
        parallelism=Parallelism.from_json(obj.get("parallelism"), f"{where}.parallelism"),
        aliases=_strings(get_list(obj, "aliases", where), f"{where}.aliases"),
        v100_step_s=_steps(steps, f"{where}.calibration.v100_step_s"),
        target_epochs=get_int(calibration, "target_epochs", f"{where}.calibration", minimum=1)
        if "target_epochs" in calibration else 0,
    )  # fmt: skip
    if task.target_epochs and task.source_task is None:
        raise InputError(
            f"{where}.calibration.target_epochs: only for a scale_from or fine_tune_from task"
        )
    if task.v100_step_s and task.scale_from is None:
        raise InputError(f"{where}.calibration.v100_step_s: only for a scale_from task")
    if task.suite not in ("icefrog", "pollux"):
        raise InputError(f"{where}.suite: must be icefrog or pollux")
    if task.default_batch not in task.batch_sizes():
        raise InputError(f"{where}.default_batch: {task.default_batch} is not a power of two")
    counts = task.gpu_counts()
    if not counts or counts[0] != task.min_gpus or counts[-1] != task.max_gpus:
        raise InputError(
            f"{where}.gpus: bounds must be legal GPU counts for "
            f"{task.parallelism.describe()} (parallelism)"
        )
    return task


@cache
def load_layer_table(ref: str) -> LayerTable:
    """A layer table by reference: ``NAME`` (this package's data) or ``core:NAME``."""
    if ref.startswith("core:"):
        try:
            module = importlib.import_module("icefrog_slurm.core.transformer_tables")
        except ImportError:
            raise IcefrogError(
                f"layer table {ref}: icefrog_slurm.core.transformer_tables is not on this branch"
            ) from None
        table: LayerTable = module.load_shipped_table(ref.removeprefix("core:"))
        return table
    return layer_table_from_document(json.loads(_data_text(f"layers/{ref}.json")), ref)


def layer_document(ref: str) -> Mapping[str, Any]:
    """The raw JSON document of a generated table (totals and provenance included)."""
    doc: Mapping[str, Any] = json.loads(_data_text(f"layers/{ref}.json"))
    return doc


def layer_table_from_document(doc: Any, where: str) -> LayerTable:
    """Parse a generated table: ``layers: [{name, flops, param_bytes}, ...]`` input first."""
    obj = expect_object(doc, where)
    names, flops, params = [], [], []
    for i, item in enumerate(get_list(obj, "layers", where)):
        layer = expect_object(item, f"{where}.layers[{i}]")
        reject_unknown(layer, ("name", "flops", "param_bytes"), f"{where}.layers[{i}]")
        names.append(get_str(layer, "name", f"{where}.layers[{i}]"))
        flops.append(get_number(layer, "flops", f"{where}.layers[{i}]", minimum=0.0))
        params.append(get_number(layer, "param_bytes", f"{where}.layers[{i}]", minimum=0.0))
    if not names:
        raise InputError(f"{where}.layers: empty")
    return LayerTable(flops=tuple(flops), param_bytes=tuple(params), names=tuple(names))


def _steps(obj: Mapping[str, Any], where: str) -> tuple[tuple[int, float], ...]:
    out = []
    for key in obj:
        if not key.isdigit() or int(key) < 1:
            raise InputError(f"{where}.{key}: keys must be per-GPU batch sizes")
        out.append((int(key), get_number(obj, key, where, exclusive_minimum=0.0)))
    if len(out) == 1:
        raise InputError(f"{where}: needs at least two batch sizes to fix a line")
    return tuple(sorted(out))


def _strings(values: list[Any], where: str) -> tuple[str, ...]:
    for i, value in enumerate(values):
        if not isinstance(value, str) or not value:
            raise InputError(f"{where}[{i}]: must be a non-empty string")
    return tuple(values)


def _data_text(relative: str) -> str:
    path = resources.files(DATA_PACKAGE).joinpath(relative)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{DATA_PACKAGE}/{relative}: no such data file") from None
