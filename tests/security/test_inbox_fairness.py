"""Fair, bounded drains: one user's flood starves nobody, the inbox and the ledgers shrink.

Alice (icefrog-alice) floods the inbox with junk; Bob's honest reports must still land in
the first drain. One Slurm lookup serves a whole drain. Folders of ended jobs go away after
the grace period, folders of running jobs stay; archived files and ledger rows older than
the retention are pruned, except the accepted rows of a job still running (they refuse a
replay of its sequence numbers). Real munge, real users, SQLite and Postgres.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from icefrog_slurm.store.inbox import DrainResult
from icefrog_slurm.store.sql import SqlStore
from tests.security.inbox_support import METRIC, Site, as_user, make_site, site_in_tmp
from tests.support.munge import USERS

ALICE, BOB = USERS
ALICE_JOB, BOB_JOB = "101", "202"
DAY = 86400.0


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def site(store: SqlStore, tmp_path: Path, munge_users: dict[str, int], clock: Clock) -> Site:
    return make_site(
        store, tmp_path, munge_users, clock=clock, max_reports=10, max_reports_per_owner=4,
        folder_grace_s=3600.0, retention_days=30.0,
    )  # fmt: skip


@pytest.mark.parametrize("per_owner", [4, 10])
def test_one_users_flood_does_not_starve_another(site: Site, per_owner: int) -> None:
    """With a per-owner budget below the global one, and with both equal (turns alone)."""
    site.inbox.max_reports_per_owner = per_owner
    site.register(ALICE, ALICE_JOB)
    site.register(BOB, BOB_JOB, name="bobs")
    assert site.drain() == DrainResult(accepted=2)
    for seq in range(1, 51):  # Alice's junk: fifty files her own job's folder accepts to read
        site.put(ALICE, ALICE_JOB, f"{seq}-metric.json", b"{not json")
    for seq in (1, 2):
        site.drop(BOB, "metric", {**METRIC, "epoch": seq}, seq=seq, job=BOB_JOB, name="bobs")
    site.slurm.calls.clear()
    result = site.drain()
    assert result == DrainResult(accepted=2, rejected=min(per_owner, 10 - 2))
    assert site.metrics(BOB_JOB) == [0.5, 0.5]
    assert site.slurm.calls == [{ALICE_JOB, BOB_JOB}]  # one lookup for every folder
    left = 50 - result.rejected
    assert len(site.left_in_inbox()) == left  # the rest of the flood waits its turn


def test_folders_of_ended_jobs_go_after_the_grace_period(site: Site, clock: Clock) -> None:
    site.register(ALICE, ALICE_JOB)
    site.register(BOB, BOB_JOB, name="bobs")
    site.drop(ALICE, "finished", {"reason": "max_epochs", "epoch": 3, "final_metric": 0.9},
              seq=1, job=ALICE_JOB)  # fmt: skip
    site.put(BOB, "303", ".0-metric.json.77.tmp", b"")  # an unknown job, a writer that died
    assert site.drain() == DrainResult(accepted=3)
    inbox = site.inbox_dir
    assert {p.name for p in inbox.iterdir()} == {ALICE_JOB, BOB_JOB, "303"}  # grace not over
    clock.now = 1e10  # long after: Alice's job ended, Bob's runs, nobody knows job 303
    del site.slurm.jobs[ALICE_JOB]  # Slurm purged it; the store says it finished
    result = site.drain()
    assert result == DrainResult(rejected=1)  # the dead writer's dot file, quarantined
    assert "unknown to Slurm and to icefrog" in site.reasons()[0]
    site.drain()  # its folder, emptied by the last drain, goes now
    assert {p.name for p in inbox.iterdir()} == {BOB_JOB}


def test_archive_and_ledgers_are_pruned_after_the_retention(site: Site, clock: Clock) -> None:
    site.register(ALICE, ALICE_JOB)
    site.register(BOB, BOB_JOB, name="bobs")
    site.drop(ALICE, "finished", {"reason": "max_epochs", "epoch": 3, "final_metric": 0.9},
              seq=1, job=ALICE_JOB)  # fmt: skip
    site.put(BOB, BOB_JOB, "9-metric.json", b"junk")
    site.put(ALICE, "junk", "a", b"x")  # a junk folder: rejected, deleted whole
    assert site.drain() == DrainResult(accepted=3, rejected=2)
    clock.now += 29 * DAY  # within the retention: nothing goes
    site.drain()
    assert (site.archived("accepted"), site.archived("rejected"), _rows(site)) == (3, 1, (3, 2))
    clock.now += 2 * DAY
    site.drop(BOB, "metric", METRIC, seq=2, job=BOB_JOB, name="bobs")
    assert site.drain() == DrainResult(accepted=1)
    # Alice's ended job's rows and every old file are gone; Bob's running job keeps its rows
    assert _rows(site) == (2, 0)
    assert (site.archived("accepted"), site.archived("rejected")) == (1, 0)
    with site.inbox.store.transaction() as tx:
        job = tx.job_by_slurm_id(BOB_JOB)
        assert job is not None and tx.accepted_count(job_id=job.id) == 2
    # a replay of Bob's first report is still a duplicate, not a new report
    site.register(BOB, BOB_JOB, name="bobs")
    assert site.drain() == DrainResult(duplicates=1)
    assert os.listdir(site.root / "archive" / "rejected") == []


def test_a_junk_folder_nested_thousands_deep_neither_stops_pruning_nor_opens_the_archive(
    store: SqlStore, munge_users: dict[str, int], clock: Clock
) -> None:
    """Alice drops a junk folder 1200 levels deep and keeps a shell inside it; the drain
    moves it into the archive. Pruning it later makes ``shutil.rmtree`` recurse past
    Python's limit: that entry is left and logged, Bob's archived files are pruned all the
    same (the RecursionError ended every prune). From inside her folder, Alice reaches
    nothing of the archive: every folder above hers is root's, 0700."""
    with site_in_tmp(store, munge_users, "icefrog-deep", clock=clock, retention_days=30.0) as site:
        _nested_junk(site, clock)


def _nested_junk(site: Site, clock: Clock) -> None:
    inside = site.inbox_dir / "zz"

    def nest() -> None:
        os.mkdir(inside)
        os.chdir(inside)
        for _ in range(1200):
            os.mkdir("d")
            os.chdir("d")

    as_user(ALICE, nest)
    with _shell_in(ALICE, inside) as shell:  # her shell, its working folder her junk folder
        _moved_and_pruned(site, clock, shell)


def _moved_and_pruned(site: Site, clock: Clock, shell: Callable[[], list[str]]) -> None:
    site.register(BOB, BOB_JOB, name="bobs")
    site.put(BOB, BOB_JOB, "9-metric.json", b"junk")
    assert site.drain() == DrainResult(accepted=1, rejected=2)
    rejected = site.root / "archive" / "rejected"
    for folder in (site.root / "archive", rejected, *rejected.iterdir()):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o700), folder
        assert folder.stat().st_uid == 0
    [moved] = (rejected / "_inbox").iterdir()
    assert shell() == []  # from inside, nothing above her folder can be listed
    clock.now += 31 * DAY
    site.drain()  # prunes what is past the retention
    assert not (rejected / BOB_JOB).exists()  # Bob's junk pruned, its folder with it
    assert [p.name for p in (rejected / "_inbox").iterdir()] == [moved.name]  # left, logged


@contextlib.contextmanager
def _shell_in(user: str, folder: Path) -> Iterator[Callable[[], list[str]]]:
    """A process of ``user`` whose working folder is ``folder`` from now on; calling the
    result makes it list ``..``, ``../..`` and ``../../..`` (what it can) and end."""
    entry = pwd.getpwnam(user)
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.chdir(folder)
            os.write(out_w, b"ready\n")
            os.read(go_r, 1)
            seen = []
            for up in ("..", "../..", "../../.."):
                with contextlib.suppress(OSError):
                    seen += os.listdir(up)
            os.write(out_w, json.dumps(seen).encode() + b"\n")
        finally:
            os._exit(0)
    out = os.fdopen(out_r)
    assert out.readline() == "ready\n"

    def listing() -> list[str]:
        os.write(go_w, b"g")
        seen: list[str] = json.loads(out.readline())
        return seen

    try:
        yield listing
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for fd in (go_r, go_w, out_w):
            os.close(fd)
        out.close()


def _rows(site: Site) -> tuple[int, int]:
    with site.inbox.store.transaction() as tx:
        return tx.accepted_count(), len(tx.rejected_reports())


def test_folder_names_cannot_break_or_blow_up_the_slurm_lookup(site: Site) -> None:
    """squeue refuses ids of 2^31 and above and 0, and one refused id fails the whole call
    (every job would look unknown: no register adopted). Such names are junk, never looked
    up; thousands of idle folders are looked up a bounded number at a time."""
    site.register(BOB, BOB_JOB, name="bobs")
    for name in ("2147483648", "0", "0202", "99999999999"):
        site.put(ALICE, name, "1-metric.json", b"{}")
    for n in range(1500):  # Alice's idle folders with plausible ids
        (site.inbox_dir / str(100000 + n)).mkdir()
    site.inbox.max_reports_per_owner = 10
    assert site.drain() == DrainResult(accepted=1, rejected=4)
    assert site.job(BOB_JOB) is not None  # adopted: Slurm's lookup saw his job
    (looked_up,) = site.slurm.calls[:1]
    assert "2147483648" not in looked_up and "0" not in looked_up
    assert sum(len(c) for c in site.slurm.calls) <= 1 + 1000  # his folder and one window


def test_a_drain_lists_a_bounded_part_of_a_huge_folder(site: Site) -> None:
    """A folder of more files than a scan keeps of its owner (the reports a drain reads of
    him, 20 here): one drain reads at most that many; the next drains take the rest."""
    site.inbox.max_reports_per_owner, site.inbox.max_reports = 20, 1000
    site.register(ALICE, ALICE_JOB)
    assert site.drain() == DrainResult(accepted=1)
    for seq in range(1, 51):
        site.put(ALICE, ALICE_JOB, f"{seq}-metric.json", b"{not json")
    assert site.drain() == DrainResult(rejected=20)
    assert site.drain() == DrainResult(rejected=20)
    assert site.drain() == DrainResult(rejected=10) and site.left_in_inbox() == []


def test_one_users_mass_of_folders_hides_nobody_s_reports(
    site: Site, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice makes ten times more empty folders than a scan keeps of one owner (the bound
    lowered to 30 here, 10,000 in production), with plausible job ids, dated a century
    ahead (``touch -d``). Bob's register is read in the first drain whatever the order of
    the inbox's entries, and once the grace period has passed since her folders were last
    changed they go, a scan's share a drain, whatever their mtime says."""
    from icefrog_slurm.store import inbox_files

    monkeypatch.setattr(inbox_files, "MAX_OWNER_ENTRIES", 30)
    site.register(BOB, BOB_JOB, name="bobs")
    for n in range(300):
        path = site.inbox_dir / str(100000 + n)
        path.mkdir()
        os.chown(path, site.uids[ALICE], -1)
        os.utime(path, (2e10, 2e10))  # after the test's clock, as `touch -d 2600-01-01`
    assert site.drain() == DrainResult(accepted=1)
    assert site.job(BOB_JOB) is not None
    clock.now = 1e10  # long after: nobody knows her jobs
    for _ in range(10):
        site.drain()
    assert {p.name for p in site.inbox_dir.iterdir()} == {BOB_JOB}


def test_one_users_junk_cannot_flood_the_log(
    site: Site, munge_users: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    """Alice fills her job's folder with empty files whose 255-byte names are no UTF-8 (each
    byte escaped as ``\\udcff`` once made printable): a drain logs her first
    LOGGED_REJECTIONS (3 here) one by one, each line short, and the rest in one line; every
    file is still recorded with its (shortened) name and archived."""
    from icefrog_slurm.store import inbox

    site.inbox.max_reports_per_owner, site.inbox.max_reports = 12, 20
    site.register(ALICE, ALICE_JOB)
    assert site.drain() == DrainResult(accepted=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inbox, "LOGGED_REJECTIONS", 3)
        for i in range(12):
            site.put(ALICE, ALICE_JOB, str(i).encode() + b"\xff" * 250, b"")
        caplog.clear()
        with caplog.at_level("WARNING", logger="icefrog_slurm.store.inbox"):
            assert site.drain() == DrainResult(rejected=12)
    lines = [r.getMessage() for r in caplog.records if r.name == "icefrog_slurm.store.inbox"]
    assert len(lines) == 3 + 1 and all(len(line) < 600 for line in lines)
    assert f"9 more reports or claimed folders of uid {munge_users[ALICE]} rejected" in lines[-1]
    files = site.rejected_files()
    assert len(files) == 12 and all(len(f) <= 160 for f in files)
    assert site.left_in_inbox() == []
