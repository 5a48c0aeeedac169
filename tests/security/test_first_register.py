"""A first ``register`` adopts only a pending-held job: Alice (icefrog-alice) tries to get a
plain ``sbatch`` job planned by writing the icefrog tag into its comment herself.

The only legitimate first register is ``icefrog submit``'s, sent while it holds the job it
submitted. Alice's job started outside the plan (running, never held) carries
``--comment=icefrog:<key>`` and registers as she would: the drain refuses it with the
logged reason and the job runs unmanaged, untouched. Her held job registers as
``icefrog submit``'s would and is adopted; a job the controller resubmitted (the signed
``prev=...;sig=...`` tag) is linked to its icefrog job before it is released, so its
register, sent once it runs, is accepted. All on the real local cluster, real munge.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.slurm.identity import TagSigner
from icefrog_slurm.store.inbox import DrainResult, slurm_jobs_of
from tests.integration.controller.support import backend, make_settings, make_store, running
from tests.security.inbox_support import Site, make_site, spec_payload
from tests.security.slurm_support import held_job_as, sbatch_as
from tests.support.munge import USERS

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

ALICE, _BOB = USERS


@pytest.fixture
def site(tmp_path: Path, munge_users: dict[str, int]) -> Iterator[Site]:
    root = Path(f"/tmp/icefrog-first-{uuid.uuid4().hex[:8]}")  # every user can reach it
    root.mkdir()
    try:
        yield make_site(make_store(make_settings(tmp_path)), root, munge_users)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_running_job_with_a_hand_written_tag_is_not_adopted(
    site: Site, munge_users: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = backend()
    site.inbox.slurm_jobs = slurm_jobs_of(cluster)
    key = uuid.uuid4().hex[:8]
    plain = sbatch_as(munge_users[ALICE], Path("/tmp"), "--gres=gpu:1", "-J", f"cnn-{key}",
                      f"--comment=icefrog:{key}", output="/dev/null")  # fmt: skip
    held = held_job_as(ALICE, f"--comment=icefrog:{key}-held")
    try:
        before = running(cluster, plain)
        assert before.tag is not None  # Slurm shows her tag: only its state tells
        site.drop(ALICE, "register", spec_payload(), job=plain)
        site.drop(ALICE, "register", spec_payload(), job=held)
        with caplog.at_level(logging.INFO):
            assert site.drain() == DrainResult(accepted=1, rejected=1)
        assert site.job(plain) is None  # unmanaged: never planned, its GPUs foreign
        adopted = site.job(held)
        assert adopted is not None and adopted.owner_uid == munge_users[ALICE]
        why = f"Slurm job {plain} is not pending held"
        assert any(why in r for r in site.reasons())
        assert why in caplog.text
        # the refusal changed nothing on Slurm: her job runs on as she submitted it
        after = cluster.poll(job_ids=[plain])[plain]
        assert (after.state, after.gres, after.comment) == ("RUNNING", before.gres, before.comment)
        # and a later register of it is refused again: still not held
        site.drop(ALICE, "register", spec_payload(), job=plain, seq=1)
        assert site.drain() == DrainResult(rejected=1)
        assert site.job(plain) is None
    finally:
        for job in (plain, held):
            cluster.cancel(job_id=job)


def test_an_array_job_with_the_tag_is_not_adopted(site: Site, munge_users: dict[str, int]) -> None:
    """Alice submits a held array job of four tasks with the icefrog tag and registers it as
    ``icefrog submit`` would: Slurm would release and start every task of it by the one id
    the controller updates, so it is refused (the reason logged and recorded) and stays
    unmanaged; her single held job is adopted."""
    cluster = backend()
    site.inbox.slurm_jobs = slurm_jobs_of(cluster)
    key = uuid.uuid4().hex[:8]
    array = held_job_as(ALICE, "--array=0-3", f"--comment=icefrog:{key}")
    single = held_job_as(ALICE, f"--comment=icefrog:{key}-single")
    try:
        assert cluster.poll(job_ids=[array])[array].compound
        site.drop(ALICE, "register", spec_payload(), job=array)
        site.drop(ALICE, "register", spec_payload(), job=single)
        assert site.drain() == DrainResult(accepted=1, rejected=1)
        assert site.job(array) is None and site.job(single) is not None
        why = f"Slurm job {array} is an array or heterogeneous job"
        assert any(why in r for r in site.reasons())
    finally:
        for job in (array, single):
            cluster.cancel(job_id=job)


def test_a_resubmitted_job_registers_once_it_runs(site: Site, munge_users: dict[str, int]) -> None:
    """The controller's resubmission (gpu -> shard: a new Slurm job as Alice, signed tag,
    held), linked and released as reconcile does; its register is then accepted."""
    signer = TagSigner(secrets.token_bytes(32))
    cluster = backend(signer)
    site.inbox.slurm_jobs = slurm_jobs_of(cluster)
    key = uuid.uuid4().hex[:8]
    first = held_job_as(ALICE, f"--comment=icefrog:{key}", "-J", f"cnn-{key}")
    new = ""
    try:
        site.drop(ALICE, "register", spec_payload(), job=first)
        assert site.drain() == DrainResult(accepted=1)
        job = site.job(first)
        assert job is not None
        new = cluster.resubmit(job_id=first, owner_uid=munge_users[ALICE], gres=Gres("shard", 2))
        tag = cluster.poll(job_ids=[new])[new].tag
        assert tag is not None and tag.previous_id == first
        assert signer.signed(tag, owner_uid=munge_users[ALICE])
        with site.inbox.store.transaction() as tx:
            tx.link_slurm_job(
                job_id=job.id, slurm_job_id=new, reason="resubmitted", now=time.time()
            )
        cluster.release_now(job_id=new)
        running(cluster, new)
        site.drop(ALICE, "register", spec_payload(), job=new)
        assert site.drain() == DrainResult(accepted=1)
        linked = site.job(new)
        assert linked is not None and linked.id == job.id
    finally:
        for sid in (first, new):
            if sid:
                cluster.cancel(job_id=sid)
