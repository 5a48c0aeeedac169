"""A Slurm cluster with accounting (slurmdbd + a private MariaDB) beside the shared one, and
real jobs run to their end on it, mirrored into an icefrog store.

``acct_cluster`` (a session): ``cluster.sh up --accounting`` in its own folder
(``var/cluster-acct``) and ports (slurmctld 16847, slurmd 17031-17034, slurmdbd 16848,
MariaDB 16849; ``ICEFROG_TEST_ACCT_*`` override them), installing slurmdbd and
mariadb-server when missing; it fails, with cluster.sh's output and the daemons' logs, when
it cannot come up; it is brought down at the end only if this session started it.
``acct_jobs``: seven jobs run to their end (completed, failed with exit code 3, cancelled
while running, a long name, an account, on two nodes, one of icefrog-alice), their sacct
records, and an SQLite icefrog store holding one icefrog job each with the same name,
owner, Slurm job id, state and times.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from icefrog_slurm.domain.records import Allocation
from icefrog_slurm.protocol import FinishedReport
from icefrog_slurm.slurm.parse import expand_hostlist
from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import SqlStore
from tests.integration.store.helpers import spec
from tests.support.munge import ensure_users

REPO = Path(__file__).resolve().parents[3]
CLUSTER_SH = REPO / "slurm_conf" / "dev" / "cluster.sh"
ACCT_DIR = Path(os.environ.get("ICEFROG_TEST_ACCT_DIR", REPO / "var" / "cluster-acct"))
CTLD_PORT = int(os.environ.get("ICEFROG_TEST_ACCT_CTLD_PORT", "16847"))
NODE_PORT = int(os.environ.get("ICEFROG_TEST_ACCT_NODE_PORT", "17031"))
CONF = ACCT_DIR / "etc" / "slurm.conf"
FIELDS = "JobID,JobName,User,UID,State,Submit,Start,End,Elapsed,Partition,NodeList,Account"


def acct_env(**extra: str) -> dict[str, str]:
    """The environment of the accounting cluster's Slurm commands."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SACCT_"))}
    env.update(
        SLURM_CONF=str(CONF),
        ICEFROG_CLUSTER_DIR=str(ACCT_DIR),
        ICEFROG_CLUSTER_CTLD_PORT=str(CTLD_PORT),
        ICEFROG_CLUSTER_NODE_PORT=str(NODE_PORT),
        ICEFROG_CLUSTER_ACCOUNTING="1",
        ICEFROG_SLURM="host",
    )
    env.update(extra)
    return env


def slurm(*argv: str, **extra: str) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=acct_env(**extra), check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _cluster_sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        capture_output=True,
        text=True,
        timeout=400,
        env=acct_env(),
        check=False,
    )


def _logs() -> str:
    parts = []
    for name in ("mariadb.log", "mariadb-install.log", "slurmdbd.log", "slurmctld.log"):
        path = ACCT_DIR / "log" / name
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {path} (end) ---\n" + "\n".join(tail))
    return "\n".join(parts)


@pytest.fixture(autouse=True)
def _cluster_for_slurm_tests() -> None:
    """These tests use their own cluster (``acct_cluster``), never the shared one: the
    integration suite's fixture of that name, which brings the shared one up, is replaced."""


@pytest.fixture(scope="session")
def acct_cluster() -> Iterator[Path]:
    """The accounting cluster's slurm.conf (module docstring). The test users exist before
    it comes up: its accounts are given to the users that exist then, and a job runs as
    icefrog-alice."""
    ensure_users()
    status = _cluster_sh("status")
    started = "slurmctld:  up" not in status.stdout
    if status.returncode != 0:
        up = _cluster_sh("up")
        if up.returncode != 0:
            pytest.fail(f"cluster.sh up --accounting failed:\n{up.stdout}\n{up.stderr}\n{_logs()}")
    try:
        yield CONF
    finally:
        if started:
            _cluster_sh("down")


@dataclass(frozen=True)
class AcctJobs:
    ids: tuple[str, ...]  # the Slurm job ids, in submission order
    records: dict[str, dict[str, str]]  # by Slurm job id: sacct's fields (times in epoch s)
    db: list[str]  # icefrog's --db arguments

    def id_of(self, name: str) -> str:
        return next(i for i in self.ids if self.records[i]["JobName"] == name)


# name, sbatch options, command, user (None: root)
JOBS: tuple[tuple[str, tuple[str, ...], str, str | None], ...] = (
    ("ok", (), "true", None),
    ("bad", (), "exit 3", None),
    ("gone", (), "sleep 300", None),
    ("resnet50-imagenet-train", (), "true", None),
    ("acct", ("--account=vision",), "true", None),
    ("wide", ("-N2",), "true", None),
    ("alice", (), "true", "icefrog-alice"),
)


def _submit(name: str, opts: tuple[str, ...], command: str, user: str | None) -> str:
    argv = ["sbatch", "--parsable", "-J", name, "-o", "/dev/null", "--chdir=/tmp", *opts]
    argv += ["--wrap", command]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    return slurm(*argv).strip().split(";")[0]


def _wait(what: str, fn: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{_logs()}")
        time.sleep(0.5)


def _sacct_records(ids: tuple[str, ...]) -> dict[str, dict[str, str]]:
    out = slurm(
        "sacct", "-X", "-P", "-n", "-j", ",".join(ids), "-o", FIELDS, SLURM_TIME_FORMAT="%s"
    )
    names = FIELDS.split(",")
    rows = [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines()]
    return {r["JobID"]: r for r in rows}


def _mirror(db_url: str, ids: tuple[str, ...], records: dict[str, dict[str, str]]) -> None:
    migrate.upgrade(db_url)
    store = SqlStore(db_url)
    decided: list[tuple[float, int, tuple[str, ...]]] = []
    try:
        for sid in ids:
            r = records[sid]
            with store.transaction() as tx:
                job = tx.create_job(
                    name=r["JobName"],
                    owner_uid=int(r["UID"]),
                    owner_user=r["User"],
                    slurm_job_id=sid,
                    spec=spec(),
                    now=float(r["Submit"]),
                )
                tx.set_state(job_id=job, state="running", now=float(r["Start"]))
                state, end = r["State"].split()[0], float(r["End"])
                if state == "COMPLETED":
                    report = FinishedReport(reason="max_epochs", epoch=1, final_metric=0.5)
                    tx.mark_finished(job_id=job, report=report, now=end)
                else:
                    tx.set_state(job_id=job, state=state.lower(), now=end)
            decided.append((float(r["Start"]), job, expand_hostlist(r["NodeList"])))
        # one round a job at its start, deciding it onto the nodes Slurm gave it
        for no, (start, job, nodes) in enumerate(sorted(decided), start=1):
            allocation = Allocation(job_id=job, gpus=len(nodes), batch=64, frozen=0, nodes=nodes)
            with store.transaction() as tx:
                tx.record_round(
                    round_no=no,
                    now=start,
                    policy="icefrog",
                    capacity_gpus=16,
                    allocations=[allocation],
                )
    finally:
        store.close()


@pytest.fixture(scope="module")
def acct_jobs(acct_cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> AcctJobs:
    ids = tuple(_submit(*job) for job in JOBS)
    gone = ids[[j[0] for j in JOBS].index("gone")]
    _wait(
        "the sleeping job to run",
        lambda: slurm("squeue", "-h", "-j", gone, "-o", "%T").strip() == "RUNNING",
    )
    slurm("scancel", gone)
    ended = ("COMPLETED", "FAILED", "CANCELLED")

    def all_ended() -> bool:
        # slurmctld sends a job's records to slurmdbd in several messages: until its start
        # record arrives sacct prints it as "allocation", with no partition
        records = _sacct_records(ids)
        return [records.get(i, {}).get("JobName") for i in ids] == [j[0] for j in JOBS] and all(
            r["State"].startswith(ended) and r["End"].isdigit() and r["Partition"]
            for r in records.values()
        )

    _wait("the jobs to end in sacct", all_ended)
    records = _sacct_records(ids)
    db_url = f"sqlite:///{tmp_path_factory.mktemp('acct') / 'icefrog.db'}"
    _mirror(db_url, ids, records)
    return AcctJobs(ids=ids, records=records, db=["--db", db_url])
