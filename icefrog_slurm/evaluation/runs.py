"""Runs of ``icefrog simulate`` and the resumable runner that makes them.

Every simulation is one ``icefrog simulate`` process of one policy writing
``OUT/runs/KEY/summary.json``; KEY is a readable label plus a hash of the simulate arguments,
so a run whose summary.json exists is not rerun (RESUMABLE: rerun the same command after an
interruption; a changed flag makes new runs). A run is written to ``KEY.tmp`` and renamed when
it succeeded, so a killed run leaves no summary. ``run.json`` beside it records the command,
the git commit and the wall time. Up to ``jobs`` runs go at once. A run or a trace is made
holding ``OUT/.locks/NAME.lock``, so two commands on one ``--out`` do not undo each other's
(the second waits, then reuses). Philly workloads come from ``icefrog trace sample``
(``OUT/traces``, with the seed and the mapping in the JSON sidecar).

A run is reused only when made from the same input bytes: a trace sampled from a ``--philly``
file is named with the start of that file's sha256 (the packaged trace's names carry none),
and a workload file's run key hashes the file's sha256 with its folder and name. A run of a
workload file made before its key held the sha256 is still found under the older key when
its summary.json records that same sha256.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import icefrog_slurm
from icefrog_slurm.errors import InputError
from icefrog_slurm.sim.trace import packaged_philly

PACKAGE_PARENT = Path(icefrog_slurm.__file__).resolve().parent.parent
"""The folder holding the ``icefrog_slurm`` package: the repository in a source checkout."""


def source_checkout() -> Path | None:
    """The repository this package runs from, or None when it is installed elsewhere."""
    return PACKAGE_PARENT if (PACKAGE_PARENT / "pyproject.toml").is_file() else None


def repo_pollux() -> Path | None:
    """The repository's copy of the Pollux data (``data/pollux``), when there is one."""
    root = source_checkout()
    return root / "data" / "pollux" if root and (root / "data" / "pollux").is_dir() else None


@dataclass(frozen=True)
class Trace:
    """A Philly workload sampled by ``icefrog trace sample`` from ``philly`` (None: the
    trace the package ships)."""

    load: float
    seed: int
    base_jobs: int
    tasks: str
    philly: Path | None = None

    @property
    def name(self) -> str:
        tag = f"-t{_hash(self.tasks)}" if self.tasks else ""
        if self.philly is not None:  # another source, other jobs: the bytes name it
            tag += f"-p{file_sha256(self.philly)[:12]}"
        return f"philly-load{self.load:g}-seed{self.seed}-jobs{self.base_jobs}{tag}"


GPUS_PER_NODE = 4
"""The nodes of every simulated cluster (``--gpus-per-node``)."""


@dataclass(frozen=True)
class Run:
    """One ``icefrog simulate`` of one policy."""

    label: str
    workload: Trace | Path
    policy: str
    gpus: int
    seed: int
    extra: tuple[str, ...] = ()

    def argv(self, workload: Path) -> list[str]:
        return [
            "simulate", "--workload", str(workload), "--gpus", str(self.gpus),
            "--gpus-per-node", str(GPUS_PER_NODE), "--policy", self.policy,
            "--seed", str(self.seed), *self.extra,
        ]  # fmt: skip

    @property
    def key(self) -> str:
        """The label and a hash of the arguments, the workload named as the data names it: a
        Philly trace by its name (which holds its source's sha256 when not the packaged
        trace), a workload file by its folder, name and sha256 (so a run made from another
        checkout of the same bytes is reused, and one made from other bytes is not)."""
        w = self.workload
        if isinstance(w, Trace):
            return self._key(w.name)
        return self._key(f"{w.parent.name}/{w.name}@{file_sha256(w)}")

    @property
    def legacy_key(self) -> str | None:
        """The key a workload file's run had before the key held the file's sha256 (folder
        and name alone); None for a Philly trace, whose key did not change."""
        w = self.workload
        return None if isinstance(w, Trace) else self._key(f"{w.parent.name}/{w.name}")

    def _key(self, workload: str) -> str:
        """The label and a hash of the arguments with the workload named ``workload``."""
        return f"{self.label}-{_hash(' '.join(self.argv(Path(workload))))}"


@dataclass
class Runner:
    """Generates traces and runs simulations that have no summary yet (module docstring)."""

    out: Path
    jobs: int
    run_missing: bool = True  # False: tables from the runs that exist (--no-run)
    log: Callable[[str], None] = field(default=lambda m: _stderr(m))
    check: Callable[[Sequence[Run]], None] | None = None  # the runs to do, once sampled
    ran: int = 0
    reused: int = 0
    failed: list[str] = field(default_factory=list)
    commits: set[str] = field(default_factory=set)

    def trace_path(self, trace: Trace) -> Path:
        return self.out / "traces" / f"{trace.name}.csv"

    def folder(self, run: Run) -> Path | None:
        """The folder of ``run``'s finished run: under its key, else (a workload file's run
        made before the key held the file's sha256) under its older key when that run's
        summary.json records the same sha256; None when there is none."""
        final = self.out / "runs" / run.key
        if (final / "summary.json").is_file():
            return final
        if run.legacy_key is None or not isinstance(run.workload, Path):
            return None
        old = self.out / "runs" / run.legacy_key
        try:
            made_from = json.loads((old / "summary.json").read_text())["run"]["workload"]["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return old if made_from == file_sha256(run.workload) != "" else None

    def summary(self, run: Run) -> dict[str, Any] | None:
        folder = self.folder(run)
        if folder is None:
            return None
        doc: dict[str, Any] = json.loads((folder / "summary.json").read_text())
        return doc

    def ensure(self, runs: Sequence[Run]) -> dict[str, dict[str, Any] | None]:
        """Run what is missing (up to ``jobs`` at once); the summaries by run key."""
        unique = list({r.key: r for r in runs}.values())
        if not self.run_missing:
            found = {r.key: self.summary(r) for r in unique}
            self._note_commits([r for r in unique if found[r.key] is not None])
            self.reused += sum(d is not None for d in found.values())
            missing = sum(d is None for d in found.values())
            if missing:
                self.log(f"--no-run: {missing} run(s) missing, shown as -")
            return found
        for trace in sorted({r.workload for r in unique if isinstance(r.workload, Trace)},
                            key=lambda t: t.name):  # fmt: skip
            self._sample(trace)
        todo = [r for r in unique if self.summary(r) is None]
        if todo and self.check is not None:  # refuse a run that could not go before any goes
            self.check(todo)
        done = [r for r in unique if r not in todo]
        self.reused += len(done)
        self._note_commits(done)
        if todo:
            self.log(f"{len(todo)} run(s) to do, {len(unique) - len(todo)} done already, "
                     f"{self.jobs} at once")  # fmt: skip
            with ThreadPoolExecutor(max_workers=max(self.jobs, 1)) as pool:
                list(pool.map(self._simulate, todo))
        return {r.key: self.summary(r) for r in unique}

    def _note_commits(self, runs: Sequence[Run]) -> None:
        for r in runs:
            folder = self.folder(r)
            meta = (folder or self.out / "runs" / r.key) / "run.json"
            if meta.is_file():
                self.commits.add(json.loads(meta.read_text()).get("commit", "?"))

    def _sample(self, trace: Trace) -> None:
        with self._lock(f"trace-{trace.name}"):
            self._sample_unlocked(trace)

    def _sample_unlocked(self, trace: Trace) -> None:
        csv = self.trace_path(trace)
        sidecar = csv.with_suffix(".json")
        if sidecar.is_file():
            source = json.loads(sidecar.read_text()).get("philly_sha256")
            if source is None or source == _source_sha256(trace):  # older sidecars: no hash
                return
            raise InputError(
                f"{sidecar}: sampled from a Philly trace of sha256 {source}, not from the "
                f"{'--philly file' if trace.philly else 'packaged trace'} given now "
                f"({_source_sha256(trace)}); use another --out"
            )
        csv.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            "trace", "sample", "--load", f"{trace.load:g}",
            "--seed", str(trace.seed), "--jobs", str(trace.base_jobs), "--out", str(csv),
        ]  # fmt: skip
        if trace.tasks:
            argv += ["--tasks", trace.tasks]
        if trace.philly is not None:
            argv += ["--philly", str(trace.philly)]
        self.log(f"sampling {csv.name}")
        proc = _icefrog(argv)
        if proc.returncode != 0:
            raise SystemExit(f"icefrog {' '.join(argv)} failed:\n{proc.stderr}")

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        """Hold ``OUT/.locks/NAME.lock`` (flock, exclusive): another command on the same
        ``--out`` waits rather than delete a run or trace this one is making. The lock goes
        with the process, so a killed command leaves none held."""
        folder = self.out / ".locks"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{name}.lock", "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.log(f"waiting for {name}: another command is making it")
                fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _simulate(self, run: Run) -> None:
        with self._lock(run.key):
            if self.folder(run) is not None:  # another command made it meanwhile
                self.reused += 1
                self._note_commits([run])
                return
            self._simulate_unlocked(run)

    def _simulate_unlocked(self, run: Run) -> None:
        final = self.out / "runs" / run.key
        tmp = final.with_name(run.key + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        workload = (
            self.trace_path(run.workload) if isinstance(run.workload, Trace) else run.workload
        )
        argv = [*run.argv(workload), "--out", str(tmp), "--quiet"]
        commit = source_commit()  # the code the run starts with
        self.log(f"start {run.key}")
        started = time.perf_counter()
        proc = _icefrog(argv)
        wall = time.perf_counter() - started
        (tmp / "log.txt").write_text(proc.stdout + proc.stderr)
        meta = {"argv": ["icefrog", *argv], "commit": commit, "wall_s": wall,
                "returncode": proc.returncode}  # fmt: skip
        (tmp / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
        if proc.returncode != 0 or not (tmp / "summary.json").is_file():
            self.failed.append(run.key)
            self.log(f"FAILED {run.key} (rc {proc.returncode}); see {tmp / 'log.txt'}")
            return
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self.ran += 1
        self.commits.add(commit)
        self.log(f"done  {run.key} in {wall:.0f} s")


def _stderr(message: str) -> None:
    sys.stderr.write(message + "\n")  # one write: lines of parallel runs do not mix
    sys.stderr.flush()


def _icefrog(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """``icefrog ARGV`` in a child process that imports this very package: ``-P`` keeps
    ``-m`` from putting the current folder first on its path, where another checkout's
    ``icefrog_slurm`` would run while ``run.json`` names this one's commit."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_PARENT), env.get("PYTHONPATH")) if p
    )
    return subprocess.run(
        [sys.executable, "-P", "-m", "icefrog_slurm", *argv],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def source_commit() -> str:
    """``git describe --always --dirty`` of the source checkout, ``?`` outside one or
    where git is missing."""
    root = source_checkout()
    if root is None:
        return "?"
    try:
        proc = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root,
                              capture_output=True, text=True, check=False)  # fmt: skip
    except OSError:
        return "?"
    return proc.stdout.strip() or "?"


def sha256_of(path: Path) -> str:
    """The sha256 (hex) of the file's bytes, read now (OSError when it cannot be read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """:func:`sha256_of`, read once a process (an evaluation names its inputs by what they
    held when it started); "" when it cannot be read (the run that needs it then fails,
    naming the file)."""
    return _file_sha256(str(Path(path).resolve()))


@functools.cache
def _file_sha256(path: str) -> str:
    try:
        return sha256_of(Path(path))
    except OSError:
        return ""


def _source_sha256(trace: Trace) -> str:
    """The sha256 of the Philly trace ``trace`` is sampled from."""
    return file_sha256(trace.philly if trace.philly is not None else packaged_philly())


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]
