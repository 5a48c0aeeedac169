"""``icefrog tune FILE.json``: the Layer Tuner as a what-if tool (eq 15).

Reads one JSON document (``-`` for stdin) describing a job's layers, its measured
throughput and its per-layer gradient variances, and prints the configuration the Layer
Tuner picks for the given GPU count and sharing state:
``{"batch", "frozen", "psi", "throughput", "effective_progress"}``. The schema is in
docs/reference.md ("icefrog tune"). Bad input exits with code 2 naming the field.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any

from icefrog_slurm.core.fit import fit_ddp_model
from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.core.penalty import PenaltyTable
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.sharing import sharing_lambda
from icefrog_slurm.core.tuner import TunerChoice, legal_frozen, measured_or_predicted, tune
from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.jsonio import (
    JsonObject,
    expect_object,
    get_bool,
    get_int,
    get_list,
    get_number,
    int_list,
    number_list,
    reject_unknown,
)
from icefrog_slurm.limits import MAX_JOB_GPUS
from icefrog_slurm.protocol import INT32_MAX, MAX_LAYERS
from icefrog_slurm.userfiles import load_json_file

FIELDS = (
    "layers",
    "max_frozen",
    "frozen_candidates",
    "frozen_now",
    "gpus",
    "shared",
    "batch_sizes",
    "throughput",
    "grad_var",
    "layer_flops",
    "layer_param_bytes",
)
ENTRY_FIELDS = ("gpus", "batch", "frozen", "samples_per_s")
MAX_CHOICES = 1024
"""Most batch sizes, and most measured entries, a document may list."""
MAX_RATE = 1e12
"""Highest measured samples a second (a model fitted to more loses its precision)."""


@dataclass(frozen=True)
class TuneRequest:
    """A parsed and validated ``icefrog tune`` document."""

    table: LayerTable
    penalty: PenaltyTable
    candidates: tuple[int, ...]
    frozen_now: int
    gpus: int
    shared: bool
    batch_sizes: tuple[int, ...]
    measured: dict[tuple[int, int, int], float]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE.json", help="the job description (- for stdin)")


def run(args: argparse.Namespace) -> int:
    request = parse_request(load_json_file(args.file))
    print(json.dumps(asdict(choose(request))))
    return 0


def choose(request: TuneRequest) -> TunerChoice:
    """Fit the throughput model to the measured entries and run the Layer Tuner (eq 15)."""
    samples = [
        ProfileSample(
            gpus=gpus,
            batch=batch,
            frozen=frozen,
            shared=False,
            t_fwd_s=0.0,
            t_bwd_s=0.0,
            t_sync_s=0.0,
            t_iter_s=0.0,
            samples_per_s=rate,
        )
        for (gpus, batch, frozen), rate in request.measured.items()
    ]
    model = fit_ddp_model(samples, request.table)
    lam = sharing_lambda(shared=request.shared, is_admissible=True)
    choice = tune(
        batch_sizes=request.batch_sizes,
        frozen_candidates=request.candidates,
        psi=request.penalty.psi,
        throughput=measured_or_predicted(
            gpus=request.gpus, measured=request.measured, model=model, layers=request.table
        ),
        lam=lam,
        current_frozen=request.frozen_now,
    )
    if choice is None:  # cannot happen with lambda > 0 and positive rates; kept explicit
        raise IcefrogError("no candidate configuration makes progress")
    return choice


def parse_request(data: Any) -> TuneRequest:
    """Validate the whole document; every error names its field (exit code 2)."""
    doc = expect_object(data, "input")
    reject_unknown(doc, FIELDS, "")
    num_layers = get_int(doc, "layers", minimum=1, maximum=MAX_LAYERS)
    table = _layer_table(doc, num_layers)
    max_frozen = get_int(
        doc, "max_frozen", default=table.max_frozen_from_fraction(0.9), minimum=0,
        maximum=num_layers,
    )  # fmt: skip
    candidates = _candidates(doc, table, max_frozen)
    gpus = get_int(doc, "gpus", minimum=1, maximum=MAX_JOB_GPUS)
    shared = get_bool(doc, "shared", default=False)
    if shared and gpus != 1:
        raise InputError(f"shared: only a 1-GPU job may share a GPU (gpus is {gpus})")
    grad_var = number_list(get_list(doc, "grad_var"), "grad_var", minimum=0.0)
    if len(grad_var) != num_layers:
        raise InputError(f"grad_var: has {len(grad_var)} values for {num_layers} layers")
    return TuneRequest(
        table=table,
        penalty=PenaltyTable(tuple(grad_var)),
        candidates=candidates,
        frozen_now=get_int(doc, "frozen_now", default=0, minimum=0, maximum=num_layers),
        gpus=gpus,
        shared=shared,
        batch_sizes=_batch_sizes(doc),
        measured=_measured(doc, num_layers),
    )


def _layer_table(doc: JsonObject, num_layers: int) -> LayerTable:
    columns: dict[str, tuple[float, ...]] = {}
    for key in ("layer_flops", "layer_param_bytes"):
        if key in doc:
            values = number_list(get_list(doc, key), key, minimum=0.0)
            if len(values) != num_layers:
                raise InputError(f"{key}: has {len(values)} values for {num_layers} layers")
            columns[key] = tuple(values)
    uniform = (1.0,) * num_layers
    return LayerTable(
        flops=columns.get("layer_flops", uniform),
        param_bytes=columns.get("layer_param_bytes", uniform),
    )


def _candidates(doc: JsonObject, table: LayerTable, max_frozen: int) -> tuple[int, ...]:
    if "frozen_candidates" not in doc:
        return legal_frozen(table, max_frozen)
    raw = get_list(doc, "frozen_candidates")
    if not raw:
        raise InputError("frozen_candidates: must not be empty (leave it out for all)")
    wanted = int_list(raw, "frozen_candidates", minimum=0, maximum=max_frozen)
    return legal_frozen(table, max_frozen, wanted)


def _batch_sizes(doc: JsonObject) -> tuple[int, ...]:
    raw = get_list(doc, "batch_sizes")
    if not raw:
        raise InputError("batch_sizes: must not be empty")
    if len(raw) > MAX_CHOICES:
        raise InputError(f"batch_sizes: at most {MAX_CHOICES} sizes, has {len(raw)}")
    return tuple(sorted(set(int_list(raw, "batch_sizes", minimum=1, maximum=INT32_MAX))))


def _measured(doc: JsonObject, num_layers: int) -> dict[tuple[int, int, int], float]:
    raw = get_list(doc, "throughput")
    if not raw:
        raise InputError("throughput: needs at least one measured entry")
    if len(raw) > MAX_CHOICES:
        raise InputError(f"throughput: at most {MAX_CHOICES} entries, has {len(raw)}")
    out: dict[tuple[int, int, int], float] = {}
    for i, item in enumerate(raw):
        where = f"throughput[{i}]"
        entry = expect_object(item, where)
        reject_unknown(entry, ENTRY_FIELDS, where)
        key = (
            get_int(entry, "gpus", where, minimum=1, maximum=MAX_JOB_GPUS),
            get_int(entry, "batch", where, minimum=1, maximum=INT32_MAX),
            get_int(entry, "frozen", where, minimum=0, maximum=num_layers),
        )
        if key in out:
            raise InputError(f"{where}: a second entry for gpus/batch/frozen {key}")
        out[key] = get_number(
            entry, "samples_per_s", where, exclusive_minimum=0.0, maximum=MAX_RATE
        )
    return out
