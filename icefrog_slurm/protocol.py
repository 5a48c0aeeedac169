"""The wire protocol between a training job (launcher/) and the controller.

This module is the only part of icefrog_slurm the job side imports. It is pure: dataclasses,
JSON (de)serialisation and validation with size limits. Nothing here trusts its input.

Two directions:

- **Reports** (job -> controller): JSON documents the job drops into an append-only inbox
  folder on the shared filesystem. Each is an :class:`Envelope`: who claims to send it
  (Slurm job id, icefrog job name), a sequence number, a kind, a payload, and a munge
  credential whose payload is :func:`body_digest` of the rest, so a credential cannot be
  replayed on different content. The controller accepts a report only when the credential
  decodes to the uid Slurm says owns that Slurm job (see the store's inbox).
- **Decisions** (controller -> job): one :class:`Decision` JSON file per job, replaced
  atomically by the controller, read by the trainer at epoch boundaries.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from icefrog_slurm.core.parallelism import DDP, Parallelism
from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.core.tuner import powers_of_two
from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import check_int as _int
from icefrog_slurm.jsonio import check_number as _num
from icefrog_slurm.jsonio import loads as _loads
from icefrog_slurm.jsonio import printable as _printable
from icefrog_slurm.jsonio import reject_unknown as _only

PROTOCOL_VERSION = 1
MAX_REPORT_BYTES = 256 * 1024  # a report larger than this is rejected unread
MAX_LAYERS = 4096
MAX_SAMPLES_PER_REPORT = 1024
INT32_MAX = 2**31 - 1
"""Largest value of a field stored in a 32-bit column (Postgres ``integer``): GPU counts,
batches, epochs, frozen layers. Fields in 64-bit columns are bounded by jsonio.loads."""
MAX_SEQ = 10**18 - 1
"""Largest report sequence number: it must fit the 18 digits of a report's file name."""
MAX_SLURM_JOB_ID = 2**31 - 1
"""Largest job id Slurm's tools accept (squeue refuses 2^31 and above, and one id it refuses
fails the whole call: a folder named so must never reach a batched lookup)."""
_JOB_ID = re.compile(r"[1-9][0-9]{0,9}")


def is_slurm_job_id(text: str) -> bool:
    """``text`` is a Slurm job id as Slurm prints it: ASCII digits, no leading zero (never
    ``str.isdigit``: it is true for '²'), 1 to :data:`MAX_SLURM_JOB_ID`."""
    return _JOB_ID.fullmatch(text) is not None and int(text) <= MAX_SLURM_JOB_ID


REPORT_KINDS: tuple[str, ...] = (
    "register",
    "profile",
    "grad_stats",
    "metric",
    "progress",
    "finished",
)


@dataclass(frozen=True)
class JobSpec:
    """What a user declares when a job starts (kind ``register``)."""

    min_gpus: int
    max_gpus: int
    min_batch: int  # per-GPU batch range; the tuner uses the powers of two inside it
    max_batch: int
    max_frozen_fraction: float  # default 0.9 of the layers (spec section 12)
    target_metric: str  # e.g. "val_acc"
    target_op: Literal[">=", "<="]
    target_value: float
    max_epochs: int
    samples_per_epoch: int
    layer_flops: tuple[float, ...]
    layer_param_bytes: tuple[float, ...]
    layer_boundaries: tuple[int, ...] = ()  # legal frozen counts; () = every layer end
    accepts_shared: bool = True  # may run on a shared GPU (only jobs that accept 1 GPU)
    # DDP, SDP, PP(p) or HP(p) and the allocation unit (core/parallelism.py); default DDP, 1
    parallelism: Parallelism = DDP
    # samples an optimizer step; 0: free (the per-GPU batch range applies). > 0: on a GPUs
    # the per-GPU batch is fixed_per_gpu_batch(...) and gradients accumulate beyond it
    global_batch: int = 0

    def batch_candidates(self, gpus: int) -> tuple[int, ...]:
        """The per-GPU batches this job may train with on ``gpus`` GPUs: the one
        :func:`fixed_per_gpu_batch` gives with a global batch, else the powers of two in
        ``[min_batch, max_batch]``."""
        if self.global_batch > 0:
            return (fixed_per_gpu_batch(self.global_batch, gpus, self.min_batch, self.max_batch),)
        return powers_of_two(self.min_batch, self.max_batch)


MAX_GLOBAL_BATCH = 1 << 30


def fixed_per_gpu_batch(global_batch: int, gpus: int, min_batch: int, max_batch: int) -> int:
    """m = ceil(B / a) clipped to [min_batch, max_batch]: the per-GPU batch of a job that
    keeps a global batch B on a GPUs (spec section 12). Above max_batch the job accumulates
    ceil(B / (a x m)) micro-steps a step; the samples/s are those of (a, m). The one rule
    the simulated jobs, the estimator and the trainer's accumulation all follow."""
    if global_batch < 1 or gpus < 1:
        raise InputError(f"global batch {global_batch} on {gpus} GPUs: both must be >= 1")
    return min(max(-(-global_batch // gpus), min_batch), max_batch)


def accumulation_steps(global_batch: int, gpus: int, batch: int) -> int:
    """Micro-steps an optimizer step takes so it covers ``global_batch`` samples with
    ``batch`` per GPU on ``gpus`` GPUs (1 when one step of gpus x batch covers it)."""
    return max(1, -(-global_batch // (gpus * batch)))


GRAD_REPORTS_PER_EPOCH = 8
"""Gradient statistics a job reports an epoch: at its end and after every further eighth,
the statistics so far labelled with the epoch in progress, which its end's report replaces
(a long epoch would otherwise leave freezing and the batch's efficiency unjudged for hours;
Pollux's statistics are likewise running averages, read at any step)."""


@dataclass(frozen=True)
class GradStats:
    """Per-layer gradient variance and squared norm over one epoch (kind ``grad_stats``), or
    over the part of it trained so far (``GRAD_REPORTS_PER_EPOCH``).

    ``grad_var`` is the variance of a base-batch gradient, tr(Sigma) / B0 with B0 the job's
    smallest GPU count x smallest per-GPU batch (Pollux's convention, what
    ``core.goodput`` reads); ``grad_sqr`` the true gradient's squared norm. For a frozen
    layer the values are those taken when it was frozen (spec eq 3)."""

    epoch: int
    frozen: int
    grad_var: tuple[float, ...]
    grad_sqr: tuple[float, ...]


@dataclass(frozen=True)
class MetricReport:
    epoch: int
    name: str
    value: float


@dataclass(frozen=True)
class ProgressReport:
    """Where the job stands: epochs and samples done, and effective progress (spec section 4:
    a sample trained under penalty psi advances the remaining work by psi samples)."""

    epoch: int
    samples_done: int
    effective_samples_done: float
    checkpoint_path: str = ""


FinishReason = Literal["target_reached", "max_epochs", "max_physical_epochs", "failed"]
"""Why a job ended: its target was reached; its work budget (``--max-epochs``,
full-model-equivalent epochs) was spent; its cap on physical epochs
(``--max-physical-epochs``) was reached; it failed. A store row written before the cap
existed says ``max_epochs`` for a job that ran out of (then physical) epochs."""

FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)


@dataclass(frozen=True)
class FinishedReport:
    reason: FinishReason
    epoch: int
    final_metric: float


@dataclass(frozen=True)
class Envelope:
    """A report as it travels: the claim, the payload, and the munge credential."""

    version: int
    kind: str
    slurm_job_id: str
    job_name: str
    seq: int
    time: float
    payload: Mapping[str, Any]
    credential: str = ""

    def body(self) -> dict[str, Any]:
        """Everything but the credential: what the credential's digest covers."""
        data = asdict(self)
        data.pop("credential")
        data["payload"] = dict(self.payload)
        return data

    def to_json(self) -> str:
        return json.dumps({**self.body(), "credential": self.credential}, sort_keys=True)


SharingKind = Literal["shard", "mps"]
SHARING_KINDS: tuple[SharingKind, ...] = get_args(SharingKind)


@dataclass(frozen=True)
class SharedLoad:
    """A shared job's predicted footprint on its GPU, as the admission rule (spec eq 8:
    memory x safety <= capacity, utilisation sum <= 100 %) used it, and the GRES kind that
    shares the GPU. Under ``mps`` the launcher turns it into the job's CUDA MPS limits
    (icefrog_launcher.launch.mps_env): a thread percentage from ``util`` and a pinned
    memory limit of ``memory_safety x peak_mem_bytes``."""

    kind: SharingKind
    util: float  # predicted GPU utilisation, 0..1
    peak_mem_bytes: float  # predicted peak device memory
    memory_safety: float = 1.1  # the admission rule's factor (settings sharing.memory_safety)

    @property
    def mem_limit_bytes(self) -> float:
        return self.memory_safety * self.peak_mem_bytes


MAX_DEVICE_BYTES = 2.0**50
"""Largest peak memory a decision may name (1 PiB: far beyond any GPU)."""


@dataclass(frozen=True)
class Decision:
    """What the controller wants a job to run with, written to ``decision.json``.
    ``load``: a shared job's predicted footprint (None for an exclusive job, or when the
    round had no prediction for it)."""

    round: int
    gpus: int
    batch: int  # per-GPU
    frozen: int
    shared: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    load: SharedLoad | None = None

    def to_json(self) -> str:
        data = asdict(self) | {"extra": dict(self.extra)}
        if self.load is None:
            data.pop("load")
        return json.dumps(data, sort_keys=True)


def parse_decision(raw: str | bytes) -> Decision:
    """Parse and validate a ``decision.json`` document; InputError names the bad field."""
    if len(raw) > MAX_REPORT_BYTES:
        raise InputError(f"decision: {len(raw)} bytes, more than the limit {MAX_REPORT_BYTES}")
    data = _loads(raw, "decision")
    if not isinstance(data, dict):
        raise InputError("decision: must be a JSON object")
    _only(data, ("round", "gpus", "batch", "frozen", "shared", "extra", "load"), "decision")
    extra = data.get("extra", {})
    if not isinstance(extra, dict):
        raise InputError("decision.extra: must be an object")
    shared = data.get("shared", False)
    if not isinstance(shared, bool):
        raise InputError("decision.shared: must be true or false")
    load = data.get("load")
    return Decision(
        round=_int32(data.get("round"), "decision.round"),
        gpus=_int32(data.get("gpus"), "decision.gpus"),
        batch=_int32(data.get("batch"), "decision.batch", minimum=1),
        frozen=_int32(data.get("frozen"), "decision.frozen"),
        shared=shared,
        extra=extra,
        load=None if load is None else _parse_load(load, "decision.load"),
    )


def _parse_load(value: Any, where: str) -> SharedLoad:
    if not isinstance(value, dict):
        raise InputError(f"{where}: must be an object")
    _only(value, ("kind", "util", "peak_mem_bytes", "memory_safety"), where)
    kind = value.get("kind")
    if kind not in SHARING_KINDS:
        raise InputError(f"{where}.kind: must be one of {', '.join(SHARING_KINDS)}")
    return SharedLoad(
        kind=kind,
        util=_num(value.get("util"), f"{where}.util", minimum=0.0, maximum=1.0),
        peak_mem_bytes=_num(
            value.get("peak_mem_bytes"),
            f"{where}.peak_mem_bytes",
            minimum=0.0,
            maximum=MAX_DEVICE_BYTES,
        ),
        memory_safety=_num(value.get("memory_safety", 1.1), f"{where}.memory_safety", minimum=1.0),
    )


def body_digest(body: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a report body; the munge credential's payload."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_envelope(raw: bytes | str) -> Envelope:
    """Parse and validate an inbox document: size, fields and the payload of its kind."""
    if len(raw) > MAX_REPORT_BYTES:
        raise InputError(f"report: {len(raw)} bytes, more than the limit {MAX_REPORT_BYTES}")
    data = _loads(raw, "report")
    if not isinstance(data, dict):
        raise InputError("report: must be a JSON object")
    _only(
        data,
        ("version", "kind", "slurm_job_id", "job_name", "seq", "time", "payload", "credential"),
        "report",
    )
    if data.get("version") != PROTOCOL_VERSION:
        raise InputError(f"report.version: must be {PROTOCOL_VERSION}")
    kind = data.get("kind")
    if kind not in REPORT_KINDS:
        raise InputError(f"report.kind: must be one of {', '.join(REPORT_KINDS)}")
    payload = data.get("payload")
    if not isinstance(payload, dict):
        raise InputError("report.payload: must be an object")
    env = Envelope(
        version=PROTOCOL_VERSION,
        kind=kind,
        slurm_job_id=_job_id(data.get("slurm_job_id")),
        job_name=_short_str(data.get("job_name"), "report.job_name"),
        seq=_int(data.get("seq"), "report.seq", minimum=0, maximum=MAX_SEQ),
        time=_num(data.get("time"), "report.time", minimum=0.0),
        payload=payload,
        credential=_short_str(
            data.get("credential", ""), "report.credential", 4096, allow_empty=True
        ),
    )
    parse_payload(kind, payload)  # validates; raises InputError naming the field
    return env


def parse_payload(kind: str, payload: Mapping[str, Any]) -> Any:
    """Turn a validated payload into its dataclass."""
    where = f"report.payload({kind})"
    if kind == "register":
        return _parse_spec(payload, where)
    if kind == "profile":
        samples = payload.get("samples")
        if not isinstance(samples, list) or not 0 < len(samples) <= MAX_SAMPLES_PER_REPORT:
            raise InputError(f"{where}.samples: a list of 1..{MAX_SAMPLES_PER_REPORT} samples")
        return [_parse_sample(s, f"{where}.samples[{i}]") for i, s in enumerate(samples)]
    if kind == "grad_stats":
        _only(payload, ("epoch", "frozen", "grad_var", "grad_sqr"), where)
        var = _floats(payload.get("grad_var"), f"{where}.grad_var")
        sqr = _floats(payload.get("grad_sqr"), f"{where}.grad_sqr")
        if len(var) != len(sqr):
            raise InputError(f"{where}.grad_sqr: length differs from grad_var")
        return GradStats(
            epoch=_int32(payload.get("epoch"), f"{where}.epoch"),
            frozen=_int(payload.get("frozen"), f"{where}.frozen", minimum=0, maximum=len(var)),
            grad_var=var,
            grad_sqr=sqr,
        )
    if kind == "metric":
        _only(payload, ("epoch", "name", "value"), where)
        return MetricReport(
            epoch=_int32(payload.get("epoch"), f"{where}.epoch"),
            name=_short_str(payload.get("name"), f"{where}.name"),
            value=_num(payload.get("value"), f"{where}.value"),
        )
    if kind == "progress":
        _only(
            payload, ("epoch", "samples_done", "effective_samples_done", "checkpoint_path"), where
        )
        return ProgressReport(
            epoch=_int32(payload.get("epoch"), f"{where}.epoch"),
            samples_done=_int(payload.get("samples_done"), f"{where}.samples_done", minimum=0),
            effective_samples_done=_num(
                payload.get("effective_samples_done"),
                f"{where}.effective_samples_done",
                minimum=0.0,
            ),
            checkpoint_path=_short_str(
                payload.get("checkpoint_path", ""),
                f"{where}.checkpoint_path",
                4096,
                allow_empty=True,
            ),
        )
    _only(payload, ("reason", "epoch", "final_metric"), where)
    reason = payload.get("reason")
    if reason not in FINISH_REASONS:
        raise InputError(f"{where}.reason: must be one of {', '.join(FINISH_REASONS)}")
    return FinishedReport(
        reason=reason,
        epoch=_int32(payload.get("epoch"), f"{where}.epoch"),
        final_metric=_num(payload.get("final_metric"), f"{where}.final_metric"),
    )


def _parse_spec(p: Mapping[str, Any], where: str) -> JobSpec:
    names = [f.name for f in JobSpec.__dataclass_fields__.values()]
    _only(p, names, where)
    op = p.get("target_op")
    if op not in (">=", "<="):
        raise InputError(f"{where}.target_op: must be '>=' or '<='")
    spec = JobSpec(
        min_gpus=_int(p.get("min_gpus"), f"{where}.min_gpus", minimum=1, maximum=4096),
        max_gpus=_int(p.get("max_gpus"), f"{where}.max_gpus", minimum=1, maximum=4096),
        min_batch=_int32(p.get("min_batch"), f"{where}.min_batch", minimum=1),
        max_batch=_int32(p.get("max_batch"), f"{where}.max_batch", minimum=1),
        max_frozen_fraction=_num(
            p.get("max_frozen_fraction"), f"{where}.max_frozen_fraction", minimum=0.0, maximum=1.0
        ),
        target_metric=_short_str(p.get("target_metric"), f"{where}.target_metric"),
        target_op=op,
        target_value=_num(p.get("target_value"), f"{where}.target_value"),
        max_epochs=_int32(p.get("max_epochs"), f"{where}.max_epochs", minimum=1),
        samples_per_epoch=_int(p.get("samples_per_epoch"), f"{where}.samples_per_epoch", minimum=1),
        layer_flops=_floats(p.get("layer_flops"), f"{where}.layer_flops"),
        layer_param_bytes=_floats(p.get("layer_param_bytes"), f"{where}.layer_param_bytes"),
        layer_boundaries=tuple(
            _int(b, f"{where}.layer_boundaries[{i}]", minimum=0, maximum=MAX_LAYERS)
            for i, b in enumerate(_list(p.get("layer_boundaries", []), f"{where}.layer_boundaries"))
        ),
        accepts_shared=bool(p.get("accepts_shared", True)),
        parallelism=Parallelism.from_json(
            p.get("parallelism", {"kind": "ddp"}), f"{where}.parallelism"
        ),
        global_batch=_int(
            p.get("global_batch", 0), f"{where}.global_batch", minimum=0, maximum=MAX_GLOBAL_BATCH
        ),
    )
    if spec.max_gpus < spec.min_gpus:
        raise InputError(f"{where}.max_gpus: smaller than min_gpus")
    if spec.max_batch < spec.min_batch:
        raise InputError(f"{where}.max_batch: smaller than min_batch")
    if len(spec.layer_flops) != len(spec.layer_param_bytes):
        raise InputError(f"{where}.layer_param_bytes: length differs from layer_flops")
    if not spec.parallelism.legal_gpu_counts(spec.min_gpus, spec.max_gpus):
        raise InputError(
            f"{where}.parallelism: no GPU count in [{spec.min_gpus}, {spec.max_gpus}] is legal "
            f"for {spec.parallelism.describe()}"
        )
    return spec


def _parse_sample(s: Any, where: str) -> ProfileSample:
    if not isinstance(s, dict):
        raise InputError(f"{where}: must be an object")
    names = [f.name for f in ProfileSample.__dataclass_fields__.values()]
    _only(s, names, where)
    return ProfileSample(
        gpus=_int32(s.get("gpus"), f"{where}.gpus", minimum=1),
        batch=_int32(s.get("batch"), f"{where}.batch", minimum=1),
        frozen=_int32(s.get("frozen"), f"{where}.frozen"),
        shared=bool(s.get("shared", False)),
        t_fwd_s=_num(s.get("t_fwd_s"), f"{where}.t_fwd_s", minimum=0.0),
        t_bwd_s=_num(s.get("t_bwd_s"), f"{where}.t_bwd_s", minimum=0.0),
        t_sync_s=_num(s.get("t_sync_s"), f"{where}.t_sync_s", minimum=0.0),
        t_iter_s=_num(s.get("t_iter_s"), f"{where}.t_iter_s", minimum=0.0),
        samples_per_s=_num(s.get("samples_per_s"), f"{where}.samples_per_s", minimum=0.0),
        peak_mem_bytes=_num(s.get("peak_mem_bytes", 0.0), f"{where}.peak_mem_bytes", minimum=0.0),
        gpu_util=_num(s.get("gpu_util", -1.0), f"{where}.gpu_util", minimum=-1.0, maximum=1.0),
    )


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(f"{where}: must be a list")
    if len(value) > MAX_LAYERS:
        raise InputError(f"{where}: more than {MAX_LAYERS} entries")
    return value


def _floats(value: Any, where: str) -> tuple[float, ...]:
    return tuple(_num(v, f"{where}[{i}]") for i, v in enumerate(_list(value, where)))


def _short_str(value: Any, where: str, limit: int = 256, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise InputError(f"{where}: must be a non-empty string")
    if len(value) > limit:
        raise InputError(f"{where}: longer than {limit} characters")
    if not value.isprintable():  # it is shown in logs and tables: no control characters
        raise InputError(f"{where}: holds a control character: {_printable(value, 60)!r}")
    return value


def _int32(value: Any, where: str, *, minimum: int = 0) -> int:
    """An integer for a 32-bit column: within [minimum, INT32_MAX]."""
    return _int(value, where, minimum=minimum, maximum=INT32_MAX)


def _job_id(value: Any) -> str:
    text = _short_str(value, "report.slurm_job_id", 32)
    if not is_slurm_job_id(text):
        raise InputError(
            f"report.slurm_job_id: must be a Slurm job id (ASCII digits, 1 to "
            f"{MAX_SLURM_JOB_ID}), got {_printable(text, 40)!r}"
        )
    return text
