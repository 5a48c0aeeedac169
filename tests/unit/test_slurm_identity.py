"""The identity rules of slurm/identity.py: signed successor tags, owner-bound matching."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag, SlurmJobState
from icefrog_slurm.errors import IcefrogError
from icefrog_slurm.slurm.identity import TagSigner, earlier_submission, successor_of
from icefrog_slurm.slurm.parse import parse_tag

ALICE, BOB = 1001, 1002


def _job(
    jid: str, uid: int, comment: str, *, state: str = "PENDING", name: str = "n"
) -> SlurmJobState:
    return SlurmJobState(
        jid, state, Gres("gpu", 1), 1, "", "JobHeldUser", 0, uid, "gpu", comment,
        parse_tag(comment), name,
    )  # fmt: skip


def test_a_signed_tag_names_its_job_and_owner_only() -> None:
    signer = TagSigner(b"k" * 32)
    tag = signer.successor_tag(key="abc", previous_id="10", owner_uid=ALICE)
    assert parse_tag(tag.comment()) == tag and signer.signed(tag, owner_uid=ALICE)
    assert not signer.signed(tag, owner_uid=BOB)
    assert not signer.signed(IcefrogTag("abc", "11", tag.signature), owner_uid=ALICE)
    assert not signer.signed(IcefrogTag("abd", "10", tag.signature), owner_uid=ALICE)
    assert not signer.signed(IcefrogTag("abc", "10"), owner_uid=ALICE)
    assert not TagSigner(b"j" * 32).signed(tag, owner_uid=ALICE)  # another controller's key


def test_decoys_are_never_taken_for_a_successor() -> None:
    signer = TagSigner(b"k" * 32)
    real = signer.successor_tag(key="abc", previous_id="10", owner_uid=ALICE).comment()
    jobs = [
        _job("20", BOB, real),  # bob copies alice's signed comment onto his own job
        _job("21", ALICE, "icefrog:abc;prev=10"),  # unsigned, even by the owner
        _job("22", ALICE, "icefrog:abc;prev=10;sig=" + "0" * 32),  # a guessed signature
        _job("23", ALICE, real, state="CANCELLED"),  # the real one, but ended
        # signatures compare_digest refuses as str (a TypeError would end the pass)
        _job("25", ALICE, "icefrog:abc;prev=10;sig=\u00e9"),
        _job("26", ALICE, "icefrog:abc;prev=10;sig=" + "\ufffd" * 32),
        _job("27", ALICE, "icefrog:abc;prev=10;sig=\udcff"),  # a lone surrogate
    ]
    assert successor_of(jobs, job_id="10", owner_uid=ALICE, signer=signer) is None
    jobs.append(_job("24", ALICE, real))
    assert successor_of(jobs, job_id="10", owner_uid=ALICE, signer=signer) == "24"
    jobs.append(_job("28", ALICE, real[:-1] + "\u00e9"))  # the real one, one char off
    assert successor_of(jobs, job_id="10", owner_uid=ALICE, signer=signer) == "24"


def test_an_earlier_submission_must_be_the_owners() -> None:
    jobs = [_job("5", BOB, "icefrog:k", name="train"), _job("6", ALICE, "icefrog:k", name="x")]
    assert earlier_submission(jobs, name="train", comment="icefrog:k", owner_uid=ALICE) is None
    jobs.append(_job("7", ALICE, "icefrog:k", name="train"))
    assert earlier_submission(jobs, name="train", comment="icefrog:k", owner_uid=ALICE) == "7"


def test_the_secret_file_is_made_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "tag.key"
    first = TagSigner.from_file(path)
    assert (path.stat().st_mode & 0o777) == 0o600 and path.stat().st_size == 32
    tag = first.successor_tag(key="k", previous_id="1", owner_uid=ALICE)
    assert TagSigner.from_file(path).signed(tag, owner_uid=ALICE)  # the same after a restart
    os.chmod(path, 0o644)
    with pytest.raises(IcefrogError, match="mode 0600"):
        TagSigner.from_file(path)
    os.chmod(path, 0o600)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(IcefrogError, match="cannot open"):
        TagSigner.from_file(link)
    short = tmp_path / "short.key"
    short.write_bytes(b"x")
    short.chmod(0o600)
    with pytest.raises(IcefrogError, match="shorter than 16"):
        TagSigner.from_file(short)
