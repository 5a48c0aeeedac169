"""Real munge for the security tests: a running munged and two unprivileged test users.

Idempotent and safe to run next to other helpers that also start munged: it checks
``munge -n | unmunge`` first, starts munged (as the munge user, like the Debian service)
only when that fails, and creates the users only when they are missing. Needs root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time

USERS = ("icefrog-alice", "icefrog-bob")


def munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, text=True, timeout=10)
        if cred.returncode != 0:
            return False
        dec = subprocess.run(
            ["unmunge"], input=cred.stdout, capture_output=True, text=True, timeout=10
        )
        return dec.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_munged() -> str | None:
    """Make munge usable; return why it cannot be (None when it works)."""
    if munge_works():
        return None
    if shutil.which("munged") is None:
        return "munge is not installed (apt-get install munge)"
    if os.geteuid() != 0:
        return "munged is not running and only root can start it"
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    if not os.path.exists("/etc/munge/munge.key"):
        subprocess.run(["runuser", "-u", "munge", "--", "mungekey", "-c"], check=False, timeout=30)
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], capture_output=True, timeout=30)
    for _ in range(50):  # munged may also have been started by someone else meanwhile
        if munge_works():
            return None
        time.sleep(0.1)
    return "munged does not start (see /var/log/munge/munged.log)"


def ensure_users() -> dict[str, int]:
    """The test users' uids, creating the users when missing (retrying a busy passwd lock)."""
    uids: dict[str, int] = {}
    for name in USERS:
        for _ in range(50):
            try:
                uids[name] = pwd.getpwnam(name).pw_uid
                break
            except KeyError:
                subprocess.run(
                    ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                    capture_output=True,
                    timeout=30,
                )
                time.sleep(0.1)
        else:
            raise RuntimeError(f"cannot create the test user {name}")
    return uids
