"""A real, throwaway Postgres server for the tests, and databases cloned from a template.

Postgres refuses to run as root, and CI runs the tests as root: then the server's data
folder is owned by the ``postgres`` user and initdb/pg_ctl run through ``runuser``. As any
other user they run directly. The server listens on 127.0.0.1 and a private socket folder,
with fsync off; it is stopped and deleted at the end of the session. Databases are made
with pytest-postgresql's ``DatabaseJanitor``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pytest_postgresql.janitor import DatabaseJanitor


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    user: str

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{dbname}"

    def janitor(self, dbname: str, template: str | None = None) -> DatabaseJanitor:
        return DatabaseJanitor(
            user=self.user,
            host=self.host,
            port=self.port,
            dbname=dbname,
            template_dbname=template,
        )


def pg_bin_dir() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, else the newest Debian install."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server() -> Iterator[PgServer]:
    bin_dir = pg_bin_dir()
    if bin_dir is None:
        raise RuntimeError(
            "Postgres is not installed (no initdb/pg_ctl): apt-get install postgresql"
        )
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    base = Path(tempfile.mkdtemp(prefix="icefrog-pg-"))
    data, sockets = base / "data", base / "sock"
    sockets.mkdir()
    if as_root:
        pw = pwd.getpwnam("postgres")
        for path in (base, sockets):
            os.chown(path, pw.pw_uid, pw.pw_gid)
    port = _free_port()
    user = "postgres" if as_root else pwd.getpwuid(os.geteuid()).pw_name

    def run(*args: str) -> None:
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=120)

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", user, "-A", "trust", "--no-sync")
        options = f"-F -p {port} -k {sockets} -c listen_addresses=127.0.0.1"
        log = base / "server.log"
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), "-w", "start")
        try:
            yield PgServer(host="127.0.0.1", port=port, user=user)
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(base, ignore_errors=True)
