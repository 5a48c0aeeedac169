"""decision.json is written as root only into the job owner's own folder: attacks by real
unprivileged users (icefrog-alice attacks, icefrog-bob is the victim).

Every folder and link below is made by the user named, with that user's uid and gid
(``setpriv``); the controller's writer runs as root, as the daemon does. Each attack must
end with a refusal naming the component, and nothing written where the attacker pointed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from icefrog_slurm.controller.jobdir import UnsafeJobDir
from icefrog_slurm.controller.ports import FsJobFiles
from icefrog_slurm.protocol import Decision, parse_decision
from icefrog_slurm.runfiles import CHECKPOINT_MARKER, DECISION_FILE
from tests.support.munge import ensure_users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the writer runs as root")
DECISION = Decision(round=7, gpus=2, batch=32, frozen=0)


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def run(self, *argv: str) -> None:
        """Run ``argv`` as this user (its uid and primary gid only)."""
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *argv]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 0, f"{self.name}: {argv}: {proc.stderr}"

    def start(self, script: str) -> subprocess.Popen[bytes]:
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
        return subprocess.Popen([*cmd, "bash", "-c", script], start_new_session=True)


@pytest.fixture(scope="module")
def users() -> tuple[User, User]:
    uids = ensure_users()
    alice, bob = (
        User(n, uids[n], pwd.getpwnam(n).pw_gid) for n in ("icefrog-alice", "icefrog-bob")
    )
    return alice, bob


@pytest.fixture
def base(users: tuple[User, User]) -> Iterator[Path]:
    """A root-owned 0755 folder in /tmp with a 0755 home folder each user owns."""
    root = Path(tempfile.mkdtemp(prefix="icefrog-sec-", dir="/tmp"))
    root.chmod(0o755)
    for user in users:
        (root / user.name).mkdir(mode=0o755)
        os.chown(root / user.name, user.uid, user.gid)
    yield root
    shutil.rmtree(root)


def write(run_dir: Path, owner: User) -> None:
    FsJobFiles().write_decision(run_dir=str(run_dir), decision=DECISION, owner_uid=owner.uid)


def refused(run_dir: Path, owner: User, *fragments: str) -> str:
    with pytest.raises(UnsafeJobDir) as info:
        write(run_dir, owner)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_the_owners_own_folder_gets_the_decision(base: Path, users: tuple[User, User]) -> None:
    alice, _ = users
    run = base / alice.name / "run"
    alice.run("mkdir", str(run))
    write(run, alice)
    write(run, alice)  # replaced, not appended; no temporary file left either time
    st = (run / DECISION_FILE).stat()
    assert st.st_uid == alice.uid and st.st_mode & 0o777 == 0o644
    assert parse_decision((run / DECISION_FILE).read_text()) == DECISION
    assert sorted(p.name for p in run.iterdir()) == [DECISION_FILE]
    alice.run("rm", str(run / DECISION_FILE))  # hers to remove


def test_a_symlink_as_the_folder_is_refused(base: Path, users: tuple[User, User]) -> None:
    alice, bob = users
    bob.run("mkdir", str(base / bob.name / "run"))
    for target in (base / bob.name / "run", Path("/etc")):
        link = base / alice.name / f"to-{target.name}"
        alice.run("ln", "-s", str(target), str(link))
        refused(link, alice, str(link), "symbolic link")
    assert not (base / bob.name / "run" / DECISION_FILE).exists()
    assert not Path("/etc", DECISION_FILE).exists()


def test_a_symlink_in_the_middle_is_refused(base: Path, users: tuple[User, User]) -> None:
    alice, bob = users
    bob.run("mkdir", str(base / bob.name / "run"))
    alice.run("ln", "-s", str(base / bob.name), str(base / alice.name / "bobs"))
    refused(base / alice.name / "bobs" / "run", alice, f"{base}/{alice.name}/bobs:", "symbolic")
    assert not (base / bob.name / "run" / DECISION_FILE).exists()


def test_another_users_folder_is_refused(base: Path, users: tuple[User, User]) -> None:
    """Alice names Bob's job folder as her own: the write would replace Bob's decision."""
    alice, bob = users
    run = base / bob.name / "run"
    bob.run("mkdir", str(run))
    refused(run, alice, f"{base}/{bob.name}:", f"owned by uid {bob.uid}")
    assert not (run / DECISION_FILE).exists()
    # her own folder inside his tree is no better: his folder is on the way
    bob.run("mkdir", "-m", "0777", str(run / "open"))
    alice.run("mkdir", str(run / "open" / "mine"))
    refused(run / "open" / "mine", alice, f"owned by uid {bob.uid}")


def test_folders_others_can_write_are_refused(base: Path, users: tuple[User, User]) -> None:
    alice, _ = users
    group = base / alice.name / "group"
    alice.run("mkdir", "-m", "0775", str(group))
    refused(group, alice, str(group), "writable by its group", "0775")
    shared = base / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o777)  # root's, world-writable, no sticky bit: anyone may swap entries
    alice.run("mkdir", str(shared / "run"))
    refused(shared / "run", alice, f"{shared}:", "writable by its group and others")
    sticky = base / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: only an entry's owner may rename it
    alice.run("mkdir", str(sticky / "run"))
    write(sticky / "run", alice)
    assert (sticky / "run" / DECISION_FILE).stat().st_uid == alice.uid
    refused(sticky, alice, str(sticky), "and others (mode 1777)")  # never the job's own folder


def test_root_or_relative_folders_are_refused(base: Path, users: tuple[User, User]) -> None:
    alice, _ = users
    refused(base, alice, "owned by uid 0, not by the job's owner")
    refused(Path("run"), alice, "not an absolute path")
    refused(base / alice.name / ".." / alice.name, alice, "'..'")


def test_a_folder_swapped_after_the_check_gets_nothing_of_bobs(
    base: Path, users: tuple[User, User]
) -> None:
    """Between the walk and the rename, Alice moves her folder away and puts a link to Bob's
    folder in its place: the file still lands in the folder that was checked."""
    alice, bob = users
    run, bobs = base / alice.name / "run", base / bob.name / "run"
    alice.run("mkdir", str(run))
    bob.run("mkdir", str(bobs))

    def swap(point: str) -> None:
        assert point == "decision:temp"
        alice.run("mv", str(run), str(run.with_name("moved")))
        alice.run("ln", "-s", str(bobs), str(run))

    files = FsJobFiles(after_step=swap)
    files.write_decision(run_dir=str(run), decision=DECISION, owner_uid=alice.uid)
    assert not (bobs / DECISION_FILE).exists()
    assert parse_decision((run.with_name("moved") / DECISION_FILE).read_text()) == DECISION


def test_racing_swaps_never_reach_bobs_folder(base: Path, users: tuple[User, User]) -> None:
    """Best effort at the window inside the walk: Alice swaps a middle folder for a link to
    Bob's home, over and over, while the controller writes 300 times."""
    alice, bob = users
    home, bobs = base / alice.name, base / bob.name
    alice.run("mkdir", "-p", str(home / "mid" / "run"))
    bob.run("mkdir", str(bobs / "run"))
    racer = alice.start(
        f"cd {home} && while true; do mv mid real; ln -s {bobs} mid; rm mid; mv real mid; done"
    )
    written = 0
    try:
        for _ in range(300):
            try:
                write(home / "mid" / "run", alice)
                written += 1
            except UnsafeJobDir as exc:
                assert "mid" in str(exc), exc
    finally:
        os.killpg(racer.pid, signal.SIGKILL)  # the loop and the command it was running
        racer.wait()
    assert not (bobs / "run" / DECISION_FILE).exists()
    assert not list(bobs.rglob(".decision*"))
    found = [*home.glob(f"*/run/{DECISION_FILE}")]  # (the racer stopped mid-swap, maybe)
    assert written > 0 and len(found) == 1 and parse_decision(found[0].read_text()) == DECISION


def test_the_checkpoint_marker_is_read_in_the_owners_folder_only(
    base: Path, users: tuple[User, User]
) -> None:
    alice, bob = users
    run, bobs = base / alice.name / "run", base / bob.name / "run"
    alice.run("mkdir", str(run))
    bob.run("mkdir", str(bobs))
    bob.run("touch", str(bobs / CHECKPOINT_MARKER))
    files = FsJobFiles()
    assert not files.checkpoint_marked(run_dir=str(run), since=0.0, owner_uid=alice.uid)
    alice.run("ln", "-s", str(bobs / CHECKPOINT_MARKER), str(run / CHECKPOINT_MARKER))
    assert not files.checkpoint_marked(run_dir=str(run), since=0.0, owner_uid=alice.uid)
    assert not files.checkpoint_marked(run_dir=str(bobs), since=0.0, owner_uid=alice.uid)
    alice.run("rm", str(run / CHECKPOINT_MARKER))
    alice.run("touch", str(run / CHECKPOINT_MARKER))
    assert files.checkpoint_marked(run_dir=str(run), since=0.0, owner_uid=alice.uid)
    mtime = (run / CHECKPOINT_MARKER).stat().st_mtime
    assert not files.checkpoint_marked(run_dir=str(run), since=mtime + 5, owner_uid=alice.uid)


def _submit_held_as(user: User, key: str, workdir: Path) -> str:
    """A held Slurm job of ``user`` whose WorkDir is ``workdir`` (Slurm keeps the path)."""
    argv = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
            "sbatch", "--parsable", "-H", "-p", "gpu", "--gres=gpu:1", f"-J it-{key}",
            f"--comment=icefrog:{key}", f"--chdir={workdir}", "-o", "/dev/null",
            "--wrap", "sleep 600"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


@pytest.mark.slurm
def test_the_controller_refuses_alices_folder_and_decides_bobs_round(
    base: Path, users: tuple[User, User], tmp_path: Path
) -> None:
    """Alice's job names (as its WorkDir) a link to Bob's job folder. One controller tick on
    the real cluster: Bob's job gets its own decision for the round, Alice's is refused and
    the refusal, naming her link, is in the audit log."""
    from tests.integration.controller.support import (
        FixedPolicy,
        OffsetClock,
        backend,
        make_controller,
        make_settings,
        make_store,
    )
    from tests.integration.store.helpers import spec

    alice, bob = users
    bobs, link = base / bob.name / "run", base / alice.name / "run"
    bob.run("mkdir", str(bobs))
    alice.run("ln", "-s", str(bobs), str(link))
    settings = make_settings(tmp_path)
    store = make_store(settings)
    sids = {}
    try:
        with store.transaction() as tx:
            for user, folder in ((alice, link), (bob, bobs)):
                key = f"dec-{user.name}-{os.getpid()}"
                sids[user.name] = sid = _submit_held_as(user, key, folder)
                tx.create_job(name=key, owner_uid=user.uid, owner_user=user.name,
                              slurm_job_id=sid, spec=spec(), now=0.0)  # fmt: skip
            ids = {j.owner_user: j.id for j in tx.jobs()}
        policy = FixedPolicy({ids[alice.name]: (2, False, ()), ids[bob.name]: (1, False, ())})
        make_controller(settings, store, policy, OffsetClock()).tick_once()
        with store.transaction() as tx:
            last = tx.round()
            refusals = [a for a in tx.actions(job_id=ids[alice.name]) if a.action == "decision"]
        assert last is not None
        decision = parse_decision((bobs / DECISION_FILE).read_text())
        assert (decision.round, decision.gpus) == (last.round_no, 1)  # Bob's, not Alice's 2
        assert sorted(p.name for p in bobs.iterdir()) == [DECISION_FILE]
        assert [(a.outcome, a.slurm_job_id) for a in refusals] == [("refused", sids[alice.name])]
        assert f"{link}: is a symbolic link" in refusals[0].detail
    finally:
        for sid in sids.values():
            backend().cancel(job_id=sid)
        store.close()


class _Audit:
    """The store's audit log as the writer uses it (what it refused), and its clock."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def transaction(self) -> _Audit:
        return self

    def __enter__(self) -> _Audit:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def log_action(self, **fields: object) -> None:
        self.refused.append(str(fields["detail"]))

    def now(self) -> float:  # (the clock too)
        return 0.0


def test_a_folder_in_place_of_the_temporary_file_is_refused_for_the_round(
    base: Path, users: tuple[User, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice puts a folder named like the writer's temporary file in her job's folder: the
    write fails (EISDIR) for a reason she made, so it is refused and recorded once for the
    round, not tried again (a walk of her folder's path each time) at every reconcile pass;
    the next round tries again, and writes once she removed it."""
    from icefrog_slurm.controller.decisions import DecisionWriter
    from icefrog_slurm.domain.plan import JobPlan, Plan, SlurmRequest
    from icefrog_slurm.domain.records import Allocation

    alice, _ = users
    run = base / alice.name / "run"
    alice.run("mkdir", str(run))
    alice.run("mkdir", str(run / f".{DECISION_FILE}.tmp"))
    tries: list[str] = []
    files = FsJobFiles()
    real = files.write_decision

    def counted(**kw: object) -> None:
        tries.append(str(kw["run_dir"]))
        real(**kw)  # type: ignore[arg-type]

    monkeypatch.setattr(files, "write_decision", counted)
    audit = _Audit()
    writer = DecisionWriter(files=files, store=audit, clock=audit,  # type: ignore[arg-type]
                            job_dir=lambda sid, reported: str(run))  # fmt: skip
    job = JobPlan(1, "17", alice.uid, Allocation(job_id=1, gpus=1, batch=32, frozen=0),
                  SlurmRequest(gres=None), "none", run_dir=str(run))  # fmt: skip

    def plan(round_no: int) -> Plan:
        return Plan(time=0.0, round_no=round_no, policy="icefrog", capacity_gpus=4, jobs=(job,),
                    decided_round=round_no)  # fmt: skip

    for _ in range(3):  # three reconcile passes of round 5
        writer.write(plan(5))
    assert len(tries) == 1 and len(audit.refused) == 1 and "Is a directory" in audit.refused[0]
    assert not (run / DECISION_FILE).exists()
    alice.run("rmdir", str(run / f".{DECISION_FILE}.tmp"))
    writer.write(plan(6))
    assert parse_decision((run / DECISION_FILE).read_text()).round == 6
