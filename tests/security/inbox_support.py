"""A real report inbox for the attack tests: folders and files owned by the real test users,
credentials made as them by real munge, a real store, and a stand-in for Slurm's batched
poll (a table of job id -> owner uid and icefrog tag) where the test needs no real job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import pwd
import subprocess
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icefrog_slurm import security
from icefrog_slurm.domain.records import JobRecord
from icefrog_slurm.protocol import Envelope
from icefrog_slurm.store.inbox import DrainResult, ReportInbox, SlurmJobFacts
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import spec

METRIC = {"epoch": 1, "name": "val_acc", "value": 0.5}


def spec_payload() -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(spec())))


@dataclass
class SlurmTable:
    """Slurm's batched poll, played: job id -> (owner uid, icefrog tag); counts the calls."""

    jobs: dict[str, tuple[int, bool]] = field(default_factory=dict)
    calls: list[set[str]] = field(default_factory=list)
    down: bool = False

    def __call__(self, ids: Collection[str]) -> dict[str, SlurmJobFacts]:
        self.calls.append(set(ids))
        if self.down:
            raise OSError("slurmctld: connection refused")
        return {i: SlurmJobFacts(*self.jobs[i]) for i in ids if i in self.jobs}


@dataclass
class Site:
    """An inbox, its archive and its store, with the two test users' uids."""

    inbox: ReportInbox
    root: Path
    uids: dict[str, int]
    slurm: SlurmTable
    socket: str | None = None

    @property
    def inbox_dir(self) -> Path:
        return self.root / "inbox"

    def envelope(
        self, user: str, kind: str, payload: dict[str, Any], *, seq: int, job: str, name: str
    ) -> Envelope:
        env = Envelope(1, kind, job, name, seq, 1000.0 + seq, payload)
        return security.sign(env, run_as=user, socket=self.socket)

    def drop(
        self,
        user: str,
        kind: str,
        payload: dict[str, Any],
        *,
        job: str,
        seq: int = 0,
        name: str = "cnn",
        folder: str | bytes | None = None,
        file: str | bytes | None = None,
        raw: bytes | None = None,
    ) -> Path | bytes:
        """Write a report as ``user`` would: credential made as that user, the file (and the
        folder, when this makes it) owned by them. ``raw`` replaces the document."""
        if raw is None:
            raw = self.envelope(user, kind, payload, seq=seq, job=job, name=name).to_json().encode()
        return self.put(user, folder or job, file or f"{seq}-{kind}.json", raw)

    def put(self, user: str, folder: str | bytes, file: str | bytes, raw: bytes) -> Path | bytes:
        """Write ``raw`` as ``folder/file`` of the inbox, owned by ``user`` (names may be bytes
        that are not UTF-8)."""
        base = os.fsencode(self.inbox_dir)
        where = os.path.join(base, os.fsencode(folder))
        if not os.path.lexists(where):  # the first writer makes the folder and owns it
            os.mkdir(where, 0o700)
            os.chown(where, self.uids[user], -1)
        path = os.path.join(where, os.fsencode(file))
        with open(path, "wb") as fh:
            fh.write(raw)
        os.chown(path, self.uids[user], -1)
        return (
            Path(os.fsdecode(path)) if isinstance(folder, str) and isinstance(file, str) else path
        )

    def register(self, user: str, job: str, *, name: str = "cnn") -> None:
        self.slurm.jobs.setdefault(job, (self.uids[user], True))
        self.drop(user, "register", spec_payload(), job=job, name=name)

    def drain(self) -> DrainResult:
        return self.inbox.drain()

    def reasons(self) -> list[str]:
        with self.inbox.store.transaction() as tx:
            return [r.reason for r in tx.rejected_reports()]

    def rejected_files(self) -> list[str]:
        with self.inbox.store.transaction() as tx:
            return [r.file for r in tx.rejected_reports()]

    def job(self, slurm_job_id: str) -> JobRecord | None:
        with self.inbox.store.transaction() as tx:
            return tx.job_by_slurm_id(slurm_job_id)

    def metrics(self, slurm_job_id: str) -> list[float]:
        job = self.job(slurm_job_id)
        assert job is not None
        views = [v for v in self.inbox.store.snapshot().jobs if v.job.id == job.id]
        return [m.value for v in views for m in v.metrics]

    def left_in_inbox(self) -> list[str]:
        """Every file still in the inbox (folders may stay, empty)."""
        out = []
        for top, _dirs, names in os.walk(os.fsencode(self.inbox_dir)):
            out += [os.fsdecode(os.path.join(top, n)) for n in names]
        return sorted(out)

    def archived(self, outcome: str) -> int:
        """Entries moved to ``archive/<outcome>/<folder>/`` (a junk folder counts once)."""
        base = self.root / "archive" / outcome
        return sum(len(os.listdir(folder)) for folder in base.iterdir())


def as_user(user: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a forked child that is ``user`` (uid, gid, no other group): the job
    side's own code, acting as that user. Its result, or its exception, comes back."""
    entry = pwd.getpwnam(user)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the user, run, report, leave without cleanup
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            try:
                result: tuple[bool, Any] = (True, fn())
            except Exception as exc:
                result = (False, exc)
            os.write(write, pickle.dumps(result))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value


def make_site(store: SqlStore, root: Path, uids: dict[str, int], **options: Any) -> Site:
    """A prepared inbox under ``root`` (which every user can traverse)."""
    root.chmod(0o755)
    slurm = SlurmTable()
    socket = options.pop("munge_socket", None)
    inbox = ReportInbox(
        store=store,
        inbox_dir=root / "inbox",
        archive_dir=root / "archive",
        slurm_jobs=slurm,
        munge_socket=socket,
        **{"clock": lambda: 5000.0, **options},
    )
    inbox.prepare()
    return Site(inbox, root, uids, slurm, socket)


@contextmanager
def site_in_tmp(
    store: SqlStore, uids: dict[str, int], prefix: str, **options: Any
) -> Iterator[Site]:
    """:func:`make_site` under a fresh folder of /tmp that every user can reach (pytest's
    tmp_path lies under /root), removed afterwards (by ``rm -r``: a test's tree may be
    nested deeper than ``shutil.rmtree`` can recurse)."""
    root = Path(f"/tmp/{prefix}-{uuid.uuid4().hex[:8]}")
    root.mkdir()
    try:
        yield make_site(store, root, uids, **options)
    finally:
        subprocess.run(["rm", "-rf", "--", str(root)], check=False)
