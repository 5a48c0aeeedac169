"""sbatch's options as ``icefrog submit`` takes them and the controller replays them: the
option table of sbatch 22.05 with each option's class, a parser with sbatch's rules, and the
``#SBATCH`` header reader and writer. Pure: no I/O.

Classes (``Kind``):

- ``PASS``: kept as the user gave it, written into the job's batch script as an ``#SBATCH``
  line, so that every resubmission of that script (the controller's gpu<->shard moves)
  applies it again: ``--time``, ``--account``, ``--qos``, ``--mail-type``...
- ``ICEFROG``: an ``icefrog submit`` option under sbatch's name (``-J``, ``-o``, ``-p``,
  ``-D``, ``--mem-per-gpu``, ``--cpus-per-gpu``, ``--export``, ``--parsable``): the
  controller carries it (name, output, partition, host memory and cores per GPU), the
  script records it (the environment, the run folder) or ``icefrog submit`` follows it
  (what it prints).
- ``OWNED``: decided by the controller (GPUs, nodes and the features or reservation that
  would choose them, tasks, when the job starts, its comment, requeueing): refused with the
  reason.
- ``UNSUPPORTED``: refused with the reason (arrays, ``--wrap``, ``--wait``, root-only ones).
- ``IGNORED``: no effect under icefrog (``--quiet``, ``--requeue``...).

Parsing follows sbatch's ``getopt_long`` (``+``: the first argument that is not an option
ends the options): ``--opt=value`` or ``--opt value`` for a required value, only
``--opt=value`` for an optional one, a unique prefix of a long name (``--acc``), short
options with their value attached or next (``-t10``, ``-t 10``), flags grouped (``-Hv``).
The header is read as sbatch 22.05 reads it: ``#SBATCH`` lines before the first line that
is neither blank nor a comment; on a line, arguments split at unquoted white space, ``'``
and ``"`` quote, ``\\`` escapes the next character, an unquoted ``#`` ends the line.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from icefrog_slurm.errors import InputError


class Kind(enum.Enum):
    PASS = "pass"
    ICEFROG = "icefrog"
    OWNED = "owned"
    UNSUPPORTED = "unsupported"
    IGNORED = "ignored"


@dataclass(frozen=True)
class Spec:
    """One option: long name, short letter, value (``=`` required, ``?`` optional, ``""``
    none), class, and why it is refused (OWNED, UNSUPPORTED)."""

    name: str
    short: str
    arg: str
    kind: Kind
    why: str = ""


@dataclass(frozen=True)
class Given:
    """One option as given: its spec, its value (None: none given) and where."""

    spec: Spec
    value: str | None
    where: str

    def token(self) -> str:
        """The long form sbatch reads back as this option (``--time=10``)."""
        if self.value is None:
            return f"--{self.spec.name}"
        return f"--{self.spec.name}={self.value}"


_GPUS = "the icefrog controller decides the job's GPUs (it may move it to a shared GPU)"
_NODES = "the icefrog controller decides the job's nodes"
_TASKS = "icefrog launch starts one task a node (torchrun starts the workers)"
_HOST = (
    "give host memory and cores per GPU (--mem-per-gpu, --cpus-per-gpu): the controller "
    "changes the job's GPU count and keeps them per GPU"
)
_START = "the icefrog controller decides when the job starts (it holds and releases it)"
_CHOSEN = (
    "the icefrog controller chooses the job's nodes among all of its partition's GPUs, "
    "whatever their features or reservations"
)
_ROOT = "root only; icefrog submits as you"


def _specs() -> tuple[Spec, ...]:
    pas, ice, own, uns, ign = Kind.PASS, Kind.ICEFROG, Kind.OWNED, Kind.UNSUPPORTED, Kind.IGNORED
    rows: list[tuple[str, str, str, Kind, str]] = [
        ("account", "A", "=", pas, ""),
        ("acctg-freq", "", "=", pas, ""),
        ("array", "a", "=", uns, "job arrays are not supported: submit one icefrog job each"),
        ("batch", "", "=", pas, ""),
        ("bb", "", "=", pas, ""),
        ("bbf", "", "=", pas, ""),
        ("begin", "b", "=", own, _START),
        ("chdir", "D", "=", ice, ""),
        ("cluster-constraint", "", "=", pas, ""),
        ("clusters", "M", "=", uns, "the icefrog controller manages one cluster"),
        ("comment", "", "=", own, "the comment carries the icefrog controller's tag"),
        ("constraint", "C", "=", own, _CHOSEN),
        ("container", "", "=", pas, ""),
        ("contiguous", "", "", pas, ""),
        ("core-spec", "S", "=", pas, ""),
        ("cores-per-socket", "", "=", pas, ""),
        ("cpu-freq", "", "=", pas, ""),
        ("cpus-per-gpu", "", "=", ice, ""),
        ("cpus-per-task", "c", "=", own, _HOST),
        ("deadline", "", "=", pas, ""),
        ("delay-boot", "", "=", pas, ""),
        ("dependency", "d", "=", own, _START),
        ("distribution", "m", "=", pas, ""),
        ("error", "e", "=", pas, ""),
        ("exclude", "x", "=", own, _NODES),
        ("exclusive", "", "?", own, _NODES + " and how they are shared"),
        ("export", "", "=", ice, ""),
        ("export-file", "", "=", uns, "give the variables with --export"),
        ("extra-node-info", "B", "=", pas, ""),
        ("get-user-env", "", "?", uns, _ROOT),
        ("gid", "", "=", uns, _ROOT),
        ("gpu-bind", "", "=", own, _GPUS),
        ("gpu-freq", "", "=", own, _GPUS),
        ("gpus", "G", "=", own, _GPUS),
        ("gpus-per-node", "", "=", own, _GPUS),
        ("gpus-per-socket", "", "=", own, _GPUS),
        ("gpus-per-task", "", "=", own, _GPUS),
        ("gres", "", "=", own, _GPUS),
        ("gres-flags", "", "=", own, _GPUS),
        ("help", "h", "", uns, "see icefrog submit --help"),
        ("hint", "", "=", pas, ""),
        ("hold", "H", "", own, _START),
        ("ignore-pbs", "", "", ign, ""),
        ("input", "i", "=", pas, ""),
        ("job-name", "J", "=", ice, ""),
        ("kill-on-invalid-dep", "", "=", pas, ""),
        ("licenses", "L", "=", pas, ""),
        ("mail-type", "", "=", pas, ""),
        ("mail-user", "", "=", pas, ""),
        ("mcs-label", "", "=", pas, ""),
        ("mem", "", "=", own, _HOST),
        ("mem-bind", "", "=", pas, ""),
        ("mem-per-cpu", "", "=", own, _HOST),
        ("mem-per-gpu", "", "=", ice, ""),
        ("mincpus", "", "=", own, _HOST),
        ("network", "", "=", pas, ""),
        ("nice", "", "?", pas, ""),
        ("no-kill", "k", "?", pas, ""),
        ("no-requeue", "", "", own, "the icefrog controller requeues the job to resize it"),
        ("nodefile", "F", "=", own, _NODES),
        ("nodelist", "w", "=", own, _NODES),
        ("nodes", "N", "=", own, _NODES),
        ("ntasks", "n", "=", own, _TASKS),
        ("ntasks-per-core", "", "=", own, _TASKS),
        ("ntasks-per-gpu", "", "=", own, _GPUS),
        ("ntasks-per-node", "", "=", own, _TASKS),
        ("ntasks-per-socket", "", "=", own, _TASKS),
        ("open-mode", "", "=", own, "a requeued job's runs append to one output file"),
        ("output", "o", "=", ice, ""),
        ("overcommit", "O", "", pas, ""),
        ("oversubscribe", "s", "", pas, ""),
        ("parsable", "", "", ice, ""),
        ("partition", "p", "=", ice, ""),
        ("power", "", "=", pas, ""),
        ("prefer", "", "=", pas, ""),
        ("priority", "", "=", pas, ""),
        ("profile", "", "=", pas, ""),
        ("propagate", "", "?", pas, ""),
        ("qos", "q", "=", pas, ""),
        ("quiet", "Q", "", ign, ""),
        ("reboot", "", "", pas, ""),
        ("requeue", "", "", ign, ""),
        ("reservation", "", "=", own, _CHOSEN),
        ("signal", "", "=", pas, ""),
        ("sockets-per-node", "", "=", pas, ""),
        ("spread-job", "", "", own, _NODES),
        ("switches", "", "=", pas, ""),
        ("test-only", "", "", uns, "icefrog submit submits the job held; see icefrog squeue"),
        ("thread-spec", "", "=", pas, ""),
        ("threads-per-core", "", "=", pas, ""),
        ("time", "t", "=", pas, ""),
        ("time-min", "", "=", pas, ""),
        ("tmp", "", "=", pas, ""),
        ("uid", "", "=", uns, _ROOT),
        ("usage", "", "", uns, "see icefrog submit --help"),
        ("use-min-nodes", "", "", own, _NODES),
        ("verbose", "v", "", ign, ""),
        ("version", "V", "", uns, "see icefrog --version"),
        ("wait", "W", "", uns, "icefrog submit returns once the job is submitted held"),
        ("wait-all-nodes", "", "=", pas, ""),
        ("wckey", "", "=", pas, ""),
        ("wrap", "", "=", uns, "icefrog submit writes the batch script: give a script"),
    ]
    return tuple(Spec(*row) for row in rows)


SBATCH: tuple[Spec, ...] = _specs()
"""Every option of sbatch 22.05 (``man sbatch``), classified."""

INPUT_VARIABLES: dict[str, str] = {
    "SBATCH_ACCOUNT": "account",
    "SBATCH_ACCTG_FREQ": "acctg-freq",
    "SBATCH_ARRAY_INX": "array",
    "SBATCH_BATCH": "batch",
    "SBATCH_CLUSTERS": "clusters",
    "SBATCH_CONSTRAINT": "constraint",
    "SBATCH_CONTAINER": "container",
    "SBATCH_CORE_SPEC": "core-spec",
    "SBATCH_CPUS_PER_GPU": "cpus-per-gpu",
    "SBATCH_DEBUG": "verbose",
    "SBATCH_DELAY_BOOT": "delay-boot",
    "SBATCH_DISTRIBUTION": "distribution",
    "SBATCH_ERROR": "error",
    "SBATCH_EXCLUSIVE": "exclusive",
    "SBATCH_EXPORT": "export",
    "SBATCH_GET_USER_ENV": "get-user-env",
    "SBATCH_GPU_BIND": "gpu-bind",
    "SBATCH_GPU_FREQ": "gpu-freq",
    "SBATCH_GPUS": "gpus",
    "SBATCH_GPUS_PER_NODE": "gpus-per-node",
    "SBATCH_GPUS_PER_TASK": "gpus-per-task",
    "SBATCH_GRES": "gres",
    "SBATCH_GRES_FLAGS": "gres-flags",
    "SBATCH_HINT": "hint",
    "SBATCH_IGNORE_PBS": "ignore-pbs",
    "SBATCH_INPUT": "input",
    "SBATCH_JOB_NAME": "job-name",
    "SBATCH_MEM_BIND": "mem-bind",
    "SBATCH_MEM_PER_CPU": "mem-per-cpu",
    "SBATCH_MEM_PER_GPU": "mem-per-gpu",
    "SBATCH_MEM_PER_NODE": "mem",
    "SBATCH_NETWORK": "network",
    "SBATCH_NO_KILL": "no-kill",
    "SBATCH_NO_REQUEUE": "no-requeue",
    "SBATCH_OPEN_MODE": "open-mode",
    "SBATCH_OUTPUT": "output",
    "SBATCH_OVERCOMMIT": "overcommit",
    "SBATCH_PARTITION": "partition",
    "SBATCH_POWER": "power",
    "SBATCH_PROFILE": "profile",
    "SBATCH_QOS": "qos",
    "SBATCH_REQ_SWITCH": "switches",
    "SBATCH_REQUEUE": "requeue",
    "SBATCH_RESERVATION": "reservation",
    "SBATCH_SIGNAL": "signal",
    "SBATCH_SPREAD_JOB": "spread-job",
    "SBATCH_THREAD_SPEC": "thread-spec",
    "SBATCH_THREADS_PER_CORE": "threads-per-core",
    "SBATCH_TIMELIMIT": "time",
    "SBATCH_USE_MIN_NODES": "use-min-nodes",
    "SBATCH_WAIT": "wait",
    "SBATCH_WAIT_ALL_NODES": "wait-all-nodes",
    "SBATCH_WCKEY": "wckey",
}
"""sbatch's input environment variables (``man sbatch``) and the option each stands for;
``SLURM_CLUSTERS`` and ``SLURM_HINT`` count when their ``SBATCH_`` name is unset, and
``SBATCH_WAIT4SWITCH`` is the ``@TIME`` of ``--switches``."""

MAX_VALUE = 4096
_STOP_SIGNAL = re.compile(r"B:(?:SIG)?(?:USR1|TERM|10|15)(?:@([0-9]{1,5}))?", re.IGNORECASE)
"""The ``--signal`` values icefrog's batch script passes on to the launcher: USR1 or TERM
(by name, with or without SIG, or by Linux's number) to the batch shell (``B:``), with
or without ``@SECONDS`` (at most 65535, as sbatch)."""
_WS = " \t\n\v\f\r"  # C's isspace, as sbatch splits a line
_HETJOB = re.compile(r"hetjob|packjob", re.IGNORECASE)


class Table:
    """Options by long name and by short letter (the first given wins a name)."""

    def __init__(self, specs: Sequence[Spec]) -> None:
        self.long: dict[str, Spec] = {}
        self.short: dict[str, Spec] = {}
        for s in specs:
            self.long.setdefault(s.name, s)
            if s.short:
                self.short.setdefault(s.short, s)

    def lookup(self, name: str, where: str) -> Spec:
        """A long option by its name or a unique prefix of it, as getopt_long."""
        if name in self.long:
            return self.long[name]
        found = {s for n, s in self.long.items() if n.startswith(name)} if name else set()
        if len(found) == 1:
            return found.pop()
        if found:
            names = ", ".join(sorted(f"--{s.name}" for s in found))
            raise InputError(f"--{name} ({where}): ambiguous, could be {names}")
        raise InputError(f"--{name} ({where}): not an sbatch option")


SBATCH_TABLE = Table(SBATCH)


def parse(argv: Sequence[str], table: Table, *, where: str) -> tuple[list[Given], list[str]]:
    """The options at the front of ``argv`` and what follows them (from the first argument
    that is not an option, or after ``--``), by sbatch's rules (module docstring); sbatch's
    separator of a heterogeneous job's components, ``:``, is refused."""
    given: list[Given] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return given, list(argv[i + 1 :])
        if arg == ":":
            raise InputError(
                f"':' ({where}): separates the components of a heterogeneous job, which "
                "icefrog does not support: submit one job each"
            )
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            spec = table.lookup(name, where)
            if spec.arg == "" and eq:
                raise InputError(f"--{spec.name} ({where}): takes no value")
            if spec.arg == "=" and not eq:
                if i + 1 == len(argv):
                    raise InputError(f"--{spec.name} ({where}): needs a value")
                i += 1
                value = argv[i]
            given.append(Given(spec, value if eq or spec.arg == "=" else None, where))
        elif arg.startswith("-") and len(arg) > 1:
            j = 1
            while j < len(arg):
                spec_or_none = table.short.get(arg[j])
                if spec_or_none is None:
                    raise InputError(f"-{arg[j]} ({where}): not an sbatch option")
                spec = spec_or_none
                rest = arg[j + 1 :]
                if spec.arg == "":
                    given.append(Given(spec, None, where))
                    j += 1
                    continue
                if spec.arg == "=" and not rest:
                    if i + 1 == len(argv):
                        raise InputError(f"-{spec.short} ({where}): needs a value")
                    i += 1
                    rest = argv[i]
                # an optional value only attached (-k, -kVALUE); a required one as given
                given.append(Given(spec, rest if spec.arg == "=" else rest or None, where))
                break
        else:
            return given, list(argv[i:])
        i += 1
    return given, []


def environment_options(environ: Mapping[str, str]) -> list[Given]:
    """The options sbatch's input variables in ``environ`` give (:data:`INPUT_VARIABLES`):
    they override a script's header, the command line overrides them, as in sbatch."""
    env = dict(environ)
    for alias, var in (("SLURM_CLUSTERS", "SBATCH_CLUSTERS"), ("SLURM_HINT", "SBATCH_HINT")):
        if alias in env and var not in env:
            env[var] = env[alias]
    if "SBATCH_REQ_SWITCH" in env and env.get("SBATCH_WAIT4SWITCH"):
        env["SBATCH_REQ_SWITCH"] += "@" + env["SBATCH_WAIT4SWITCH"]
    if env.get("SBATCH_DEBUG", "0") == "0":
        env.pop("SBATCH_DEBUG", None)
    out: list[Given] = []
    for var, name in INPUT_VARIABLES.items():
        if var in env:
            spec = SBATCH_TABLE.long[name]
            value = None if spec.arg == "" or (spec.arg == "?" and not env[var]) else env[var]
            out.append(Given(spec, value, var))
    return out


def check_value(option: Given) -> None:
    """A value that can be written on one ``#SBATCH`` line and read back as it is: no line
    break or other control character, not too long, and not sbatch's heterogeneous-job
    separator words (a line holding ``hetjob`` splits the job)."""
    value = option.value
    if value is None:
        return
    name = f"--{option.spec.name} ({option.where})"
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in value):
        raise InputError(f"{name}: the value holds a line break or control character")
    if len(value) > MAX_VALUE:
        raise InputError(f"{name}: the value is longer than {MAX_VALUE} characters")
    if _HETJOB.search(value):
        raise InputError(f"{name}: heterogeneous jobs (hetjob) are not supported")


def refuse(option: Given) -> None:
    """An OWNED or UNSUPPORTED option is an InputError naming it and why; an ``--open-mode``
    other than append (icefrog's own) too, and a ``--signal`` other than
    :data:`_STOP_SIGNAL`'s (the batch shell's trap of another signal is none: the job is
    killed without a checkpoint; one without ``B:`` goes to job steps, and a one-node job
    has none: no warning arrives)."""
    spec = option.spec
    if spec.name == "open-mode" and (option.value or "")[:1] in ("a", "A"):
        return
    stop = _STOP_SIGNAL.fullmatch(option.value or "")
    if spec.name == "signal" and (stop is None or int(stop[1] or 0) > 0xFFFF):
        raise InputError(
            f"--signal ({option.where}): {option.value!r}: give B:USR1@SECONDS (or B:TERM): "
            "icefrog's batch script passes USR1 and TERM alone on to the launcher, and only "
            "a signal to the batch shell (B:) reaches it"
        )
    if spec.kind in (Kind.OWNED, Kind.UNSUPPORTED):
        raise InputError(f"--{spec.name} ({option.where}): not accepted: {spec.why}")


def quote(token: str) -> str:
    """``token`` as one argument of an ``#SBATCH`` line (double quotes; ``\\`` and ``"``
    escaped): sbatch reads back exactly ``token`` (:func:`line_arguments`)."""
    return '"' + token.replace("\\", "\\\\").replace('"', '\\"') + '"'


def header_lines(options: Sequence[Given]) -> str:
    """The ``#SBATCH`` lines of ``options`` (each checked by :func:`check_value`)."""
    for option in options:
        check_value(option)
    return "".join(f"#SBATCH {quote(o.token())}\n" for o in options)


def line_arguments(rest: str, where: str) -> list[str]:
    """The arguments of one ``#SBATCH`` line after the magic word, as sbatch 22.05's
    ``get_argument`` splits them (module docstring). An argument of no characters (``""``)
    ends the line there, as in sbatch."""
    out: list[str] = []
    i, n = 0, len(rest)
    while True:
        while i < n and rest[i] in _WS:
            i += 1
        if i == n:
            return out
        if rest[i] == ":":
            raise InputError(f"{where}: unexpected ':'")
        chars: list[str] = []
        quoted, q, escaped, comment = False, "", False, False
        while i < n and (quoted or rest[i] not in _WS) and rest[i] != "\n":
            c = rest[i]
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
                i += 1
                continue
            elif quoted:
                if c == q:
                    quoted = False
                    i += 1
                    continue
            elif c in "\"'":
                quoted, q = True, c
                i += 1
                continue
            elif c == "#":
                comment = True
                break
            chars.append(c)
            i += 1
        if quoted:
            raise InputError(f"{where}: unmatched {q}")
        if not chars:
            return out
        out.append("".join(chars))
        if comment:
            return out


def header_arguments(script: str, name: str) -> list[tuple[int, list[str]]]:
    """The arguments of the script's ``#SBATCH`` (and legacy ``#SLURM``) lines, with their
    line numbers, before its first line that is neither blank nor a comment."""
    found: list[tuple[int, list[str]]] = []
    for lineno, line in enumerate(script.split("\n"), 1):
        for magic in ("#SBATCH", "#SLURM"):
            if line.startswith(magic):
                where = f"{name} line {lineno}"
                if _HETJOB.search(line):
                    raise InputError(f"{where}: heterogeneous jobs (hetjob) are not supported")
                found.append((lineno, line_arguments(line[len(magic) :], where)))
                break
        else:
            if line.lstrip(_WS) and not line.lstrip(_WS).startswith("#"):
                break
    return found


def read_header(script: str, name: str) -> list[Given]:
    """The options of the script's header, parsed as sbatch parses them; an argument that is
    not an option is an error, as in sbatch ("Invalid directive")."""
    options: list[Given] = []
    for lineno, args in header_arguments(script, name):
        where = f"{name} line {lineno}"
        given, rest = parse(args, SBATCH_TABLE, where=where)
        if rest:
            raise InputError(f"{where}: {rest[0][:40]!r} is not an option")
        options += given
    return options


def replay_refusal(script: str) -> str | None:
    """Why a job's batch script may not be submitted again by the controller, or None: its
    header may hold only what ``icefrog submit`` writes there (PASS options and
    ``--open-mode=append``), so that a header can never ask for what the controller decides
    (GPUs, nodes, tasks, hold, memory per GPU...) beside the controller's own options."""
    try:
        options = read_header(script, "batch script")
        for option in options:
            refuse(option)
            check_value(option)
            if option.spec.kind is not Kind.PASS and option.spec.name != "open-mode":
                raise InputError(
                    f"--{option.spec.name} ({option.where}): not written by icefrog submit"
                )
    except InputError as exc:
        return str(exc)
    return None
