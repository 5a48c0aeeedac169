"""The controller's settings: nested typed frozen dataclasses loaded from one TOML file.

Every field has a default and a docstring; ``slurm_conf/icefrog.toml.example`` sets every
field to its default with the docstring beside it. Loading is strict: an unknown section or
key is an error that names it and lists the valid ones, a value of the wrong type is an
error that names the key (``InputError``, exit code 2). Nothing here reads the environment.

Three fields are derived when left out: ``store.url`` is a SQLite file in ``state.dir``, and
``inbox.dir`` / ``inbox.archive_dir`` are ``inbox`` / ``archive`` folders in ``state.dir``.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from icefrog_slurm import jsonio
from icefrog_slurm.errors import InputError
from icefrog_slurm.userfiles import read_text

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
SlurmBackendName = Literal["cli", "pyslurm"]
Freezing = Literal["penalty", "freezeout"]
SharingGres = Literal["shard", "mps"]
GpuModelName = Literal["v100", "a100", "a800", "h100", "h800"]


MOVE_MIN_GAIN = 0.1


def _bounds(**kw: float) -> dict[str, float]:
    """Field metadata: ``minimum``, ``maximum`` or ``exclusive_minimum`` for a number."""
    return kw


MIN_PERIOD_S = 1.0
"""The shortest period (a round, munged's retry): a shorter one turns the loop hot."""
MIN_POLL_S = 0.05
"""The shortest poll (the inbox's, reconcile's): at most 20 wake-ups a second."""
_ABSOLUTE = {"absolute": True}
"""Field metadata of a path: absolute (the daemon runs in ``/`` under systemd, a command
wherever it is started: a relative path would name another folder in each)."""


@dataclass(frozen=True)
class ControllerSettings:
    """The scheduling round."""

    round_period_s: float = field(default=300.0, metadata=_bounds(minimum=MIN_PERIOD_S))
    """Seconds between two scheduling rounds (spec section 9, step 5: 300 s)."""

    reallocation_overhead_s: float = field(default=60.0, metadata=_bounds(minimum=0.0))
    """Seconds a job loses when its resources change (checkpoint, requeue, restore); the
    policy charges it to a candidate that differs from the current allocation (spec
    section 13 calibrates it to 60 s)."""

    checkpoint_timeout_s: float = field(default=120.0, metadata=_bounds(minimum=0.0))
    """Seconds to wait, after asking a running job to checkpoint (USR1), for its checkpoint
    marker or its exit before it is requeued anyway (losing work since its last checkpoint)."""

    launch_retry_s: float = field(default=130.0, metadata=_bounds(minimum=0.0))
    """After slurmd refused to launch a restarted job ("Job credential revoked": a job
    requeued and released at once on the same node; the credential stays revoked ~120 s),
    wait this long after the refused release before releasing the job again."""

    release_gap_s: float = field(default=2.0, metadata=_bounds(minimum=0.0))
    """After requeueing a job, wait this long before releasing it again. slurmd refuses a
    launch credential created in the same second as the requeue revoked the job's last
    one (Slurm's cred check: ctime <= revoked, in whole seconds): "Job credential revoked",
    and the job ends FAILED. Two seconds put the new allocation in a later second."""

    reconcile_poll_s: float = field(default=2.0, metadata=_bounds(minimum=MIN_POLL_S))
    """While a reconcile step waits (a job checkpointing), the loop looks again this often
    instead of sleeping until the next round."""


@dataclass(frozen=True)
class StateSettings:
    """Where the controller keeps its files."""

    dir: str = field(default="/var/lib/icefrog", metadata=_ABSOLUTE)
    """The controller's state folder (an absolute path): the default SQLite database, the
    report inbox and its archive live here unless set elsewhere."""


@dataclass(frozen=True)
class StoreSettings:
    """The state store's database."""

    url: str = ""
    """SQLAlchemy database URL, e.g. ``postgresql+psycopg://icefrog@dbhost/icefrog``.
    Default: the SQLite file ``icefrog.db`` in ``state.dir``."""


@dataclass(frozen=True)
class InboxSettings:
    """The append-only folder where jobs drop their reports (see docs/admin-guide.md)."""

    dir: str = field(default="", metadata=_ABSOLUTE)
    """The inbox folder (mode 1733, owned by root). Default: ``inbox`` in ``state.dir``."""

    archive_dir: str = field(default="", metadata=_ABSOLUTE)
    """Processed reports are moved here (``accepted/`` and ``rejected/``); it must be on the
    same filesystem as the inbox and readable by root only. Default: ``archive`` in
    ``state.dir``."""

    poll_s: float = field(default=30.0, metadata=_bounds(minimum=MIN_POLL_S))
    """Seconds between two reads of the inbox. Keep it well under munge's credential TTL
    (300 s by default) so that reports arrive fresh."""

    max_reports_per_drain: int = field(default=10000, metadata=_bounds(minimum=1))
    """At most this many report files are read in one pass (each costs one ``unmunge``);
    the rest wait for the next pass."""

    max_reports_per_owner: int = field(default=1000, metadata=_bounds(minimum=1))
    """At most this many files of one user (the owner of the folder) are read in one pass,
    taken in turn with other users' files: one user's flood cannot starve the others."""

    munge_socket: str | None = None
    """The socket of the munged that decodes credentials; unset: munge's own default."""

    munge_retry_s: float = field(default=30.0, metadata=_bounds(minimum=MIN_PERIOD_S))
    """When munged cannot be reached, reports stay in the inbox and munged is asked again
    after this many seconds, doubling at each failure up to 20 times this value."""

    folder_grace_s: float = field(default=86400.0, metadata=_bounds(minimum=0.0))
    """An empty job folder is removed once its job has ended (or is unknown to Slurm and to
    icefrog) and the folder was not modified for this many seconds."""

    retention_days: float = field(default=30.0, metadata=_bounds(exclusive_minimum=0.0))
    """Archived report files and the ledger rows of accepted (of ended jobs) and rejected
    reports older than this are deleted, at most once an hour."""


@dataclass(frozen=True)
class SlurmSettings:
    """The Slurm cluster icefrog manages."""

    partition: str = "gpu"
    """The Slurm partition whose GPUs icefrog allocates."""

    gpu_mem_gb: float = field(default=80.0, metadata=_bounds(exclusive_minimum=0.0))
    """Memory of one GPU in GB (A800-80GB: 80); the sharing rule's capacity (spec section 8)."""

    gpu_model: GpuModelName = "a800"
    """The partition's GPU model: its datasheet FLOP/s and link bandwidths give a job's
    throughput prior before its first profile (``core.throughput.GPU_MODELS``)."""

    shards_per_gpu: int = field(default=2, metadata=_bounds(minimum=1))
    """GRES shards a GPU has in gres.conf (``Name=shard Count=`` / GPUs of the node); a
    shared job asks for ``shards_per_gpu / sharing.max_jobs_per_gpu`` shards."""

    mps_per_gpu: int = field(default=100, metadata=_bounds(minimum=1))
    """GRES MPS a GPU has in gres.conf (``Name=mps Count=`` / GPUs of the node; 100: one
    per percent); with ``sharing.gres = "mps"`` a shared job asks for its predicted
    utilisation's share of it."""

    backend: SlurmBackendName = "cli"
    """How icefrog talks to Slurm: ``cli`` (sbatch/scontrol/squeue) or ``pyslurm`` (needs
    pyslurm, which builds only against Slurm 25.11; tested against a stand-in only)."""


@dataclass(frozen=True)
class SubmitSettings:
    """What ``icefrog submit`` asks of Slurm besides GPUs, when the user does not say."""

    mem_per_gpu_mb: int | None = field(default=None, metadata=_bounds(minimum=1))
    """Host memory per GPU, megabytes (``sbatch --mem-per-gpu``); a shared job asks for one
    GPU's worth (``--mem``). Unset: the site's ``DefMemPerGPU`` in slurm.conf applies."""

    cpus_per_gpu: int | None = field(default=None, metadata=_bounds(minimum=1))
    """Cores per GPU (``sbatch --cpus-per-gpu``); a shared job asks for one GPU's worth
    (``--cpus-per-task``). Unset: the site's ``DefCpuPerGPU`` in slurm.conf applies."""


@dataclass(frozen=True)
class SharingSettings:
    """GPU sharing (spec section 8, eq 8)."""

    memory_safety: float = field(default=1.1, metadata=_bounds(minimum=1.0))
    """Predicted peak memory is multiplied by this before the capacity check (1.1)."""

    speed_factor: float = field(default=0.9, metadata=_bounds(exclusive_minimum=0.0, maximum=1.0))
    """λ of eq 8: the throughput factor of a job on a safely shared GPU (0.9)."""

    max_jobs_per_gpu: int = field(default=2, metadata=_bounds(minimum=1, maximum=2))
    """At most this many jobs share one GPU: 2 (the paper packs pairs, and the solver's
    capacity and memory checks are for pairs) or 1, which turns sharing off."""

    unstable_util_std: float = field(default=0.15, metadata=_bounds(exclusive_minimum=0.0))
    """A packed job whose sampled GPU utilization (0..1) has a standard deviation above this
    over its last ``util_window`` shared samples is unstable: the later-submitted job of
    the pair is evicted and returns in a later round (spec section 8)."""

    util_window: int = field(default=5, metadata=_bounds(minimum=2))
    """Shared profile samples the utilization check looks at."""

    before_samples: bool = False
    """Offer a job that has reported no sample yet a shared GPU, its load judged from its
    declared layer tables (``core.sharing.DeclaredLoad``). Off by default: on the 48-GPU
    2x trace it started many waiting jobs in pairs their first samples then rejected, and
    the moves back cost more than the earlier starts gained (docs/eval/HISTORY.md)."""

    gres: SharingGres = "shard"
    """The GRES a shared job asks for: ``shard`` (``--gres=shard:K``, the jobs' kernels
    time-sliced, no limit enforced) or ``mps`` (``--gres=mps:N``, CUDA MPS: kernels run
    concurrently, each job capped at its predicted utilisation and memory). It must match
    the GRES the partition's nodes have (``icefrog check`` compares it with sinfo)."""


@dataclass(frozen=True)
class SolverSettings:
    """The IceShare solver of the icefrog policy (spec sections 10 and 15)."""

    method: Literal["auto", "mip", "fast"] = "auto"
    """auto: the exact fast solver, falling back to the MIP when it cannot prove a round
    optimal; mip: the MIP alone; fast: never the MIP."""

    time_limit_s: float = field(default=30.0, metadata=_bounds(exclusive_minimum=0.0))
    """The MIP's time limit for one (sub)problem, seconds."""

    partition_gpus: int = field(default=240, metadata=_bounds(minimum=0))
    """Split a cluster of at least twice this many GPUs into groups of about this many,
    solved apart (spec section 15: what keeps a 960-GPU round within seconds); 0 never
    splits."""

    workers: int = field(default=1, metadata=_bounds(minimum=1))
    """Processes solving partitions at once."""

    starvation_rounds: float = field(default=4.0, metadata=_bounds(exclusive_minimum=0.0))
    """A waiting job's weight grows by 1 every this many rounds it has waited beyond the
    grace below (aging: no job waits forever)."""

    starvation_grace_rounds: int = field(default=12, metadata=_bounds(minimum=0))
    """Rounds a job may wait before its weight starts to grow. Without a grace, a full
    cluster of alike jobs swaps its running and waiting jobs every round (each swap a
    checkpoint-restart); with 12 rounds (an hour) it rotates them at most hourly."""

    fairness_floor: float = field(default=0.5, metadata=_bounds(exclusive_minimum=0.0, maximum=1.0))
    """IceShare's stage 2 keeps the allocations giving every job at least this fraction of
    the max-min share stage 1 found (eq 18), and among them maximizes the sum of shares.
    1 is the paper's objective; below 1 trades some fairness for throughput (every job still
    runs whenever all can). 0.5 shortens the average JCT on every evaluation trace but the
    3x one (docs/evaluation.md, "The fairness floor")."""

    max_fits_per_round: int = field(default=8, metadata=_bounds(minimum=1))
    """Throughput models refitted at most this many a round (oldest jobs first; a fit costs
    about 15 ms on average); the others keep their last model until a later round."""

    move_min_gain: float = field(default=MOVE_MIN_GAIN, metadata=_bounds(minimum=0.0, maximum=1.0))
    """Hysteresis: a running job is moved to an allocation it is predicted to finish sooner
    on only when that saves, after paying ``controller.reallocation_overhead_s``, at least
    this fraction of its remaining time; smaller gains are not worth a restart a
    prediction's error may undo the next round. 0: every predicted gain moves it. Moves
    that make a job slower, to give its GPUs to others, are the solver's to decide."""


@dataclass(frozen=True)
class PolicySettings:
    """How the icefrog policy estimates jobs."""

    large_model_models: bool = True
    """Estimate each job with the throughput model of its declared parallelism (SDP eq 9-10,
    PP/HP eq 11-13; spec section 7). false: the DDP model (eq 4-7) for every job, the
    paper's ablation; the allocation unit still holds."""

    freezing: Freezing = "penalty"
    """How the icefrog policy picks each job's frozen layers: "penalty" (the Layer Tuner
    maximises E = psi x T over every legal depth each round, eq 15) or "freezeout"
    (FreezeOut's progressive schedule tuned once a job by effective progress, the
    baselines' "+"; the paper's ablation "frozen penalty -> tuned FreezeOut", spec
    section 15). The baselines always use FreezeOut."""

    freeze_patience_epochs: int = field(default=10, metadata=_bounds(minimum=0))
    """The Layer Tuner's safety net (``freezing = "penalty"``): a job that holds frozen
    layers while its target metric has not improved for this many epochs (the best of its
    last this-many epochs' reports no better than the best before them) trains unfrozen
    for the rest of its run: psi judges the cost of freezing from gradient noise and cannot
    see a frozen prefix that caps the metric below the target. Kept in the controller's
    memory (a restarted controller finds such a job again after another stall). 0: off."""

    exploration: bool = False
    """true: offer a job at most twice the largest GPU count it has measured (AdaptDL's
    rule), so a count its model mispredicts is reached in steps, measured and corrected;
    false: every legal count the cluster has, trusting the model's prediction (measured
    faster on the evaluation's traces, docs/evaluation.md). The baselines keep their own
    rules."""

    batch_scaling: bool = True
    """true (default): batch and layer elasticity together. For a job that declares no
    fixed global batch the icefrog policy's Layer Tuner maximises goodput, E x the
    statistical efficiency of the global batch (Pollux's, ``core/goodput.py``), instead of
    E alone, so it may change the job's global batch when that pays for the samples it
    costs (the paper's batch-elasticity ablation, spec section 15); the Model Trainer
    follows the decided batch with its learning-rate rule (``icefrog_launcher.lr``). A job
    that declares a fixed global batch (``--global-batch``) keeps it either way. false:
    the paper's protocol, E alone, at the batch the job declares. The baselines ignore it
    (Pollux+ always scores goodput)."""


@dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus metrics endpoint."""

    port: int | None = field(default=None, metadata=_bounds(minimum=1, maximum=65535))
    """TCP port of the Prometheus endpoint; leave unset for no endpoint."""

    address: str = "127.0.0.1"
    """Address the endpoint listens on: this host only by default (the metrics name users'
    job counts and the cluster's load; give an address of a trusted network to share them)."""


@dataclass(frozen=True)
class LoggingSettings:
    """The controller's log (stdout, read by journald)."""

    level: LogLevel = "INFO"
    """One of DEBUG, INFO, WARNING, ERROR."""


@dataclass(frozen=True)
class ReportsSettings:
    """What ``icefrog squeue``, ``sacct`` and ``show job`` show to whom."""

    private: bool = False
    """Like Slurm's ``PrivateData=jobs``: a user other than root and the members of
    ``operator_group`` sees only his own jobs. Off by default, as in Slurm. A display rule,
    not access control: whoever can read the database can read every job."""

    operator_group: str | None = None
    """A Unix group whose members see every job when ``private`` is on (unset: root only)."""

    url: str | None = None
    """The database URL the report commands read, for a role that may only read (e.g.
    ``postgresql+psycopg://icefrog_reader@dbhost/icefrog``, its password in the user's
    ``~/.pgpass``), set in a file every user can read: ``/etc/icefrog/reports.toml``
    (docs/admin-guide.md, "Users reading reports"). Unset: ``store.url``."""


@dataclass(frozen=True)
class Settings:
    """All of the controller's settings: one section a field."""

    controller: ControllerSettings = field(default_factory=ControllerSettings)
    """The scheduling round."""

    state: StateSettings = field(default_factory=StateSettings)
    """Where the controller keeps its files."""

    store: StoreSettings = field(default_factory=StoreSettings)
    """The state store's database."""

    inbox: InboxSettings = field(default_factory=InboxSettings)
    """The report inbox."""

    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    """The Slurm cluster."""

    submit: SubmitSettings = field(default_factory=SubmitSettings)
    """``icefrog submit``'s memory and cores per GPU."""

    sharing: SharingSettings = field(default_factory=SharingSettings)
    """GPU sharing."""

    solver: SolverSettings = field(default_factory=SolverSettings)
    """The IceShare solver."""

    policy: PolicySettings = field(default_factory=PolicySettings)
    """The icefrog policy's estimates."""

    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    """The Prometheus endpoint."""

    logging: LoggingSettings = field(default_factory=LoggingSettings)
    """Logging."""

    reports: ReportsSettings = field(default_factory=ReportsSettings)
    """The reports (squeue, sacct, show job)."""

    def __post_init__(self) -> None:
        state = Path(self.state.dir)
        if not self.store.url:
            object.__setattr__(
                self, "store", replace(self.store, url=f"sqlite:///{state / 'icefrog.db'}")
            )
        inbox = self.inbox
        if not inbox.dir:
            inbox = replace(inbox, dir=str(state / "inbox"))
        if not inbox.archive_dir:
            inbox = replace(inbox, archive_dir=str(state / "archive"))
        object.__setattr__(self, "inbox", inbox)


MAX_SETTINGS_BYTES = 1024 * 1024
"""Largest settings file read (the example with every field is under 20 KB)."""


def load_settings(path: str | Path) -> Settings:
    """Read and check one TOML settings file; every fault of the file (missing, a folder,
    unreadable, too large, not UTF-8, not TOML, nested too deep) is an InputError naming it."""
    name = jsonio.printable(str(path), 200)
    text = read_text(path, limit=MAX_SETTINGS_BYTES, kind="settings file")
    return settings_from_mapping(_parse_toml(text, name), where=name)


def _parse_toml(text: str, name: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{name}: not valid TOML: {exc}") from None
    except RecursionError:
        raise InputError(f"{name}: not valid TOML: nested too deep") from None
    except ValueError:  # an integer of more digits than Python converts
        raise InputError(f"{name}: not valid TOML: a number too long to read") from None


def settings_from_mapping(data: Mapping[str, Any], *, where: str = "settings") -> Settings:
    """Build :class:`Settings` from parsed TOML, rejecting unknown keys and wrong types."""
    try:
        settings: Settings = _build(Settings, data, "")
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    return settings


def _build(cls: type[Any], data: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    jsonio.reject_unknown(data, [f.name for f in fields(cls)], where)
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        hint = hints[f.name]
        path = f"{where}.{f.name}" if where else f.name
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            section = data[f.name]
            if not isinstance(section, Mapping):
                raise InputError(f"{path}: must be a table [{path}]")
            values[f.name] = _build(hint, section, path)
        else:
            values[f.name] = _value(hint, data, f, where)
    return cls(**values)


def _value(hint: Any, data: Mapping[str, Any], f: dataclasses.Field[Any], where: str) -> Any:
    """One scalar field, read with the strict readers of :mod:`icefrog_slurm.jsonio`."""
    bounds = dict(f.metadata)
    name = f.name
    if typing.get_origin(hint) in (types.UnionType, typing.Union):  # `int | None`: optional
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is Literal:
        value = jsonio.get_str(data, name, where)
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise InputError(f"{where}.{name}: must be one of {', '.join(allowed)}, got {value!r}")
        return value
    if hint is bool:
        return jsonio.get_bool(data, name, where)
    if hint is int:
        low, high = bounds.get("minimum"), bounds.get("maximum")
        return jsonio.get_int(  # within 64 bits even where the field sets no bound
            data,
            name,
            where,
            minimum=jsonio.INT_MIN if low is None else int(low),
            maximum=jsonio.INT_MAX if high is None else int(high),
        )
    if hint is float:
        return jsonio.get_number(data, name, where, **bounds)
    if hint is str:
        text = jsonio.get_str(data, name, where)
        if not text.isprintable():  # a NUL in a path or URL fails far from here
            fault = "must be printable text"
        elif bounds.get("absolute") and not Path(text).is_absolute():
            fault = "must be an absolute path"
        else:
            return text
        raise InputError(f"{where}.{name}: {fault}, got {jsonio.printable(text, 60)!r}")
    raise TypeError(f"settings field {name}: unsupported type {hint!r}")  # a bug, not input


def apply_overrides(settings: Settings, pairs: Sequence[str]) -> Settings:
    """``settings`` with ``section.key=value`` overrides (``icefrog simulate --set``).

    Each value is read as a TOML value (``0.6``, ``60``, ``true``, ``"text"``), else as a
    bare string (``freezeout``); the overrides then go through the same strict loader as a
    settings file, so an unknown key or a bad value is an ``InputError`` naming the key.
    """
    data: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        path = [p.strip() for p in key.split(".")]
        if not sep or len(path) < 2 or not all(path):
            raise InputError(f"--set {pair!r}: must be SECTION.KEY=VALUE")
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InputError(f"--set {key}: {part} is a value, not a section")
            node = child
        node[path[-1]] = _toml_value(text.strip())
    checked = settings_from_mapping(data, where="--set")
    merged: Settings = _merge(settings, checked, data)
    return merged


def _toml_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):  # not a TOML value: text
        return text


def _merge(base: Any, checked: Any, data: Mapping[str, Any]) -> Any:
    """``base`` with the fields named in ``data`` taken from ``checked`` (nested)."""
    changes: dict[str, Any] = {}
    for name, value in data.items():
        new = getattr(checked, name)
        changes[name] = _merge(getattr(base, name), new, value) if isinstance(value, dict) else new
    return replace(base, **changes)
