"""A report inbox over a SQLite store with stand-ins for munge and Slurm, for tests that
need no real munged: every Slurm job id is an icefrog job of one uid (this process's unless
told), and a report's credential is its body's digest (what :func:`signed` writes), which
the stand-in decodes as signed by that uid."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from icefrog_slurm.protocol import Envelope, body_digest
from icefrog_slurm.security import DecodedCredential
from icefrog_slurm.store import migrate
from icefrog_slurm.store.inbox import ReportInbox, SlurmJobFacts
from icefrog_slurm.store.sql import SqlStore


def signed(sid: str, kind: str, seq: int, payload: dict[str, Any]) -> str:
    """A report of Slurm job ``sid`` (job name ``cnn``) as the stand-in munge takes it."""
    env = Envelope(1, kind, sid, "cnn", seq, 1000.0 + seq, payload)
    return replace(env, credential=body_digest(env.body())).to_json()


@contextmanager
def trusting_inbox(
    tmp_path: Path, *, owner: int | None = None, **limits: Any
) -> Iterator[ReportInbox]:
    """The inbox ``tmp_path/inbox`` (archive ``tmp_path/archive``), prepared, over the store
    ``tmp_path/icefrog.db``; every job is ``owner``'s (default: this process's uid);
    ``limits``: ReportInbox's (``max_reports``...)."""
    uid = os.getuid() if owner is None else owner
    url = f"sqlite:///{tmp_path / 'icefrog.db'}"
    migrate.upgrade(url)
    store = SqlStore(url)
    box = ReportInbox(
        store=store,
        inbox_dir=tmp_path / "inbox",
        archive_dir=tmp_path / "archive",
        slurm_jobs=lambda ids: {i: SlurmJobFacts(uid=uid, icefrog=True) for i in ids},
        decode=lambda cred: DecodedCredential(status=0, uid=uid, gid=0, payload=cred),
        clock=lambda: 5000.0,
        **limits,
    )
    box.prepare()
    try:
        yield box
    finally:
        store.close()
