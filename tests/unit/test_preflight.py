"""``icefrog controller --check`` and the controller's first start on a fresh host.

The check prints one line a check and exits 0 only when every check passed; it creates and
changes nothing. The first start refuses a missing or unmigrated database before touching
it (a SQLite file is never created by the daemon), then makes the state folder (0755), the
inbox (1733) and the archive (0700), or refuses, in one line, folders others could abuse.
Slurm is replaced here by a stand-in (the real capacity call is tested on the cluster); munge
is the host's real munged.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import stat
from pathlib import Path

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.commands import preflight
from icefrog_slurm.errors import IcefrogError, InputError
from icefrog_slurm.settings import load_settings
from icefrog_slurm.store import migrate


@pytest.fixture(autouse=True)
def _slurm_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "check_slurm", lambda _settings: "stand-in: 4 GPUs")


def _config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "icefrog.toml"
    config.write_text(f'[state]\ndir = "{tmp_path}/state"\n{extra}')
    return config


def _check(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str]]:
    capsys.readouterr()  # what ran before
    code = main(["controller", "--check", "--config", str(config)])
    out = capsys.readouterr().out
    lines = {
        "tag" if line.startswith("tag") else line.split()[0]: line for line in out.splitlines()
    }
    return code, lines


def _upgrade(config: Path) -> None:
    assert main(["db", "upgrade", "--config", str(config)]) == 0


needs_munge = pytest.mark.skipif(shutil.which("munge") is None, reason="munge not installed")


def test_a_fresh_host_fails_on_the_database_only_and_nothing_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    code, lines = _check(config, capsys)
    assert code == 2
    assert "FAIL: database sqlite:///" in lines["database"]
    assert f"does not exist: run `icefrog db upgrade --config {config}`" in lines["database"]
    assert "ok: " in lines["state.dir"] and "the first start makes it" in lines["state.dir"]
    assert list(tmp_path.iterdir()) == [config]  # no folder, no database file


@needs_munge
def test_a_ready_host_passes_every_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    _upgrade(config)
    preflight.first_start(load_settings(config), config=str(config))
    code, lines = _check(config, capsys)
    assert code == 0, lines
    assert set(lines) == {"settings", "database", "state.dir", "inbox.dir",
                          "inbox.archive_dir", "tag", "munge", "slurm", "metrics"}  # fmt: skip
    assert all(" ok: " in line for line in lines.values()), lines
    assert "revision " + str(migrate.head_revision()) in lines["database"]
    assert "mode 1733" in lines["inbox.dir"] and "mode 0700" in lines["inbox.archive_dir"]
    assert "off" in lines["metrics"]


@needs_munge
def test_each_broken_part_is_one_fail_line_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    config = _config(tmp_path, f"[metrics]\nport = {port}\n")
    _upgrade(config)
    state = tmp_path / "state"
    os.chmod(state, 0o777)
    (state / "inbox").mkdir()
    os.chown(state / "inbox", 12345, 12345)
    (state / "tag.key").write_bytes(os.urandom(32))
    os.chmod(state / "tag.key", 0o644)
    monkeypatch.setattr(preflight, "check_slurm", _slurm_down)
    try:
        code, lines = _check(config, capsys)
    finally:
        busy.close()
    assert code == 2
    assert f"run `chmod 0755 {state}`" in lines["state.dir"]
    assert f"owned by uid 12345: run `chown root {state}/inbox`" in lines["inbox.dir"]
    assert f"run `chmod 0600 {state}/tag.key`" in lines["tag"]
    assert f"127.0.0.1:{port}: cannot listen" in lines["metrics"]
    assert "FAIL: slurmctld is down" in lines["slurm"]
    assert f"store.url: {state} has mode 0777" in lines["database"]  # the SQLite file's folder
    for key in ("state.dir", "inbox.dir", "tag", "metrics", "slurm", "database"):
        assert " FAIL: " in lines[key], lines[key]
    assert " ok: " in lines["munge"]
    assert stat.S_IMODE((state / "tag.key").stat().st_mode) == 0o644  # nothing was fixed


def _slurm_down(_settings: object) -> str:
    raise preflight.Failed("slurmctld is down")


def test_the_tag_secret_must_be_a_private_plain_file(tmp_path: Path) -> None:
    key = tmp_path / "tag.key"
    assert "absent" in preflight.check_tag_secret(key)
    key.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(preflight.Failed, match="plain file"):
        preflight.check_tag_secret(key)
    key.unlink()
    key.write_bytes(b"short")
    os.chmod(key, 0o600)
    with pytest.raises(preflight.Failed, match="fewer than 16"):
        preflight.check_tag_secret(key)
    key.write_bytes(os.urandom(32))
    assert "mode 0600" in preflight.check_tag_secret(key)


def test_a_database_the_daemon_cannot_use_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    memory = _config(tmp_path, '[store]\nurl = "sqlite://"\n')
    code, lines = _check(memory, capsys)
    assert code == 2 and "cannot be locked" in lines["database"]
    theirs = tmp_path / "theirs.db"
    conn = sqlite3.connect(theirs)
    conn.executescript("CREATE TABLE customers (id INTEGER);")
    conn.close()
    before = theirs.read_bytes()
    code, lines = _check(_config(tmp_path, f'[store]\nurl = "sqlite:///{theirs}"\n'), capsys)
    assert code == 2 and "customers" in lines["database"]
    assert theirs.read_bytes() == before


def _elsewhere(tmp_path: Path) -> Path:
    """A path for a folder on another filesystem than ``tmp_path`` (``/dev/shm``), or skip."""
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem to put a folder on")
    return Path(os.path.realpath(other)) / f"icefrog-test-{os.getpid()}"


def test_the_archive_must_share_the_inbox_filesystem(tmp_path: Path) -> None:
    archive = _elsewhere(tmp_path)
    archive.mkdir(mode=0o700)
    try:
        config = _config(tmp_path, f'[inbox]\narchive_dir = "{archive}"\n')
        _upgrade(config)
        with pytest.raises(InputError, match="another filesystem than the inbox"):
            preflight.first_start(load_settings(config), config=str(config))
    finally:
        archive.rmdir()


def test_an_absent_archive_whose_parent_is_on_another_filesystem_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The inbox on a shared filesystem, the archive left at a path the first start would
    make elsewhere: the check says so before the start fails, and the start makes nothing."""
    inbox = _elsewhere(tmp_path)
    inbox.mkdir(mode=0o1733)
    try:
        archive = tmp_path / "state" / "archive"
        config = _config(tmp_path, f'[inbox]\ndir = "{inbox}"\narchive_dir = "{archive}"\n')
        _upgrade(config)
        _code, lines = _check(config, capsys)
        assert "another filesystem than the inbox" in lines["inbox.archive_dir"]
        with pytest.raises(InputError, match="another filesystem than the inbox"):
            preflight.first_start(load_settings(config), config=str(config))
        assert not archive.exists()
    finally:
        inbox.rmdir()


# --- the first start ------------------------------------------------------------------------


def test_the_first_start_refuses_a_missing_database_before_making_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real entry point on a fresh host: one line, exit 2, no database file made."""
    config = _config(tmp_path)
    assert main(["controller", "--once", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.endswith(f"does not exist: run `icefrog db upgrade --config {config}`")
    assert not (tmp_path / "state").exists()


def test_the_first_start_leaves_an_unmigrated_database_untouched(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "state").mkdir(mode=0o755)
    empty = tmp_path / "state" / "icefrog.db"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match=r"at revision none.*icefrog db upgrade"):
        preflight.first_start(load_settings(config), config=str(config))
    assert empty.read_bytes() == b""  # not even switched to WAL
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["icefrog.db"]


def test_the_first_start_makes_the_folders_with_their_modes(tmp_path: Path) -> None:
    """On Postgres nothing else makes the state folder: the first start does, whatever the
    umask; here a migrated SQLite database elsewhere stands in for it."""
    db = tmp_path / "db" / "icefrog.db"
    config = _config(tmp_path, f'[store]\nurl = "sqlite:///{db}"\n')
    _upgrade(config)
    old = os.umask(0o077)
    try:
        preflight.first_start(load_settings(config), config=str(config))
    finally:
        os.umask(old)
    modes = {name: stat.S_IMODE((tmp_path / "state" / name).stat().st_mode)
             for name in ("", "inbox", "archive")}  # fmt: skip
    assert modes == {"": 0o755, "inbox": 0o1733, "archive": 0o700}
    preflight.first_start(load_settings(config), config=str(config))  # a restart: the same


def test_the_first_start_refuses_a_state_folder_others_may_write(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _upgrade(config)
    os.chmod(tmp_path / "state", 0o777)
    with pytest.raises(IcefrogError, match=r"state has mode 0777, others may write it: run `chmod"):
        preflight.first_start(load_settings(config), config=str(config))  # the database's folder
    assert not (tmp_path / "state" / "inbox").exists()
    db = tmp_path / "db" / "icefrog.db"  # the database elsewhere: the folder itself is refused
    config = _config(tmp_path, f'[store]\nurl = "sqlite:///{db}"\n')
    _upgrade(config)
    with pytest.raises(IcefrogError, match=r"state.dir: .* others may write in it: run `chmod"):
        preflight.first_start(load_settings(config), config=str(config))


def test_a_metrics_port_in_use_stops_the_start_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before the folders are made: a busy port is one line, not a traceback from
    the endpoint later; a dry run serves no endpoint and does not care."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = _config(tmp_path, f"[metrics]\nport = {port}\n")
        _upgrade(config)
        settings = load_settings(config)
        with pytest.raises(InputError, match=rf"metrics.port: 127.0.0.1:{port}: cannot listen"):
            preflight.first_start(settings, config=str(config), metrics=True)
        assert not (tmp_path / "state" / "inbox").exists()
        preflight.first_start(settings, config=str(config), metrics=False)


def test_modes_the_start_sets_are_said_so_and_others_are_left(tmp_path: Path) -> None:
    from icefrog_slurm.commands.state_folders import folders, inspect

    config = _config(tmp_path)
    _upgrade(config)
    state, inbox, _archive = folders(load_settings(config))
    os.chmod(tmp_path / "state", 0o711)  # others pass, cannot list: fine, and left so
    (tmp_path / "state" / "inbox").mkdir(mode=0o755)
    os.chmod(tmp_path / "state" / "inbox", 0o777)
    assert inspect(state) == (True, f"mode 0711, uid {os.geteuid()}")
    assert inspect(inbox) == (True, "mode 0777, set to 1733 at start")
    preflight.first_start(load_settings(config), config=str(config))
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o711


# --- paths a user could change (sshd's StrictModes) -----------------------------------------

NOBODY = 65534


def _nobodys(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def _wal(state: Path) -> None:
    (state / "icefrog.db-wal").write_bytes(b"")
    _nobodys(state / "icefrog.db-wal")


def _leader(state: Path) -> None:
    (state / "icefrog.db.leader").write_bytes(b"")
    os.chmod(state / "icefrog.db.leader", 0o666)


def _swap_state_via_link(state: Path) -> None:
    """The state folder reached through nobody's link in a sticky folder like /tmp."""
    sticky = state.parent / "shared"
    sticky.mkdir(mode=0o1777)
    os.chmod(sticky, 0o1777)
    real = state.parent / "real-state"
    state.rename(real)
    (sticky / "state").symlink_to(real)
    _nobodys(sticky / "state")
    state.symlink_to(sticky / "state")


BREAKS = {
    # what a careless admin or a hostile user leaves -> the check line and what it says
    "config-nobodys": (lambda etc, state: _nobodys(etc / "icefrog.toml"), "settings",
                       "icefrog.toml is owned by uid 65534: run `chown root"),
    "config-writable": (lambda etc, state: os.chmod(etc / "icefrog.toml", 0o666), "settings",
                        "icefrog.toml has mode 0666, others may write it: run `chmod go-w"),
    "config-folder-nobodys": (lambda etc, state: _nobodys(etc), "settings",
                              "etc is owned by uid 65534"),
    "sqlite-nobodys": (lambda etc, state: _nobodys(state / "icefrog.db"), "database",
                       "store.url: " "{state}/icefrog.db is owned by uid 65534"),
    "sqlite-writable": (lambda etc, state: os.chmod(state / "icefrog.db", 0o664), "database",
                        "icefrog.db has mode 0664, others may write it"),
    "sqlite-wal-nobodys": (lambda etc, state: _wal(state), "database",
                           "icefrog.db-wal is owned by uid 65534"),
    "sqlite-leader-writable": (lambda etc, state: _leader(state), "database",
                               "icefrog.db.leader has mode 0666"),
    "state-parent-nobodys": (lambda etc, state: _nobodys(state.parent), "state.dir",
                             "is owned by uid 65534"),
    "state-parent-writable": (lambda etc, state: os.chmod(state.parent, 0o777), "state.dir",
                              "has mode 0777, others may write it"),
    # the database's path goes through the link (the state folder, a link, is refused as one)
    "state-through-nobodys-link": (lambda etc, state: _swap_state_via_link(state), "database",
                                   "shared/state is owned by uid 65534"),
}  # fmt: skip


def _started(config: Path, state: Path) -> Path:
    """A settings file naming ``state`` as the state folder, its store upgraded, first
    started."""
    config.write_text(f'[state]\ndir = "{state}"\n')
    _upgrade(config)
    preflight.first_start(load_settings(config), config=str(config))
    return config


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid")
@pytest.mark.parametrize("case", sorted(BREAKS))
def test_a_path_a_user_could_change_fails_the_check_and_stops_the_start(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ready host, then one path made changeable by a user (nobody's, or writable by
    all): a SQLite store would let the user rewrite owners and intents, a settings file
    repoint ``state.dir`` and ``store.url``, a folder above the state folder swap it. The
    check fails that line and the daemon refuses to start, naming the path and the fix."""
    breaks, key, fragment = BREAKS[case]
    base = tmp_path / "base"  # the state folder's parent, which tmp_path (0700) is not
    base.mkdir(mode=0o755)
    etc, state = tmp_path / "etc", base / "state"
    etc.mkdir(mode=0o755)
    config = _started(etc / "icefrog.toml", state)
    code, lines = _check(config, capsys)
    assert all(" ok: " in lines[k] for k in ("settings", "database", "state.dir")), lines
    breaks(etc, state)
    fragment = fragment.format(state=state)
    code, lines = _check(config, capsys)
    assert code == 2 and " FAIL: " in lines[key] and fragment in lines[key], lines[key]
    assert main(["controller", "--once", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and fragment in err.splitlines()[-1], err


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid")
def test_a_root_owned_sticky_folder_above_the_state_folder_is_fine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like /tmp: writable by all, but only an entry's owner may rename it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    config = _started(tmp_path / "icefrog.toml", shared / "state")
    _code, lines = _check(config, capsys)
    assert all(" ok: " in lines[k] for k in ("settings", "database", "state.dir")), lines


@pytest.mark.parametrize("argv", [["--check"], ["--once"], []])
def test_run_as_another_user_it_refuses_before_looking_at_anything(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """An admin who runs it as uid 1001: it said `run chown 1001 <state dir>` (following it
    hands the tag key and the database to that user); now one line, exit 2, and nothing
    looked at or made."""
    config = _config(tmp_path)
    _upgrade(config)
    capsys.readouterr()
    monkeypatch.setattr(os, "geteuid", lambda: 1001)
    assert main(["controller", *argv, "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "chown" not in err, (out, err)
    assert err.strip().endswith(
        "the controller runs as root (this process runs as uid 1001): run it as root, as its "
        "systemd unit does"
    ), err
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["icefrog.db"]


def test_a_metrics_address_that_is_none_names_metrics_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said `... set metrics.port` (the port was fine)."""
    config = _config(tmp_path, '[metrics]\nport = 9464\naddress = "not an address"\n')
    _upgrade(config)
    with pytest.raises(InputError) as caught:
        preflight.first_start(load_settings(config), config=str(config), metrics=True)
    assert str(caught.value).startswith("metrics.address: not an address:9464: cannot listen")
    assert str(caught.value).endswith("set metrics.address"), caught.value
    _code, lines = _check(config, capsys)
    assert "FAIL: metrics.address:" in lines["metrics"] and "metrics.port" not in lines["metrics"]


def test_a_relative_sqlite_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative to wherever the command runs: `db upgrade` in the admin's folder, the
    daemon in / under systemd, each a database of its own."""
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, '[store]\nurl = "sqlite:///icefrog.db"\n')
    _upgrade(config)
    with pytest.raises(InputError, match=r"the SQLite file must be an absolute path"):
        preflight.first_start(load_settings(config), config=str(config))
    _code, lines = _check(config, capsys)
    assert "FAIL: store.url: sqlite:///icefrog.db: the SQLite file must be" in lines["database"]
