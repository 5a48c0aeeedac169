"""Parsers and builders of icefrog_slurm.slurm, pinned by golden Slurm output captured from
the real daemons of 22.05, 24.11 and 26.05 (tests/golden)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from icefrog_slurm.domain.cluster import Gres, IcefrogTag, SlurmJobState
from icefrog_slurm.slurm import capacity, commands, parse
from icefrog_slurm.slurm.port import (
    GresAllocation,
    NodeGpus,
    SlurmJobDetail,
    SlurmUnavailable,
    SubmitRequest,
)

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
VERSIONS = ["slurm-22.05", "slurm-24.11", "slurm-26.05"]


def golden(version: str, name: str) -> str:
    return (GOLDEN / version / name).read_text()


def live_by_key(jobs: Mapping[str, SlurmJobState | SlurmJobDetail], key: str) -> Any:
    [job] = [j for j in jobs.values() if j.tag and j.tag.key == key and j.state != "CANCELLED"]
    return job


def golden_jobs(version: str = "slurm-22.05") -> dict[str, SlurmJobDetail]:
    return parse.parse_squeue_json(golden(version, "squeue.json"))


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_json_golden(version: str) -> None:
    jobs = golden_jobs(version)
    held = live_by_key(jobs, "golden-held")
    view = held.state_view()
    assert (view.state, view.reason, view.held, view.admin_held) == (
        "PENDING",
        "JobHeldUser",
        True,
        False,
    )
    assert held.gres == Gres("gpu", 2) and held.num_nodes == 1 and held.priority == 0
    assert (held.user_id, held.group_id, held.partition, held.time_limit_min) == (0, 0, "gpu", None)
    assert held.nodelist is None and held.req_nodes is None
    run = live_by_key(jobs, "golden-run")
    assert run.state_view().holds_resources and run.nodelist == "node[1-2]"
    assert run.num_nodes == 2 and run.restarts == 0 and run.name == "icefrog-run"
    start = json.loads(golden(version, "squeue.json"))["jobs"]
    [raw] = [r for r in start if str(r["job_id"]) == run.job_id]
    number = raw["start_time"]  # 22.05: a number; later: {"set", "infinite", "number"}
    number = number["number"] if isinstance(number, dict) else number
    assert run.state_view().started_at == float(number) > 1.7e9  # when this run began
    assert view.started_at is None  # pending: start_time is Slurm's estimate (0)
    shard = live_by_key(jobs, "golden-shard")
    assert shard.gres == Gres("shard", 1) and shard.req_nodes == "node3"
    assert shard.tag == IcefrogTag("golden-shard", previous_id=held.job_id)
    [foreign] = [j for j in jobs.values() if j.name == "foreign"]
    assert foreign.user_id == 65534 and foreign.tag is None and foreign.gres == Gres("gpu", 1)
    assert (foreign.mem_per_gpu_mb, foreign.cpus_per_gpu) == (450, 1)  # slurm.conf's defaults
    [gone] = [j for j in jobs.values() if j.tag and j.tag.key == "golden-gone"]
    assert gone.state == "CANCELLED" and gone.gres == Gres("gpu", 1)
    done = [j.state_view() for j in jobs.values() if j.state == "CANCELLED"]
    assert done and all(j.finished and not j.holds_resources for j in done)
    # the output path as submitted (22.05, 26.05) or expanded (24.11): a resubmission's
    # pattern is the same either way
    from icefrog_slurm.slurm.cli_backend import _job_pattern

    assert run.std_out.endswith((f"/{run.job_id}.out", "/%j.out"))
    assert _job_pattern(run.std_out, run.job_id) == run.std_out.rpartition("/")[0] + "/%j.out"


@pytest.mark.parametrize("version", VERSIONS)
def test_hostile_fields_cannot_pass_for_slurm_fields(version: str) -> None:
    """nobody's held job: a name with a newline and a fake squeue line, a comment that
    claims an icefrog tag of job 1 and a second record, a work dir that says UserId=root."""
    jobs = golden_jobs(version)
    [hostile] = [j for j in jobs.values() if j.name.startswith("hostile")]
    assert (hostile.user_id, hostile.group_id) == (65534, 65534)
    assert "UserId=root(0)" in hostile.work_dir
    assert hostile.name == "hostile\n1|RUNNING|gres:gpu:4"
    assert hostile.tag == IcefrogTag(
        "decoy", previous_id="1", signature="00\nJobId=1 UserId=root(0)"
    )
    assert hostile.gres == Gres("gpu", 1) and hostile.state == "PENDING"
    assert "1" not in jobs or jobs["1"].user_id != 65534


def test_squeue_json_skips_a_record_it_cannot_read() -> None:
    doc = json.loads(golden("slurm-22.05", "squeue.json"))
    good = len(doc["jobs"])
    doc["jobs"].append({"job_id": 99, "user_id": "root", "group_id": 0, "job_state": "RUNNING"})
    doc["jobs"].append({"job_id": 98, "user_id": 0, "group_id": 0, "job_state": ["RUNNING"],
                        "tres_per_node": ["not", "a", "string"]})  # fmt: skip
    doc["jobs"].append("not a record")
    assert len(parse.parse_squeue_json(json.dumps(doc))) == good
    with pytest.raises(parse.ParseError, match="not a job list"):
        parse.parse_squeue_json('{"jobs": 5}')


def test_squeue_json_saying_slurmctld_is_away_is_no_empty_queue() -> None:
    """What 22.05's squeue --json prints, exit code 0, with slurmctld stopped."""
    down = {
        "meta": {"plugin": {"type": "openapi/v0.0.38"}},
        "errors": [
            {
                "description": "Failed while looking for jobs",
                "error_number": -1,
                "error": "Unspecified error",
                "source": "slurm_load_jobs",
            }
        ],
        "jobs": [],
    }
    with pytest.raises(SlurmUnavailable, match="slurm_load_jobs Failed while looking"):
        parse.parse_squeue_json(json.dumps(down))


def test_squeue_json_newer_layout() -> None:
    """data_parser v0.0.40+ (23.11 and later): numbers as set/infinite/number objects, the
    state as a list of flags."""
    record = {
        "job_id": 7,
        "user_id": 1001,
        "group_id": 1001,
        "job_state": ["PENDING", "REQUEUED"],
        "state_reason": "JobHeldAdmin",
        "priority": {"set": True, "infinite": False, "number": 0},
        "node_count": {"set": True, "infinite": False, "number": 2},
        "time_limit": {"set": False, "infinite": True, "number": 0},
        "tres_per_node": "gres/gpu:a800:2",
        "comment": "icefrog:k;prev=5;sig=abc",
        "name": "n",
    }
    [job] = parse.parse_squeue_json(json.dumps({"jobs": [record]})).values()
    assert (job.job_id, job.state, job.num_nodes, job.time_limit_min) == ("7", "PENDING", 2, None)
    assert job.gres == Gres("gpu", 2) and job.state_view().admin_held
    assert job.tag == IcefrogTag("k", previous_id="5", signature="abc")


def _allocations(version: str, key: str) -> tuple[GresAllocation, ...]:
    job = live_by_key(golden_jobs(version), key)
    return parse.gres_allocations(job.gres_detail, job.nodelist or "")


@pytest.mark.parametrize("version", VERSIONS)
def test_array_and_heterogeneous_jobs_are_compound(version: str) -> None:
    """Slurm acts on every task of an array, or part of a heterogeneous job, by one id: such
    a job is marked, whatever its comment says (22.05 numbers, 24.11 number objects)."""
    doc = json.loads(golden(version, "squeue.json"))
    [record] = [r for r in doc["jobs"] if r["name"] == "icefrog-held"]

    def compound(**fields: Any) -> bool:
        one = {**record, **fields}
        [job] = parse.parse_squeue_json(json.dumps({**doc, "jobs": [one]})).values()
        return job.compound and job.state_view().compound

    number = record["array_job_id"]
    set_to = (lambda n: n) if isinstance(number, int) else (lambda n: {**number, "number": n})
    assert not compound()
    assert compound(array_job_id=set_to(7), array_task_string="0-63")  # pending: not split
    assert compound(array_job_id=set_to(7))  # a task started out of it
    assert compound(het_job_id=set_to(7))


@pytest.mark.parametrize("version", VERSIONS)
def test_gres_detail_golden(version: str) -> None:
    """The golden squeue's running jobs: gpu:2 on node[1-2] (one entry a node), a shard on
    node3 (22.05 ``IDX:0``, 24.11 ``1/2,0/2,...``)."""
    gpu = _allocations(version, "golden-run")
    assert [(a.nodes, a.kind, a.count, a.indices) for a in gpu] == [
        (("node1",), "gpu", 2, (0, 1)),
        (("node2",), "gpu", 2, (0, 1)),
    ]
    [shard] = _allocations(version, "golden-shard")
    assert (shard.nodes, shard.kind, shard.count, shard.indices) == (("node3",), "shard", 1, (0,))


# every character str.splitlines ends a line at, besides \n and \r
SPLITLINES_BREAKS = ["\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("brk", SPLITLINES_BREAKS)
def test_a_comment_with_any_line_break_cannot_forge_a_gres_line(version: str, brk: str) -> None:
    """A user's shard job whose comment (or name) breaks the line, followed by a forged
    ``Nodes=... GRES=...`` line (what ``scontrol show job -d`` prints): the job's
    allocation is Slurm's own, from its JSON record."""
    doc = json.loads(golden(version, "squeue.json"))
    [record] = [r for r in doc["jobs"] if r["name"] == "icefrog-shard"]
    want = _allocations(version, "golden-shard")
    for forged in ("shard:1(IDX:z)", "shard:1(IDX:0-999999999999)", "gpu:4(IDX:0-3)"):
        record["comment"] = f"x{brk}     Nodes=node3 CPU_IDs=0 Mem=400 GRES={forged}"
        record["name"] = f"n{brk}Nodes=node3 GRES={forged}"
        [job] = parse.parse_squeue_json(json.dumps({**doc, "jobs": [record]})).values()
        assert parse.gres_allocations(job.gres_detail, job.nodelist or "") == want


@pytest.mark.parametrize(
    "gres",
    [
        "shard:1(IDX:z)",
        "shard:1(IDX:0-999999999999)",  # a range that would fill the daemon's memory
        "shard:1(IDX:3-1)",
        "shard:1(IDX:0-4096)",
        "shard:1(IDX:-1)",
        "shard:1(x/2)",  # 24.11's used/available form, not numbers
        "shard:1(1/2,0/2,z)",
        "shard:99999999999(IDX:0)",
    ],
)
def test_gres_allocations_slurm_never_prints_are_parse_errors(gres: str) -> None:
    """A ParseError, never a ValueError, and never a huge range; so is a detail that is not
    one entry a node."""
    with pytest.raises(parse.ParseError, match="not understood"):
        parse.gres_allocations((gres,), "node3")
    with pytest.raises(parse.ParseError, match="gres_detail of 1 nodes"):
        parse.gres_allocations(("gpu:1(IDX:0)",), "node[1-2]")


def test_gres_index_lists_slurm_prints() -> None:
    assert parse.parse_index_list("0-1,3") == (0, 1, 3)
    assert parse.parse_index_list("") == ()
    assert parse.parse_index_list("4095") == (4095,)


@pytest.mark.parametrize("version", VERSIONS)
def test_sinfo_and_hostnames_golden(version: str) -> None:
    nodes = parse.parse_sinfo_nodes(golden(version, "sinfo.txt"))
    assert [(n.name, n.gpus, n.shards, n.usable) for n in nodes] == [
        (f"node{i}", 4, 8, True) for i in range(1, 5)
    ]
    # a node the backfill scheduler plans for a pending job is up, its GPUs free: counted
    planned = parse.parse_sinfo_nodes(golden(version, "sinfo-planned.txt"))
    assert [(n.name, n.state, n.usable) for n in planned][2:] == [
        ("node3", "plnd", True),
        ("node4", "mix" if version == "slurm-22.05" else "mix-", True),
    ]
    names = parse.parse_hostnames(golden(version, "hostnames.txt"))
    assert (
        names == parse.expand_hostlist("node[1-3],node4") == tuple(f"node{i}" for i in range(1, 5))
    )


def test_version_folders_hold_the_same_files() -> None:
    files = {v: sorted(p.name for p in (GOLDEN / v).iterdir()) for v in VERSIONS}
    assert len({tuple(f) for f in files.values()}) == 1, files
    assert "squeue.json" in files["slurm-22.05"]
    for version in VERSIONS:
        assert golden(version, "version.txt").startswith(f"slurm-wlm {version[6:]}.")


@pytest.mark.parametrize(
    ("version", "refusal", "after"),
    [
        ("slurm-22.05", "Invalid generic resource", "gres:gpu:2"),
        ("slurm-24.11", "", "gres/shard:2"),
        ("slurm-26.05", "", "gres/shard:2"),
    ],
)
def test_pending_job_changing_gpu_to_shard(version: str, refusal: str, after: str) -> None:
    """22.05 refuses it; newer versions accept it (the backend resubmits on every version)."""
    said = golden(version, "update-gpu-to-shard.txt")
    assert (refusal in said) if refusal else said == ""
    assert golden(version, "gres-after-update.txt").strip() == after
    assert parse.parse_gres_request(after) == Gres("shard" if "shard" in after else "gpu", 2)


def test_capacity_from_golden_excludes_foreign_gpus() -> None:
    nodes = parse.parse_sinfo_nodes(golden("slurm-22.05", "sinfo.txt"))
    jobs = [d.state_view() for d in golden_jobs().values()]
    cap = capacity.partition_capacity(partition="gpu", nodes=nodes, jobs=jobs)
    assert cap.total_gpus == 16 and cap.foreign_gpus == 1 and cap.available_gpus == 15
    assert {n.name: n.foreign_gpus for n in cap.nodes}["node4"] == 1
    assert len(cap.foreign_job_ids) == 1


def _job(jid: str, gres: Gres, nodelist: str, *, tag: IcefrogTag | None = None) -> SlurmJobState:
    return SlurmJobState(jid, "RUNNING", gres, 1, nodelist, "None", 1, 1000, "gpu", "", tag)


def test_capacity_shards_down_nodes_and_other_partitions() -> None:
    nodes = [
        NodeGpus("n1", "mix", 4, 8),
        NodeGpus("n2", "down*", 4, 8),
        NodeGpus("n3", "idle", 4, 8),
    ]
    jobs = [
        _job("1", Gres("shard", 3), "n1"),  # 3 shards at 2 a GPU: 2 GPUs unless told
        _job("2", Gres("gpu", 4), "n2"),  # on a down node: not counted twice
        _job("3", Gres("gpu", 2), "n3", tag=IcefrogTag("k")),  # icefrog's own
        _job("4", Gres("gpu", 1), "other[1-2]"),  # nodes outside the partition
    ]
    cap = capacity.partition_capacity(partition="gpu", nodes=nodes, jobs=jobs)
    assert (cap.total_gpus, cap.foreign_gpus, cap.available_gpus) == (8, 2, 6)
    jobs[0] = replace(jobs[0], gpus_by_node=(("n1", 3),))  # Slurm put its shards on 3 GPUs
    told = capacity.partition_capacity(partition="gpu", nodes=nodes, jobs=jobs)
    assert told.foreign_gpus == 3


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gres:gpu:2", Gres("gpu", 2)),
        ("gres/gpu:2", Gres("gpu", 2)),
        ("gres/gpu:a800:4", Gres("gpu", 4)),
        ("gres:shard:3", Gres("shard", 3)),
        ("gpu:a800:1", Gres("gpu", 1)),
        ("gres/gpu", Gres("gpu", 1)),
        ("gres/gpu:a800", Gres("gpu", 1)),
        ("gres:gpu:²", Gres("gpu", 1)),
        ("N/A", None),
        ("gres/tmpfs:10", None),
    ],
)
def test_gres_request_forms(text: str, want: Gres | None) -> None:
    assert parse.parse_gres_request(text) == want


def test_parse_errors_name_the_text() -> None:
    with pytest.raises(parse.ParseError, match="not a job list"):
        parse.parse_squeue_json("squeue: error: Invalid job id specified")
    with pytest.raises(parse.ParseError, match="no job id"):
        parse.parse_sbatch_parsable("sbatch: error: nope")
    assert parse.parse_sbatch_parsable("42;icefrog-dev\n") == "42"


def test_expand_hostlist_forms() -> None:
    assert parse.expand_hostlist("gpu[08-10],a,b[1,3-4]x") == (
        "gpu08", "gpu09", "gpu10", "a", "b1x", "b3x", "b4x",
    )  # fmt: skip
    assert parse.expand_hostlist("") == () and parse.expand_hostlist("(null)") == ()


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("rack[1-2]-node[01-02]", ("rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02")),
        ("n[001-002]x", ("n001x", "n002x")),
        ("a[1,3-4]b", ("a1b", "a3b", "a4b")),
        ("node7", ("node7",)),
        ("gpu1,gpu2,gpu1", ("gpu1", "gpu2")),
        ("node[098-101]", ("node098", "node099", "node100", "node101")),
        ("r[1-2]n[1-2],x", ("r1n1", "r1n2", "r2n1", "r2n2", "x")),
    ],
)
def test_expand_hostlist_multi_group_padding_plain(text: str, names: tuple[str, ...]) -> None:
    assert parse.expand_hostlist(text) == names


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("n[1-99999999]", "more than 65536 names"),  # refused before expansion
        ("n[1-300]m[1-300]", "more than 65536 names"),  # 90000 names from two groups
        ("n[1-65536],x", "more than 65536 names"),
        ("n[1-99999999999999999999]", "bad range"),
        ("@admins", "not a Slurm hostlist"),  # a ClusterShell group: never resolved
        ("a,b!b", "not a Slurm hostlist"),
        ("n[1-8/2]", "not a Slurm hostlist"),
        ("n[1-2", "missing bracket"),
        ("n[2-1]", "bad range"),
        ("n[a-b]", "bad range"),
        ("node 1", "not a Slurm hostlist"),
    ],
)
def test_expand_hostlist_refuses_hostile_lists(text: str, why: str) -> None:
    with pytest.raises(parse.ParseError, match=why):
        parse.expand_hostlist(text)


def test_expand_hostlist_at_the_cap() -> None:
    assert len(parse.expand_hostlist("n[1-65536]")) == parse.MAX_HOSTLIST_NAMES


@pytest.mark.parametrize(
    ("names", "text"),
    [
        (["node1", "node2", "node4"], "node[1-2,4]"),  # scontrol show hostlist
        (["node9", "node10", "node11"], "node[9-11]"),
        (["node2", "node1"], "node[1-2]"),
        (["rack1-node01", "rack1-node02", "rack2-node01"], "rack1-node[01-02],rack2-node01"),
        (["gpu08", "gpu09", "gpu10", "a"], "a,gpu[08-10]"),
        (["solo"], "solo"),
        ([], ""),
    ],
)
def test_compress_hostlist_like_slurm(names: list[str], text: str) -> None:
    assert parse.compress_hostlist(names) == text
    assert sorted(parse.expand_hostlist(text)) == sorted(names)


def test_compress_hostlist_refuses_odd_names() -> None:
    with pytest.raises(parse.ParseError, match="not a Slurm node name"):
        parse.compress_hostlist(["node1", "@grp"])


def test_tags() -> None:
    assert parse.parse_tag("icefrog:abc;prev=12") == IcefrogTag("abc", "12")
    assert parse.parse_tag("icefrog:abc") == IcefrogTag("abc")
    assert parse.parse_tag("something else") is None and parse.parse_tag("icefrog:") is None
    assert IcefrogTag("abc", "12").comment() == "icefrog:abc;prev=12"
    assert parse.parse_tag("icefrog:abc;prev=12;sig=f00") == IcefrogTag("abc", "12", "f00")
    assert IcefrogTag("abc", "12", "f00").comment() == "icefrog:abc;prev=12;sig=f00"
    assert parse.parse_tag("icefrog:abc;prev=1²") == IcefrogTag("abc")  # not an ASCII id


def test_builders() -> None:
    req = SubmitRequest(
        script="/s.sh",
        tag=IcefrogTag("k1"),
        name="icefrog-k1",
        gres=Gres("shard", 1),
        num_nodes=2,
        nodes=("node1", "node2"),
        partition="gpu",
        output="/o/%j.out",
    )
    assert commands.sbatch_held(req) == (
        "sbatch", "--parsable", "--hold", "--requeue", "--job-name=icefrog-k1",
        "--comment=icefrog:k1", "--gres=shard:1", "--nodes=2-2", "--nodelist=node1,node2",
        "--partition=gpu", "--output=/o/%j.out",
    )  # fmt: skip
    assert commands.update_job("7", gres=Gres("gpu", 4), num_nodes=2, nodes=("node[1-2]",)) == (
        "scontrol", "update", "jobid=7", "NumNodes=2-2", "Gres=gpu:4", "ReqNodeList=node[1-2]",
    )  # fmt: skip
    assert commands.update_job("7", start_now=True)[-1] == "StartTime=now"
    assert commands.update_job("7", nodes=())[-1] == "ReqNodeList="
    with pytest.raises(ValueError, match="at least one field"):
        commands.update_job("7")
    assert commands.signal_batch("7", "USR1") == ("scancel", "--batch", "--signal=USR1", "7")
    assert commands.squeue_json() == ("squeue", "--json", "--states=all")
    assert commands.hold("7") == ("scontrol", "uhold", "7")  # never an administrator's hold
    assert commands.as_user(("sbatch",), uid=1000, gid=100) == (
        "setpriv", "--reuid=1000", "--regid=100", "--init-groups", "--no-new-privs", "--",
        "sbatch",
    )  # fmt: skip
    with pytest.raises(ValueError, match=">= 1"):
        Gres("gpu", 0)


def test_production_examples_comment_every_line() -> None:
    # The Slurm examples (slurm.conf*, gres.conf*); icefrog.toml.example has its own test.
    examples = sorted((GOLDEN.parent.parent / "slurm_conf").glob("*.conf.*example"))
    assert len(examples) >= 5
    for path in examples:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() and not line.startswith("#"):
                assert i and lines[i - 1].startswith("#"), f"{path.name}:{i + 1} has no comment"


def test_resubmitted_output_gets_its_own_file() -> None:
    from icefrog_slurm.slurm.cli_backend import _job_pattern

    assert _job_pattern("/o/16.out", "16") == "/o/%j.out"
    assert _job_pattern("/o16/116.out", "16") == "/o16/116.out"
    assert _job_pattern(None, "16") is None
