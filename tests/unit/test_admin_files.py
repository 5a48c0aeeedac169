"""``icefrog admin install-files DEST``: what it copies, what it keeps, and links it refuses
to follow (it runs as root into folders an admin names)."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.commands import admin
from icefrog_slurm.commands.admin import SHIPPED, shipped_folder

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p.name
    for pattern in ("*.example", "*.service", "*.rules.yml")
    for p in (REPO / "slurm_conf").glob(pattern)
)
DOCS = sorted(p.name for p in (REPO / "docs").glob("*.md"))


def _install(dest: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    assert main(["admin", "install-files", str(dest), *extra]) == 0
    return capsys.readouterr().out.splitlines()


def test_copies_the_examples_and_the_guides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "doc" / "icefrog-slurm"  # made with its parents
    out = _install(dest, capsys)
    assert sorted(p.name for p in (dest / "examples").iterdir()) == EXAMPLES
    assert sorted(p.name for p in dest.glob("*.md")) == DOCS
    assert not (dest / "examples" / "dev").exists()  # the dev cluster does not ship
    assert len(out) == len(EXAMPLES) + len(DOCS)
    assert all(line.startswith(f"wrote {dest}/") for line in out), out
    unit = dest / "examples" / "icefrog-controller.service"
    assert unit.read_bytes() == (REPO / "slurm_conf" / unit.name).read_bytes()
    rules = dest / "examples" / "icefrog-alerts.rules.yml"  # the admin guide's alert rules
    assert rules.read_bytes() == (REPO / "slurm_conf" / rules.name).read_bytes()
    assert oct(unit.stat().st_mode & 0o777) == "0o644"


def test_the_units_documentation_is_what_it_installs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Documentation= names file:///usr/share/doc/icefrog-slurm/<guide>: with that DEST the
    file is there."""
    _install(tmp_path, capsys)
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(tmp_path / "examples" / "icefrog-controller.service")
    uris = unit["Unit"]["Documentation"].split()
    assert uris
    for uri in uris:
        assert uri.startswith("file:///usr/share/doc/icefrog-slurm/"), uri
        assert (tmp_path / uri.removeprefix("file:///usr/share/doc/icefrog-slurm/")).is_file()


def test_keeps_what_exists_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(tmp_path, capsys)
    edited = tmp_path / "examples" / "icefrog.toml.example"
    edited.write_text("# the admin's own\n")
    out = _install(tmp_path, capsys)
    assert edited.read_text() == "# the admin's own\n"
    assert f"kept {edited} (it exists; --force replaces it)" in out
    assert not [line for line in out if line.startswith("wrote")]
    out = _install(tmp_path, capsys, "--force")
    assert edited.read_bytes() == (REPO / "slurm_conf" / edited.name).read_bytes()
    assert f"wrote {edited}" in out


def test_a_link_at_a_targets_name_is_replaced_not_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    dest = tmp_path / "dest"
    (dest / "examples").mkdir(parents=True)
    planted = dest / "examples" / "icefrog-controller.service"
    planted.symlink_to(victim)
    dangling = dest / "admin-guide.md"
    dangling.symlink_to(tmp_path / "would-be-created")
    out = _install(dest, capsys)
    assert f"kept {planted} (it exists; --force replaces it)" in out  # a link counts
    assert f"kept {dangling} (it exists; --force replaces it)" in out
    _install(dest, capsys, "--force")
    assert victim.read_text() == "root's file\n"
    assert not (tmp_path / "would-be-created").exists()
    assert not planted.is_symlink() and not dangling.is_symlink()
    assert [n for n in os.listdir(dest / "examples") if n.startswith(".")] == []  # no temp left


def test_a_linked_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "examples").symlink_to(elsewhere)
    assert main(["admin", "install-files", str(dest)]) == 2
    assert "examples: a link or not a folder" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_a_folder_at_a_files_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "admin-guide.md").mkdir()
    assert main(["admin", "install-files", str(tmp_path), "--force"]) == 2
    assert "admin-guide.md: is a folder, not a file" in capsys.readouterr().err


def test_the_checkout_is_found_when_not_installed() -> None:
    for group in SHIPPED:
        folder = shipped_folder(group)
        assert any(folder.glob(group.patterns[0])), folder


def test_a_linked_dest_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "dest").symlink_to(elsewhere)
    assert main(["admin", "install-files", str(tmp_path / "dest")]) == 2
    assert "dest: a link or not a folder" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_a_folder_swapped_for_a_link_meanwhile_is_not_written_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone who can write DEST swaps DEST/examples for a link after it was opened: the
    rest of the files still land in the folder that was opened, none behind the link."""
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    elsewhere.mkdir()
    write = admin._write

    def swap_then_write(name: str, fd: int, data: bytes) -> None:
        if name == EXAMPLES[0] and not (dest / "moved").exists():
            (dest / "examples").rename(dest / "moved")
            (dest / "examples").symlink_to(elsewhere)
        write(name, fd, data)

    monkeypatch.setattr(admin, "_write", swap_then_write)
    _install(dest, capsys)
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in (dest / "moved").iterdir()) == EXAMPLES


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    unit.read(REPO / "slurm_conf" / "icefrog-controller.service")
    return unit


def test_the_unit_gives_up_on_a_settings_error_and_stops_its_whole_control_group() -> None:
    """A careless admin's settings error (exit 2) was restarted every 10 s for ever; a stop
    left the solver's worker processes running (KillMode=process); a restart of munge
    stopped the controller, which waits out munged on its own (Requires=)."""
    unit = _unit()
    service = unit["Service"]
    assert service["Restart"] == "on-failure" and service["RestartPreventExitStatus"] == "2"
    assert int(unit["Unit"]["StartLimitBurst"]) <= 5
    assert int(unit["Unit"]["StartLimitIntervalSec"]) >= 60
    assert service.get("KillMode", "control-group") == "control-group"
    assert "munge.service" in unit["Unit"]["Wants"].split()
    assert "Requires" not in unit["Unit"]
    assert service["NoNewPrivileges"] == "yes"
    for kept_open in ("ProtectSystem", "ProtectHome", "PrivateTmp"):  # folders may be anywhere
        assert kept_open not in service


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_rates_the_unit_hardened(tmp_path: Path) -> None:
    """``systemd-analyze security --offline=yes``: 9.6 (UNSAFE) before the hardening."""
    unit = tmp_path / "icefrog-controller.service"
    unit.write_bytes((REPO / "slurm_conf" / unit.name).read_bytes())
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found is not None, done.stdout + done.stderr
    assert float(found.group(1)) <= 7.0, done.stdout
