"""``icefrog sacct``, ``squeue`` and ``show job`` run through the real CLI over a store
populated with the store's own write API (populate.py), on SQLite and on Postgres."""

from __future__ import annotations

import json

import pytest

from icefrog_slurm.cli import main
from icefrog_slurm.store.sql import SqlStore


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


SACCT_DEFAULT = """\
JobID       JobName      User      State              Submit               Start                 End        JCT        TTA GPUHours Restarts Reallocations FinalMetric Reached
-------- ---------- --------- ---------- ------------------- ------------------- ------------------- ---------- ---------- -------- -------- ------------- ----------- -------
1               cnn     alice  COMPLETED 2026-11-20T08:00:00 2026-11-20T08:01:00 2026-11-20T11:00:00   03:00:00   02:30:00     8.97        2             2       0.951     yes
2              bert       bob    PENDING 2026-11-20T08:01:40             Unknown             Unknown   03:18:20                0.00        0             0                  no
3               ncf     alice    RUNNING 2026-11-20T09:56:40 2026-11-20T10:01:40             Unknown   01:23:20                1.31        0             0        0.61      no
5               new     alice    PENDING 2026-11-20T10:00:50             Unknown             Unknown   01:19:10                0.00        0             0                  no
"""  # noqa: E501


def test_sacct_default_table_since_midnight(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # the default window starts at 00:00 today: job 4 (ended yesterday) is left out
    assert run(capsys, "sacct", *db) == (0, SACCT_DEFAULT, "")


def test_sacct_parsable_format_and_widths(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    fmt = "jobid,User,SlurmJobIDs,GPUHours,Restarts,Reallocations,TTA,Elapsed,Reached,State"
    code, out, _ = run(capsys, "sacct", *db, "-S", "now-3days", "-P", "--format", fmt)
    assert code == 0
    assert out == (
        "JobID|User|SlurmJobIDs|GPUHours|Restarts|Reallocations|TTA|Elapsed|Reached|State\n"
        "1|alice|100,107|8.97|2|2|02:30:00|02:59:00|yes|COMPLETED\n"
        "2|bob|200|0.00|0|0||00:00:00|no|PENDING\n"
        "3|alice|300|1.31|0|0||01:18:20|no|RUNNING\n"
        "4|carol|50|0.00|0|0||00:00:00|no|FAILED\n"
        "5|alice|400|0.00|0|0||00:00:00|no|PENDING\n"
    )
    code, out, _ = run(capsys, "sacct", *db, "-j", "1", "-p", "-n", "--format", "JobID,JCT")
    assert (code, out) == (0, "1|03:00:00|\n")  # -p ends every line with '|'
    code, out, _ = run(
        capsys, "sacct", *db, "-j", "1,3", "--format", "JobName%-5,User%3,End%12,Target"
    )
    assert out == (
        "JobNa Use          End         Target\n"
        "----- --- ------------ --------------\n"
        "cnn   al+ 2026-11-20T1  val_acc>=0.94\n"  # a time is cut plainly, as sacct
        "ncf   al+      Unknown  val_acc>=0.94\n"
    )


def test_sacct_json_gpu_hours_restarts_and_tta(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "sacct", *db, "-S", "2026-11-18", "--json")
    assert code == 0
    jobs = {j["job_id"]: j for j in json.loads(out)["jobs"]}
    assert sorted(jobs) == [1, 2, 3, 4, 5]
    cnn = jobs[1]
    # 2 GPUs over [T0+60, T0+1800], 4 over [1800, 5400], 0 over [5400, 7200], 4 to the end
    assert cnn["gpu_hours"] == pytest.approx((2 * 1740 + 4 * 3600 + 4 * 3600) / 3600)
    assert (cnn["restarts"], cnn["reallocations"]) == (2, 2)
    assert (cnn["tta_s"], cnn["jct_s"], cnn["elapsed_s"]) == (9000.0, 10800.0, 10740.0)
    assert cnn["slurm_job_ids"] == ["100", "107"] and cnn["target_reached"] is True
    assert cnn["final_metric"] == 0.951 and cnn["finish_reason"] == "target_reached"
    # a running job is charged up to now: 1 shared GPU since T0+7300, now T0+12000
    assert jobs[3]["gpu_hours"] == pytest.approx(4700 / 3600)
    assert jobs[3]["final_metric"] == 0.61 and jobs[3]["end_time"] is None
    assert jobs[4]["state"] == "FAILED" and jobs[4]["start_time"] is None


@pytest.mark.parametrize(
    ("argv", "ids"),
    [
        (["-u", "alice"], "1,3,5"),
        (["-u", "bob,1003", "-S", "now-3days"], "2,4"),  # names and uids
        (["-j", "107"], "1"),  # a Slurm id of job 1's chain
        (["-j", "100,2"], "1,2"),  # an old Slurm id and an icefrog id
        (["-j", "50"], "4"),  # -j without -S: no 00:00-today window
        (["-s", "R,completed"], "1,3"),
        (["-S", "now-3days", "-E", "2026-11-20T07:00"], "4"),
        (["-S", "11/19-07:00", "-E", "11/20/26-08:00:30"], "1,4"),
        (["-S", "09:58", "-E", "now-1hours"], "1,2,3,5"),
        (["-S", "11:10"], "2,3,5"),  # job 1 ended at 11:00
        (["-S", "11:30"], "1,2,3,5"),  # now is 11:20: 11:30 is yesterday's
        (["-E", "08:01"], "1"),
    ],
)
def test_sacct_filters(
    db: list[str], capsys: pytest.CaptureFixture[str], argv: list[str], ids: str
) -> None:
    code, out, err = run(capsys, "sacct", *db, "-P", "-n", "--format", "JobID", *argv)
    assert (code, err) == (0, "")
    assert ",".join(out.split()) == ids


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--format", "JobID,Bogus%8"], "--format: unknown field 'Bogus'"),
        (["--format", "JobID%0"], "the width must be at least 1"),
        (["-S", "2026-13-01"], "--starttime '2026-13-01': not a time"),
        (["-E", "now-3fortnights"], "--endtime 'now-3fortnights': not a time"),
        (["-j", "12a"], "--jobs: '12a' is not a job id"),
        (["-s", "ZOMBIE"], "--state: unknown job state 'ZOMBIE'"),
    ],
)
def test_sacct_bad_input_exits_2_naming_it(
    db: list[str], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "sacct", *db, *argv)
    assert (code, out) == (2, "")
    assert err.startswith("icefrog sacct: error: ") and message in err


SQUEUE_DEFAULT = """\
   JOBID   SLURMJOBID       NAME      USER ST       TIME GPUS SHARED BATCH FROZEN   PSI    PREDTTA ICESHARE NODELIST(REASON)
       2          200       bert       bob PD   00:00:00    1    yes    64      0   N/A        N/A    0.500 (Starting)
       3          300        ncf     alice  R   01:18:20    1    yes    32      0 1.000        N/A    0.600 n3
       5          400        new     alice PD   00:00:00  N/A    N/A   N/A    N/A   N/A        N/A      N/A (NotDecided)
"""  # noqa: E501


def test_squeue_table_options_and_json(db: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "squeue", *db) == (0, SQUEUE_DEFAULT, "")
    code, out, _ = run(
        capsys, "squeue", *db, "-h", "-t", "all", "-u", "alice", "-o", "JobID,State,GPUs,Reason"
    )
    assert out == (
        "       1 COMPLETED    4\n       3   RUNNING    1\n       5   PENDING  N/A NotDecided\n"
    )
    code, out, _ = run(capsys, "squeue", *db, "-j", "107,200", "-t", "CD,PD", "-o", "JobID%-3")
    assert out == "JOB\n1\n2\n"
    code, out, _ = run(capsys, "squeue", *db, "--json", "-j", "1,3", "-t", "all")
    doc = json.loads(out)
    assert (doc["meta"]["Slurm"]["release"], doc["errors"], doc["warnings"]) == ("22.05", [], [])
    assert doc["meta"]["plugin"]["type"] == "icefrog"
    jobs = doc["jobs"]
    assert [j["job_id"] for j in jobs] == [1, 3]
    assert jobs[0] | {"time_s": None} == {
        "job_id": 1,
        "slurm_job_id": "107",
        "name": "cnn",
        "user": "alice",
        "partition": "gpu",
        "state": "COMPLETED",
        "time_s": None,
        "round": 5,
        "gpus": 4,
        "shared": False,
        "nodes": "n[1-2]",
        "batch": 64,
        "frozen": 2,
        "psi": 0.7,
        "predicted_tta_s": 3000,
        "ice_share": 1.0,
        "reason": None,
    }
    assert (jobs[1]["shared"], jobs[1]["time_s"], jobs[1]["nodes"]) == (True, 4700, "n3")
    code, _, err = run(capsys, "squeue", *db, "-o", "JobID,Nope")
    assert code == 2 and "unknown field 'Nope'" in err


SHOW_JOB_1 = """\
JobId=1 JobName=cnn UserId=alice(1001)
   JobState=COMPLETED FinishReason=target_reached Epoch=0
   Reason=(None)
   SlurmJobIds=100,107 Restarts=2 Reallocations=2
   SubmitTime=2026-11-20T08:00:00 StartTime=2026-11-20T08:01:00 EndTime=2026-11-20T11:00:00
   JCT=03:00:00 TTA=02:30:00 GPUHours=8.97
   Target=val_acc>=0.94 FinalMetric=0.951 Reached=yes
   Spec=gpus:1-4,batch:32-256,max_frozen_fraction:0.9,layers:3

Trajectory: 4 of 5 rounds changed the decision
 Round                Time GPUs Shared Batch Frozen   Psi    PredTTA IceShare NodeList
------ ------------------- ---- ------ ----- ------ ----- ---------- -------- --------------------
     1 2026-11-20T08:00:00    2     no    64      0 1.000   02:00:00    0.900 n1
     2 2026-11-20T08:30:00    4     no    64      2 0.800   01:23:20    1.000 n[1-2]
     4 2026-11-20T09:30:00    0     no    64      2 0.800
     5 2026-11-20T10:00:00    4     no    64      2 0.700   00:50:00    1.000 n[1-2]

Slurm actions: latest 2 of 3
               Time Action       Outcome  RC SlurmJobID Command                                  Detail
------------------- ------------ ------- --- ---------- ---------------------------------------- ------------------------------
2026-11-20T08:30:10 resubmit     ok        0        107 sbatch --hold job.sh
2026-11-20T10:00:01 release      ok        0        107 scontrol release 107
"""  # noqa: E501


def test_show_job_trajectory_chain_and_actions(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "show", "job", "1", *db, "--actions", "2") == (0, SHOW_JOB_1, "")
    # any Slurm id of the chain names the same job
    assert run(capsys, "show", "job", "100", "--slurm", *db, "--actions", "2")[1] == SHOW_JOB_1
    code, out, _ = run(capsys, "show", "job", "300", *db, "--json")
    detail = json.loads(out)
    assert detail["job"]["job_id"] == 3 and detail["rounds_decided"] == 1
    assert detail["trajectory"] == [
        {
            "round": 5,
            "time": detail["trajectory"][0]["time"],
            "gpus": 1,
            "batch": 32,
            "frozen": 0,
            "shared": True,
            "nodes": "n3",
            "psi": 1.0,
            "predicted_tta_s": None,
            "share": 0.6,
            "predicted_util": None,  # eq 8's prediction: none recorded for this round
            "predicted_mem_bytes": None,
        }
    ]
    assert detail["actions"] == [] and detail["actions_total"] == 0
    code, out, err = run(capsys, "show", "job", "999", *db)
    assert (code, out) == (1, "") and "no icefrog job with" in err and "999" in err
    code, _, err = run(capsys, "show", "job", "2", "--slurm", *db)
    assert code == 1 and "no icefrog job with Slurm job id 2" in err
    code, _, err = run(capsys, "show", "job", "1", "--actions", "-1", *db)
    assert code == 2 and "--actions -1: must be 0 or more" in err
    code, _, err = run(capsys, "show", "job", "1,2", *db)
    assert code == 2 and "ID: '1,2' is not a job id" in err


def test_show_job_id_that_is_also_another_jobs_slurm_id_is_refused(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "show", "job", "50", *db)  # no icefrog job 50: Slurm 50 is job 4
    assert code == 0
    store = SqlStore(db[1])
    try:
        with store.transaction() as tx:
            tx.link_slurm_job(job_id=4, slurm_job_id="3", reason="resubmitted", now=0.0)
    finally:
        store.close()
    code, _, err = run(capsys, "show", "job", "3", *db)
    assert code == 2 and "3 is icefrog job 3 and also Slurm job 3 of icefrog job 4" in err
    code, out, _ = run(capsys, "show", "job", "3", "--slurm", *db)
    assert code == 0 and out.startswith("JobId=4 JobName=old")


def test_a_missing_sqlite_file_is_not_created(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "absent.db"
    code, _, err = run(capsys, "sacct", "--db", f"sqlite:///{path}")
    assert code == 2 and f"no state store at {path}" in err and not path.exists()


def test_a_waiting_jobs_recorded_reason_reaches_squeue_and_show(
    db: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A round that leaves a job waiting records the policy's reason; squeue shows its word
    and `show job` the whole text; a reason without a word reads as Resources."""
    from tests.integration.report.populate import NOW, _alloc

    store = SqlStore(db[1])
    try:
        with store.transaction() as tx:
            n = tx.next_round_no()
            tx.record_round(
                round_no=n,
                now=NOW - 60,
                policy="icefrog",
                capacity_gpus=8,
                allocations=[_alloc(2, 0, ()), _alloc(5, 0, ()), _alloc(3, 1, ("n3",))],
                reasons={2: "EstimateFailed: ValueError: grad_var[3] is NaN", 5: "odd text"},
            )
            assert tx.round(n) is not None
    finally:
        store.close()
    code, out, _ = run(capsys, "squeue", *db, "--json", "-t", "all")
    assert code == 0
    reasons = {row["job_id"]: row["reason"] for row in json.loads(out)["jobs"]}
    assert reasons == {1: None, 2: "EstimateFailed", 3: None, 4: None, 5: "Resources"}
    code, out, _ = run(capsys, "show", "job", "2", *db)
    assert code == 0
    assert "Reason=EstimateFailed: ValueError: grad_var[3] is NaN" in out
    code, out, _ = run(capsys, "show", "job", "3", *db)
    assert "Reason=(None)" in out
