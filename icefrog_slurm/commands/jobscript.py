"""The batch script ``icefrog submit`` writes for a job (pure but for reading the user's
script): the launcher in the background with USR1/TERM passed on, the job's environment
as ``export`` lines (sbatch's ``--export`` rules), and a submitted batch script's body with
the ``icefrog`` shell function its ``icefrog launch -- SCRIPT ARGS`` line calls.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from icefrog_slurm.errors import InputError

_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FUNCTION = re.compile(r"^BASH_FUNC_([A-Za-z_][A-Za-z0-9_]*)%%$")
"""How bash passes an exported function (``export -f NAME``) to its children; as Lmod
exports ``module`` and sbatch's ``--export=ALL`` gives it to the job."""
MAX_SCRIPT_BYTES = 4 * 1024 * 1024
"""sbatch's default largest batch script (slurm.conf max_script_size)."""
NOT_RECORDED = ("PWD", "OLDPWD", "SHLVL", "_")
"""Variables of the shell, not of the job; SLURM_* and SBATCH_* are Slurm's own."""
PER_RUN = (
    "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ZE_AFFINITY_MASK",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
)  # fmt: skip
"""What Slurm sets for each run from the GPUs, shards or MPS share it gives the job: never
recorded, also when named (an ``export`` line would override Slurm's in every run; under
sbatch, Slurm's own wins)."""

_MANAGED = (
    "export ICEFROG_MANAGED=1  # for the launcher (its MANAGED_ENV): no unmanaged notice\n"
    "# an icefrog launch started here other than by the launch line below refuses to run\n"
    "export ICEFROG_SUBMIT_SCRIPT=1\n"
)
_OWN = "ICEFROG_SUBMIT_SCRIPT= "
"""Before the declared launcher: the launcher's SUBMIT_SCRIPT_ENV, emptied for it alone."""


def _trap(signal: str, before: str, after: str) -> str:
    """The trap passing ``signal`` on to the launcher while it runs; ``before`` it started
    and ``after`` it ended, the commands run instead."""
    return (
        f'trap \'if [ -n "$pid" ]; then kill -{signal} "$pid" 2>/dev/null || :; '
        f'elif [ -n "$launched" ]; then {after}; else {before}; fi\' {signal}\n'
    )


def _ends(said: str, code: int) -> str:
    """The commands ending the job with ``code``, saying why on stderr."""
    return f'echo "icefrog: {said}" >&2; exit {code}'


_FORWARD = (
    "# USR1/TERM go to the launcher, which makes the trainers checkpoint and exit; before\n"
    "# the launcher started (nothing trained since the last checkpoint) a USR1 ends the job\n"
    "# with 75 at once (requeue it), a TERM with 143 (as bash would without the trap); after\n"
    "# it ended (the script goes on) a USR1 has nothing to checkpoint, a TERM ends the job.\n"
    "pid=\nlaunched=\n"
    + _trap(
        "USR1",
        _ends("asked to checkpoint before the launch: exit 75 (requeue)", 75),
        'echo "icefrog: asked to checkpoint after the launch ended: nothing to checkpoint" >&2',
    )
    + _trap(
        "TERM",
        _ends("terminated before the launch: exit 143", 143),
        _ends("terminated after the launch: exit 143", 143),
    )
)
_SUBSHELL = (
    "icefrog launch: write it as a command of the batch script itself, not in a pipeline, "
    "\\$(...), ( ) or with &: Slurm's and the controller's signals reach the batch shell "
    "alone; for a log, redirect it: icefrog launch -- SCRIPT ARGS > >(tee train.log) 2>&1"
)
"""Why a launch line run in a subshell is refused (the job ends with exit 2)."""
_WAIT = (
    "# wait returns early when a trap runs: wait again until the launcher is gone\n"
    'while kill -0 "$pid" 2>/dev/null; do wait "$pid" || :; done\n'
)


def batch_script(
    *,
    launch: list[str],
    env: Mapping[str, str],
    header: str = "",
    body: str | None = None,
    rundir: str | None = None,
    args: Sequence[str] = (),
    shell: str = "",
) -> str:
    """The batch script: ``launch`` (an ``icefrog launch`` argv) in the background, signals
    passed on, and the launcher's exit status as the job's (75: checkpointed, requeue me).
    Any other ``icefrog launch`` started in it (``exec icefrog launch``, ``srun icefrog
    launch``...) refuses to run: it would run with none of the job's declaration (one
    GPU, no inbox, checkpoints in the current folder). The script exports
    ``ICEFROG_SUBMIT_SCRIPT=1`` and empties it on its own launch line alone.
    With a ``body`` (a batch script's, run in ``rundir`` with its arguments ``args`` as
    ``$1``...), ``launch`` ends with ``--`` and the body's ``icefrog launch -- SCRIPT
    ARGS`` line runs it with SCRIPT ARGS the same way; a 75 there ends the job at once
    with 75, whatever the body does next (Slurm takes the job's status from the batch
    shell's exit: a body that went on to exit 0 would be recorded finished). A launch
    line with options, or run in a subshell (``| tee``, ``$(...)``, ``&``: the batch
    shell waits in the foreground, its traps run only after, and the launcher never gets
    the signals) ends the job with 2 and why; from a subshell through USR2 to the batch
    shell, whose trap exits. ``shell``: the options of the batch script's ``#!`` line
    (:func:`shell_options`), ``l`` on the wrapper's own (a login shell), the others set
    for the body.
    Its output file is appended to (``--open-mode=append``): a requeued job's runs share
    one Slurm job id, hence one file, and Slurm would otherwise write each run over it."""
    exports = "".join(_export(k, v) for k, v in env.items())
    shebang = "#!/bin/bash -l" if "l" in shell else "#!/bin/bash"
    head = f"{shebang}\n#SBATCH --open-mode=append\n{header}{exports}{_MANAGED}{_FORWARD}"
    options = shell.replace("l", "")
    if body is None:
        return f'{head}{_OWN}{shlex.join(launch)} &\npid=$!\n{_WAIT}wait "$pid"\nexit $?\n'
    indented = "".join("    " + line + "\n" for line in _WAIT.splitlines())
    return (
        f"{head}"
        "# the body's `icefrog launch -- SCRIPT ARGS`: the declared launcher, signals passed on\n"
        "trap 'exit 2' USR2  # a launch refused in a subshell ends the job (it cannot exit it)\n"
        "exec {icefrog_stderr}>&2  # the job's stderr: that refusal is never lost in a pipe\n"
        "icefrog() {\n"
        '    if [ "${1-}" != launch ]; then command icefrog "$@"; return; fi\n'
        '    if [ "$BASHPID" != "$$" ]; then\n'
        f'        echo "{_SUBSHELL}" >&"$icefrog_stderr"\n'
        "        kill -USR2 $$\n"
        "        exit 2\n"
        "    fi\n"
        '    if [ "${2-}" != -- ]; then\n'
        "        echo \"icefrog launch: write 'icefrog launch -- SCRIPT ARGS' here; "
        'give its options to icefrog submit" >&2\n'
        "        exit 2\n"
        "    fi\n"
        "    shift 2\n"
        f'    {_OWN}{shlex.join(launch)} "$@" &\n'
        "    pid=$!\n"
        f"{indented}"
        "    local status=0\n"
        '    wait "$pid" || status=$?\n'
        "    pid= launched=1  # its pid may be another process's from now on\n"
        "    # 75 (checkpointed, requeue me) ends the job at once, whatever the body does next\n"
        '    [ "$status" -ne 75 ] || exit 75\n'
        '    return "$status"\n'
        "}\n"
        f"cd {shlex.quote(rundir or '.')} || exit 1\n"
        f"set -- {shlex.join(args)}\n"
        f"{f'set -{options}{chr(10)}' if options else ''}"
        "# ---- the submitted batch script's body ----\n"
        f"{body if body.endswith(chr(10)) or not body else body + chr(10)}"
    )


def _export(name: str, value: str) -> str:
    """The line(s) that give the job ``name``: an ``export`` line, or for an exported bash
    function (:data:`_FUNCTION`, its value ``() {...}``) its definition and ``export -f``."""
    function = _FUNCTION.fullmatch(name)
    if function is None:
        return f"export {name}={shlex.quote(value)}\n"
    return f"{function[1]}{value.rstrip(chr(10))}\nexport -f {function[1]}\n"


def job_environment(export: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the job gets, from ``environ`` as sbatch's ``--export`` says: ALL (the
    default: every variable but the shell's and Slurm's own, and the exported bash
    functions whose name is a plain word, ``module`` say), NONE, or a comma list of
    NAME (its value here) and NAME=VALUE, with ALL first to add to everything (a value
    here wins over one given, as in sbatch). Never the GPU variables of :data:`PER_RUN`."""
    items = (export or "ALL").split(",")
    everything = items[0].upper() == "ALL"
    if items[0].upper() in ("ALL", "NONE"):
        if items[0].upper() == "NONE" and len(items) > 1:
            raise InputError("--export: NONE takes no variables")
        items = items[1:]
    env = {k: v for k, v in environ.items() if _recorded(k, v)} if everything else {}
    for item in items:
        name, eq, value = item.partition("=")
        if not _VARIABLE.fullmatch(name):
            raise InputError(f"--export: {name[:40]!r} is not a variable name")
        if eq and not (everything and name in env):
            env[name] = value
        elif not eq and name in environ:
            env[name] = environ[name]
    return {k: v for k, v in env.items() if k not in PER_RUN}


def _recorded(name: str, value: str) -> bool:
    function = _FUNCTION.fullmatch(name)
    if function:  # not an icefrog function: the wrapper's own would be exported in its place
        return value.startswith("() {") and function[1] != "icefrog"
    return (
        bool(_VARIABLE.fullmatch(name))
        and name not in NOT_RECORDED
        and not name.startswith(("SLURM_", "SBATCH_"))
    )


def launcher_env(recorded: Mapping[str, str]) -> dict[str, str]:
    """The recorded variables, PATH with this Python's bin folder first (icefrog, torchrun),
    and PYTHONPATH if set here."""
    env = dict(recorded)
    path = recorded.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
    env["PATH"] = f"{Path(sys.executable).parent}:{path}"
    if os.environ.get("PYTHONPATH") and "PYTHONPATH" not in env:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def read_script(path: Path) -> str:
    """A script to submit: UTF-8 text without NUL or DOS line breaks, at most 4 MB (what
    sbatch takes)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise InputError(f"{path}: larger than {MAX_SCRIPT_BYTES // 1024 // 1024} MB")
    if b"\0" in data:
        raise InputError(f"{path}: holds a NUL byte")
    if b"\r\n" in data:
        raise InputError(f"{path}: has DOS line breaks (\\r\\n): convert it (dos2unix)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None


def shell_options(path: Path, text: str) -> str | None:
    """None for a Python training script (``.py``, or ``#!`` naming python); for a bash batch
    script (``#!`` naming bash or sh, also through ``env``) the options of its ``#!`` line
    the wrapper keeps, as letters: ``l`` (``-l``/``--login``: a login shell, which defines
    ``module``), ``e``, ``u``, ``x`` (the wrapper's lines work under them). Another option,
    or another interpreter, is refused."""
    first = text.split("\n", 1)[0]
    words = first[2:].split() if first.startswith("#!") else []
    names = [Path(w).name for w in words[:2]]
    if path.suffix == ".py" or any(n.startswith("python") for n in names):
        return None
    if not any(n in ("bash", "sh") for n in names):
        raise InputError(
            f"{path}: neither a Python script (.py, or #! python) nor a batch script (#!/bin/bash)"
        )
    kept: set[str] = set()
    for option in words[2:] if names[0] == "env" else words[1:]:
        if option != "--login" and not re.fullmatch(r"-[leux]+", option):
            raise InputError(
                f"{path} line 1: the shell option {option[:40]!r} is not kept: icefrog's "
                "wrapper runs the body with -l/--login, -e, -u and -x alone (give others with "
                "set in the script)"
            )
        kept.update("l" if option == "--login" else option[1:])
    return "".join(sorted(kept))
