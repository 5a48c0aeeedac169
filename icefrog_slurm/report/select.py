"""Which jobs a report shows: ``-u``, ``-j``, ``-t/-s`` and ``-S/-E`` as sacct and squeue
read them. Pure: parsing turns bad input into an InputError naming it.

- ``-u USER[,USER]``: user names or numeric uids.
- ``-j ID[,ID]``: an icefrog job id or any Slurm job id of a job's chain.
- ``-t/-s STATE[,STATE]``: icefrog (``running``), long (``RUNNING``, ``COMPLETED``) or
  compact (``R``, ``CD``) names, any case; ``all`` for every state.
- ``-S/-E``: a job is shown when its life, from submission to its end (or now), overlaps
  the window [start, end].
- ``--name NAME[,NAME]``: job names (exact, as sacct's ``--name``).
- ``-p/-r PARTITION[,PARTITION]``: every icefrog job runs in the controller's partition
  (``slurm.partition``), so a list naming it selects every job and one that does not, none.
- Privacy (``[reports] private``, Slurm's ``PrivateData=jobs``): :func:`visible_owner`
  gives the one uid whose jobs a caller may see, or None for every job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from icefrog_slurm.domain.records import JobRecord
from icefrog_slurm.errors import InputError
from icefrog_slurm.report.jobs import JOB_STATES_SHOWN, end_or_now, state_aliases

_JOB_ID = re.compile(r"^\d{1,18}(?:_\d{1,9})?$", re.ASCII)
_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}\$?$", re.ASCII)
_PARTITION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$", re.ASCII)
MAX_NAME = 1024


@dataclass(frozen=True)
class JobFilter:
    users: frozenset[str] = frozenset()
    ids: frozenset[str] = frozenset()
    states: frozenset[str] | None = None  # None: every state
    start: float | None = None
    end: float | None = None
    names: frozenset[str] = frozenset()
    partitions: frozenset[str] = frozenset()
    partition: str = ""  # the controller's partition: every icefrog job's
    owner_uid: int | None = None  # privacy: only this owner's jobs (None: everyone's)

    def matches(self, job: JobRecord, *, now: float) -> bool:
        if self.owner_uid is not None and job.owner_uid != self.owner_uid:
            return False
        if self.partitions and self.partition not in self.partitions:
            return False
        if self.names and job.name not in self.names:
            return False
        if self.users and not ({job.owner_user, str(job.owner_uid)} & self.users):
            return False
        if self.ids and not ({str(job.id), *job.slurm_job_ids} & self.ids):
            return False
        if self.states is not None and job.state not in self.states:
            return False
        if self.end is not None and job.submit_time > self.end:
            return False
        return self.start is None or end_or_now(job, now) >= self.start


def _items(text: str | None, option: str) -> list[str]:
    """The comma list of an option; None (not given) is empty, a given list must name one
    item at least (``-u ''`` is an error, never "everyone")."""
    if text is None:
        return []
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise InputError(f"{option}: {text!r}: give at least one item")
    return items


def parse_users(text: str | None, *, option: str) -> frozenset[str]:
    """User names or numeric uids (the characters a POSIX user name may hold)."""
    users = _items(text, option)
    for user in users:
        if not _USER.match(user):
            raise InputError(f"{option}: {user!r} is not a user name or uid")
    return frozenset(users)


def parse_id(text: str, *, option: str) -> str:
    """One job id (digits, or ``N_M`` for an array task)."""
    if not _JOB_ID.match(text):
        raise InputError(f"{option}: {text!r} is not a job id")
    return text


def parse_ids(text: str | None, *, option: str) -> frozenset[str]:
    return frozenset(parse_id(item, option=option) for item in _items(text, option))


def parse_states(text: str | None, *, option: str) -> frozenset[str] | None:
    if text is None:
        return None
    aliases = state_aliases()
    states: set[str] = set()
    for item in _items(text, option):
        if item.lower() == "all":
            return None
        if item.lower() not in aliases:
            valid = ", ".join(JOB_STATES_SHOWN)
            raise InputError(f"{option}: unknown job state {item!r}; valid: {valid}, all")
        states.add(aliases[item.lower()])
    return frozenset(states)


def parse_names(text: str | None, *, option: str) -> frozenset[str]:
    """Job names: printable, at most :data:`MAX_NAME` characters each."""
    names = _items(text, option)
    for name in names:
        if len(name) > MAX_NAME or not name.isprintable():
            raise InputError(f"{option}: {name[:40]!r} is not a job name")
    return frozenset(names)


def parse_partitions(text: str | None, *, option: str) -> frozenset[str]:
    """Partition names (letters, digits, ``_.-``)."""
    parts = _items(text, option)
    for part in parts:
        if not _PARTITION.match(part):
            raise InputError(f"{option}: {part[:40]!r} is not a partition name")
    return frozenset(parts)


def visible_owner(
    *, uid: int, groups: frozenset[int], private: bool, operator_gid: int | None
) -> int | None:
    """The one owner whose jobs the caller sees, or None for everyone's: with ``private``
    a caller other than root and the members of the operator group sees only his own."""
    if not private or uid == 0:
        return None
    if operator_gid is not None and operator_gid in groups:
        return None
    return uid
