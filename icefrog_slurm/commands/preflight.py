"""What the controller needs before it starts: ``icefrog controller --check``, and its first start.

:func:`check` looks at everything the daemon needs and prints one line a check, ``NAME ok:
what it found`` or ``NAME FAIL: what is wrong and what to run``; it creates, changes and
starts nothing (a SQLite file that does not exist is reported, never created). Exit 0 when
every check passed, 2 otherwise. The checks, in order:

- ``settings``: the TOML file parses and every key is known; if not, that is the one line,
  ``icefrog controller: error: ...`` like every command's, exit 2 (nothing else can run);
  so is a process that does not run as root (:func:`require_root`);
  then the file and the folders above it are writable by root alone
  (``state_folders.unsafe_path``);
- ``database``: the URL is one a controller can lead on, a SQLite file (its ``-wal``,
  ``-shm`` and ``.leader``, and the folders above) is writable by root alone, the database
  exists, is icefrog's and is at the newest revision (read only: ``migrate.require_head``);
- ``state.dir``, ``inbox.dir``, ``inbox.archive_dir``: owner and mode, and the folders above
  them writable by root alone (``state_folders``); an absent one is fine, the first start
  makes it;
- ``tag secret``: ``<state.dir>/tag.key`` is a plain file of the controller's uid that
  nobody else may read or write, of at least 16 bytes (absent: made at the first start);
- ``munge``: munged makes and decodes a credential (``inbox.munge_socket``);
- ``slurm``: the backend's capacity call (``sinfo`` and ``squeue`` for the CLI backend,
  one try) lists usable nodes in ``slurm.partition``, and, with sharing on, each of them
  offers the GRES ``sharing.gres`` names (``shard`` or ``mps``), as many a GPU as
  ``slurm.shards_per_gpu`` / ``slurm.mps_per_gpu`` say;
- ``metrics``: off, or prometheus_client is installed and ``metrics.address:port`` can be
  listened on.

The daemon itself stops only at the first four kinds (the settings, the database, the
folders, the tag secret): munged or slurmctld not answering is a fault it waits out, but a
controller started so does nothing useful, so the check fails them too.

:func:`first_start` is the daemon's own gate, run before anything else touches the host:
the database is checked first (read only, so a missing or unmigrated one is refused with
"run `icefrog db upgrade`" and never created), then the metrics port when the endpoint is
to be served (a port in use is one line, not a traceback later), then the folders are made
or refused (``state_folders.make``).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shlex
import socket
import stat
from collections.abc import Callable
from pathlib import Path

from icefrog_slurm.commands import state_folders
from icefrog_slurm.domain.cluster import PartitionCapacity
from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.jsonio import printable
from icefrog_slurm.settings import Settings, load_settings
from icefrog_slurm.slurm.identity import TAG_SECRET

SECRET_MIN_BYTES = 16


class Failed(IcefrogError):
    """A check failed; the message says why and what to run."""


def require_root() -> None:
    """InputError unless this process runs as root: the controller updates other users'
    jobs, resubmits them as their owners and keeps root-only files. Run as another user it
    could do none of it, and what its first start made would be that user's."""
    if os.geteuid() != 0:
        raise InputError(
            f"the controller runs as root (this process runs as uid {os.geteuid()}): run it "
            "as root, as its systemd unit does"
        )


def first_start(settings: Settings, *, config: str, metrics: bool = False) -> None:
    """Refuse a settings file users could change and a database the daemon cannot use,
    before touching it; with ``metrics`` (the endpoint is to be served), a metrics port that
    cannot be listened on; then make (or refuse) the state folder, the inbox and the
    archive."""
    try:
        check_settings_file(config)
    except Failed as exc:
        raise InputError(f"--config: {exc}") from None
    check_database(settings, config=config)
    if metrics:
        try:
            check_metrics(settings)
        except Failed as exc:
            raise InputError(str(exc)) from None
    state_folders.make(settings)


def check(config: str) -> int:
    """Run every check, print one line each; 0 when all passed, else 2. Settings that do
    not load raise their InputError."""
    settings = load_settings(config)  # without settings nothing else can be checked
    require_root()
    state, inbox, archive = state_folders.folders(settings)
    checks: list[tuple[str, Callable[[], str]]] = [
        ("settings", lambda: check_settings_file(config)),
        ("database", lambda: check_database(settings, config=config)),
        *[
            (f.key, _folder_check(f, inbox.path if f is archive else None))
            for f in (state, inbox, archive)
        ],
        ("tag secret", lambda: check_tag_secret(Path(settings.state.dir) / TAG_SECRET)),
        ("munge", lambda: check_munge(settings.inbox.munge_socket)),
        ("slurm", lambda: check_slurm(settings)),
        ("metrics", lambda: check_metrics(settings)),
    ]
    passed = True
    for name, run in checks:
        try:
            detail = run()
        except (IcefrogError, OSError) as exc:  # an OSError: a path no check foresaw
            _print(name, False, str(exc))
            passed = False
        else:
            _print(name, True, detail)
    return 0 if passed else 2


def check_settings_file(config: str) -> str:
    """The settings file, as :func:`state_folders.unsafe_path` wants it: a user who could
    write it could point ``state.dir`` and ``store.url`` anywhere."""
    why = state_folders.unsafe_path(Path(config))
    if why is not None:
        raise Failed(why)
    return printable(config, 300)


def check_database(settings: Settings, *, config: str) -> str:
    """The database is one a controller can lead on, ours, at the newest revision; reads
    only. InputError (IcefrogError when its server cannot be reached) otherwise."""
    from icefrog_slurm.store import dburl, migrate
    from icefrog_slurm.store.leader import lock_path

    url = settings.store.url
    parsed = dburl.parse(url)
    lock = lock_path(parsed)  # an in-memory database is refused before it is looked at
    if lock is not None:  # a SQLite file: a user who could write it could rewrite any job
        if not Path(str(parsed.database)).is_absolute():
            raise InputError(
                f"store.url: {dburl.shown(parsed)}: the SQLite file must be an absolute path "
                "(sqlite:////path/to/icefrog.db)"
            )
        real = lock.removesuffix(".leader")
        for path in (str(parsed.database), real + "-wal", real + "-shm", lock):
            why = state_folders.unsafe_path(Path(path))
            if why is not None:
                raise InputError(f"store.url: {why}")
    hint = f"icefrog db upgrade --config {shlex.quote(printable(config, 300))}"
    migrate.require_head(url, upgrade_hint=hint)
    return f"{dburl.shown(parsed)} at revision {migrate.head_revision()}"


def _folder_check(folder: state_folders.Folder, inbox: Path | None) -> Callable[[], str]:
    def run() -> str:
        fine, why = state_folders.inspect(folder, inbox=inbox)
        if not fine:
            raise Failed(why)
        return f"{printable(str(folder.path), 300)}: {why}"

    return run


def check_tag_secret(path: Path) -> str:
    """The secret that signs resubmitted jobs' tags, as ``TagSigner.from_file`` accepts it."""
    shown = printable(str(path), 300)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"{shown}: absent: the first start makes it, mode 0600"
    except OSError as exc:
        raise Failed(f"{shown}: {exc.strerror}: it must be a plain file, mode 0600") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    uid, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        raise Failed(f"{shown} is not a plain file: remove it (the next start makes one)")
    if st.st_uid != uid:
        raise Failed(f"{shown} is owned by uid {st.st_uid}: run `chown root {shown}`")
    if mode & 0o077:
        raise Failed(f"{shown} has mode {mode:04o}, others may use it: run `chmod 0600 {shown}`")
    if st.st_size < SECRET_MIN_BYTES:
        raise Failed(f"{shown} holds {st.st_size} bytes, fewer than {SECRET_MIN_BYTES}")
    return f"{shown}: mode {mode:04o}, uid {uid}"


def check_munge(munge_socket: str | None) -> str:
    """munged makes a credential and decodes it again, to this process's uid."""
    from icefrog_slurm import security

    where = f"munged ({printable(munge_socket, 300) if munge_socket else 'default socket'})"
    try:
        decoded = security.decode(security.encode("", socket=munge_socket), socket=munge_socket)
    except security.MungeNotInstalled as exc:
        raise Failed(f"{exc}: install munge (apt-get install munge)") from None
    except security.MungeUnavailable as exc:
        raise Failed(f"{where} does not answer: {exc}: run `systemctl start munge`") from None
    except security.MungeError as exc:
        raise Failed(f"{where}: {exc}") from None
    if decoded.uid != os.geteuid():
        raise Failed(f"{where} decoded uid {decoded.uid}, not this process's {os.geteuid()}")
    return f"{where} answers"


def check_slurm(settings: Settings) -> str:
    """The backend's capacity call on the partition, tried once; usable nodes in it."""
    from icefrog_slurm.slurm.cli_backend import CliSettings, SlurmCliBackend
    from icefrog_slurm.slurm.identity import TagSigner
    from icefrog_slurm.slurm.port import ClusterPort
    from icefrog_slurm.slurm.select import make_cluster

    partition = settings.slurm.partition
    shown = printable(partition, 100)
    try:
        cluster: ClusterPort
        if settings.slurm.backend == "cli":
            cluster = SlurmCliBackend(CliSettings(attempts=1), signer=TagSigner.ephemeral())
        else:
            cluster = make_cluster(settings.slurm.backend, signer=TagSigner.ephemeral())
        capacity = cluster.partition_capacity(partition=partition)
    except IcefrogError as exc:  # Slurm's last line says why (its first, the command)
        why = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise Failed(f"partition {shown}: {why}: is slurmctld up (`sinfo -p {shown}`)?") from None
    if not capacity.nodes:
        raise Failed(
            f"partition {shown}: no usable node with GPUs (`sinfo -p {shown}`): "
            "set slurm.partition, or resume its nodes"
        )
    return (
        f"partition {shown}: {capacity.total_gpus} GPUs on {len(capacity.nodes)} nodes, "
        f"{capacity.available_gpus} free of foreign jobs; {check_sharing(settings, capacity)}"
    )


def check_sharing(settings: Settings, capacity: PartitionCapacity) -> str:
    """With sharing on, every node of the partition offers the GRES ``sharing.gres`` names,
    as many a GPU as the settings say (a shared job pinned to a node without it would wait
    for ever, and its share would be another part of the GPU than the one decided)."""
    kind = settings.sharing.gres
    if settings.sharing.max_jobs_per_gpu < 2:
        return "sharing off (sharing.max_jobs_per_gpu = 1)"
    per_gpu = settings.slurm.mps_per_gpu if kind == "mps" else settings.slurm.shards_per_gpu
    key = "slurm.mps_per_gpu" if kind == "mps" else "slurm.shards_per_gpu"
    shown = printable(capacity.partition, 100)
    other = "shard" if kind == "mps" else "mps"
    for node in capacity.nodes:
        have, has_other = (node.mps, node.shards) if kind == "mps" else (node.shards, node.mps)
        name = printable(node.name, 100)
        if not have:
            offers = f"gres/{other}" if has_other else "no shared GRES"
            raise Failed(
                f'sharing.gres = "{kind}" but node {name} of partition {shown} offers '
                f"{offers} (`sinfo -N -p {shown} -o '%N %G'`): set sharing.gres"
                + (f' = "{other}"' if has_other else "")
                + f", or give the nodes gres/{kind} (GresTypes, gres.conf Name={kind})"
            )
        if node.gpus and have != per_gpu * node.gpus:
            raise Failed(
                f"{key} = {per_gpu} but node {name} has {kind}:{have} for {node.gpus} GPUs "
                f"(gres.conf Name={kind} Count=): set {key} = {have // node.gpus}"
            )
    return f"GPUs shared by {kind}, {per_gpu} a GPU"


def check_metrics(settings: Settings) -> str:
    """Off, or prometheus_client is there and the address and port can be listened on."""
    port, address = settings.metrics.port, settings.metrics.address
    if port is None:
        return "off (metrics.port unset)"
    where = f"{printable(address, 200)}:{port}"
    if importlib.util.find_spec("prometheus_client") is None:
        raise Failed("prometheus_client is not installed: pip install 'icefrog-slurm[metrics]'")
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
        family, kind, proto, _name, sockaddr = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
    except OSError as exc:  # socket.gaierror is one too
        # no such address (a name that does not resolve, an address of another host), or
        # the port (in use, a privileged one)
        address_fault = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
        key = "metrics.address" if address_fault else "metrics.port"
        raise Failed(f"{key}: {where}: cannot listen: {exc.strerror or exc}: set {key}") from None
    return f"{where} free"


def _print(name: str, ok: bool, detail: str) -> None:
    status = "ok" if ok else "FAIL"
    print(f"{name:<17} {status}: {printable(detail, 1000)}", flush=True)
