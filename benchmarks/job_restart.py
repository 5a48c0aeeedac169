"""What a reallocation costs on the job side alone: stop (signal -> checkpoint written ->
exit 75) and restart (launch -> first training step from the checkpoint), for the demo's
models (examples/train_digits.py, MLP and CNN, per-GPU batch 32), under ``icefrog launch``
and real torchrun (gloo, CPU), without Slurm.

    .venv/bin/python -m benchmarks.job_restart
    .venv/bin/python -m benchmarks.job_restart --models mlp cnn --procs 1 2 --repeats 5 --steps 5

Each (model, processes) pair runs ``--repeats + 1`` times in a row in one work folder: a run
trains ``--steps`` steps after its first one, then gets USR1 (as Slurm's ``--signal``
sends the batch shell); the next run resumes from the checkpoint that left. Rank 0 records
wall-clock marks in its process (this script, run by torchrun as the training script,
wraps the example's main and the Trainer's methods); the parent records the launch, the
signal and the exit. Printed: the medians over the runs of

- stop: signal -> checkpoint started (the next step boundary), checkpoint write, checkpoint
  written -> ``icefrog launch`` exited;
- restart (runs that resumed): launch -> training script started (``icefrog launch``,
  torchrun, the interpreter), imports (torch, the project, the example and scikit-learn),
  set-up (the example's data and model; the Trainer: process group, layer FLOP count),
  restore (checkpoint read and loaded), restored -> first optimizer step done (decision,
  register report, loader, one step).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import REPO

EXAMPLE = REPO / "examples" / "train_digits.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")

STOP = ("to boundary", "checkpoint write", "to atexit", "teardown", "torchrun, launcher")
TOTALS = ("stop total", "restart total")
RESTART = ("process start", "imports", "set-up", "restore", "first step")


# -- the training script side (rank 0 records its marks) -----------------------------------
class Marks:
    """Wall-clock marks of this process, rewritten to ``path`` at each one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.marks: dict[str, float] = {}

    def __call__(self, name: str, last: bool = False) -> None:
        """Mark ``name`` now: its first time, or with ``last`` its latest."""
        if last:
            self.marks[name] = time.time()
        else:
            self.marks.setdefault(name, time.time())
        tmp = self.path.with_name(f".{self.path.name}")  # replaced whole: never read half
        tmp.write_text(json.dumps(self.marks))
        os.replace(tmp, self.path)


def worker(model: str, out: Path, steps: int, per_process: bool = False) -> None:
    """Train the example's model, recording the marks of rank 0 (in ``out/marks.json``, or
    with ``per_process`` in ``out/marks-<pid>.json``: one file a run of a requeued job)."""
    name = f"marks-{os.getpid()}.json" if per_process else "marks.json"
    mark = Marks(out / name) if os.environ.get("RANK", "0") == "0" else None
    if mark:
        mark.marks["pid"] = os.getpid()
        mark("started")
    import importlib.util

    import torch  # noqa: F401  # the import is part of what is timed

    from icefrog_launcher.trainer import Trainer

    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    if mark is None:
        sys.argv = [str(EXAMPLE), "--model", model]
        example.main()
        return
    mark("imported")
    atexit.register(mark, "atexit")  # late in the interpreter's last Python code
    wrap = _wrapper(mark, steps)
    for method in ("_restore", "_save", "_after_step", "_on_signal"):
        setattr(Trainer, method, wrap(method, getattr(Trainer, method)))
    sys.argv = [str(EXAMPLE), "--model", model]
    example.main()


def _wrapper(mark: Marks, steps: int) -> Any:
    done = [0]

    def wrap(name: str, inner: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            # the stop's checkpoint: a save that begins stopped (a signal that comes during
            # an epoch's save stops the job at the next save)
            stopping = name == "_save" and self._stop is not None
            if name == "_restore":
                mark("restore")
            elif name == "_on_signal":
                mark("signalled")  # the trainer's handler (USR1, or TERM from torchrun)
            elif stopping:
                mark("checkpoint")
            if name == "_save":
                mark("save", last=True)  # any checkpoint (an epoch's end too): the latest
            result = inner(self, *args, **kwargs)
            if name == "_save":
                mark("saved", last=True)
            if name == "_restore":
                mark("restored")
            elif stopping:
                mark("checkpointed")
            elif name == "_after_step":
                done[0] += 1
                if done[0] == 1:
                    mark("first step")
                elif done[0] == steps + 1:
                    mark("ready")  # the parent signals now
            return result

        return call

    return wrap


# -- the driver ------------------------------------------------------------------------
def one_run(model: str, procs: int, workdir: Path, steps: int) -> dict[str, float]:
    """Launch, wait for the ready mark, signal, watch rank 0's process and the launcher
    end; all marks."""
    out = workdir / "out"
    out.mkdir(exist_ok=True)
    (out / "marks.json").unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", SLURM_JOB_ID="1")
    cmd = [
        sys.executable, "-m", "icefrog_slurm", "launch", "--procs-per-node", str(procs),
        "--batch", "32", "--max-epochs", "1000", "--workdir", str(workdir),
        "--inbox", str(workdir / "inbox"), "--torchrun", str(TORCHRUN),
        "--", str(Path(__file__)), "--worker", "--model", model, "--out", str(out),
        "--steps", str(steps),
    ]  # fmt: skip
    marks: dict[str, float] = {"launch": time.time()}
    with (workdir / "stderr").open("w+") as err:
        proc = subprocess.Popen(cmd, env=env, stderr=err)
        deadline = time.monotonic() + 300
        while "ready" not in _read(out) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        if "ready" not in _read(out):
            proc.kill()
            proc.wait()
            err.seek(0)
            raise SystemExit(f"no step boundary reached ({proc.returncode}):\n{err.read()[-3000:]}")
        pid = int(_read(out)["pid"])
        marks["signal"] = time.time()
        proc.send_signal(signal.SIGUSR1)
        while proc.poll() is None and time.monotonic() < deadline:
            if "gone" not in marks and not _alive(pid):
                marks["gone"] = time.time()
            time.sleep(0.005)
        marks["exit"] = time.time()
        if proc.returncode != 75:
            proc.kill()
            err.seek(0)
            raise SystemExit(f"run failed ({proc.returncode}):\n{err.read()[-3000:]}")
    return marks | _read(out)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _read(out: Path) -> dict[str, float]:
    try:
        marks: dict[str, float] = json.loads((out / "marks.json").read_text())
    except (OSError, ValueError):
        return {}
    return marks


def split(marks: dict[str, float]) -> dict[str, float]:
    m = marks
    return {
        "stop total": m["exit"] - m["signal"],
        "restart total": m["first step"] - m["launch"],
        "to boundary": m["checkpoint"] - m["signal"],
        "checkpoint write": m["checkpointed"] - m["checkpoint"],
        "to atexit": m["atexit"] - m["checkpointed"],
        "teardown": m["gone"] - m["atexit"],
        "torchrun, launcher": m["exit"] - m["gone"],
        "process start": m["started"] - m["launch"],
        "imports": m["imported"] - m["started"],
        "set-up": m["restore"] - m["imported"],
        "restore": m["restored"] - m["restore"],
        "first step": m["first step"] - m["restored"],
    }


def measure(model: str, procs: int, repeats: int, steps: int) -> dict[str, list[float]]:
    parts: dict[str, list[float]] = {name: [] for name in (*STOP, *RESTART, *TOTALS)}
    with tempfile.TemporaryDirectory() as folder:
        for run in range(repeats + 1):
            times = split(one_run(model, procs, Path(folder), steps))
            for name in (*STOP, "stop total"):
                parts[name].append(times[name])
            if run:  # run 0 started without a checkpoint
                for name in (*RESTART, "restart total"):
                    parts[name].append(times[name])
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=("mlp", "cnn"), default=["mlp", "cnn"])
    parser.add_argument("--procs", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--per-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model, args.out, args.steps, args.per_process)
        return
    print(
        f"median seconds over {args.repeats + 1} stops and {args.repeats} restarts; "
        f"{args.steps} steps between a start and its signal; per-GPU batch 32"
    )
    header = ["model", "procs", *STOP, "stop total", *RESTART, "restart total"]
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    for model in args.models:
        for procs in args.procs:
            parts = measure(model, procs, args.repeats, args.steps)
            med = {name: statistics.median(v) for name, v in parts.items()}
            cells = [med[n] for n in header[2:]]
            print(f"| {model} | {procs} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
