"""Pure builders of the Slurm command lines the CLI backend runs (argv tuples, no I/O).

Each builder returns the exact argv; tests pin them. Verified on 22.05 (see
/work/shared/notes/slurm.md): ``NumNodes`` must be given as ``N-N`` to change a job
submitted with -N1, a requeued job needs ``StartTime=now`` or it waits ~120 s, and
``scancel --batch`` signals only the batch shell.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from icefrog_slurm.slurm.port import Gres, SubmitRequest

Argv = tuple[str, ...]

# squeue fields, '|'-separated; the comment (%k) is last because it may contain '|'.
SQUEUE_FORMAT = "%i|%T|%b|%D|%N|%r|%Q|%U|%P|%k"
SINFO_FORMAT = "%N|%t|%G"


def sbatch_held(request: SubmitRequest) -> Argv:
    """``sbatch --parsable -H --requeue`` with the decided resources; script read from stdin."""
    argv: list[str] = [
        "sbatch",
        "--parsable",
        "--hold",
        "--requeue",
        f"--job-name={request.name}",
        f"--comment={request.tag.comment()}",
        f"--gres={request.gres}",
        f"--nodes={request.num_nodes}-{request.num_nodes}",
    ]
    if request.nodes:
        argv.append(f"--nodelist={','.join(request.nodes)}")
    if request.partition:
        argv.append(f"--partition={request.partition}")
    if request.output:
        argv.append(f"--output={request.output}")
    if request.workdir:
        argv.append(f"--chdir={request.workdir}")
    if request.time_limit:
        argv.append(f"--time={request.time_limit}")
    return tuple(argv)


def as_user(argv: Argv, *, uid: int, gid: int, user: str | None) -> Argv:
    """Run ``argv`` as another user (root only): ``setpriv`` with that uid, gid and groups."""
    groups = "--init-groups" if user is not None else "--clear-groups"
    return ("setpriv", f"--reuid={uid}", f"--regid={gid}", groups, "--", *argv)


def release(job_id: str) -> Argv:
    return ("scontrol", "release", job_id)


def update_job(
    job_id: str,
    *,
    gres: Gres | None = None,
    num_nodes: int | None = None,
    nodes: Sequence[str] | None = None,
    start_now: bool = False,
) -> Argv:
    """``scontrol update jobid=X`` with only the fields given (nodes=() clears the pin)."""
    argv: list[str] = ["scontrol", "update", f"jobid={job_id}"]
    if num_nodes is not None:
        argv.append(f"NumNodes={num_nodes}-{num_nodes}")
    if gres is not None:
        argv.append(f"Gres={gres}")
    if nodes is not None:
        argv.append(f"ReqNodeList={','.join(nodes)}" if nodes else "ReqNodeList=")
    if start_now:
        argv.append("StartTime=now")
    if len(argv) == 3:
        raise ValueError("update_job needs at least one field to change")
    return tuple(argv)


def signal_batch(job_id: str, signal: str) -> Argv:
    return ("scancel", "--batch", f"--signal={signal}", job_id)


def requeue_hold(job_id: str) -> Argv:
    return ("scontrol", "requeuehold", job_id)


def hold(job_id: str) -> Argv:
    return ("scontrol", "hold", job_id)


def cancel(job_id: str) -> Argv:
    return ("scancel", job_id)


def squeue_jobs(job_ids: Collection[str]) -> Argv:
    """One squeue call for many jobs, every state (finished ones until MinJobAge)."""
    return ("squeue", "-h", "-t", "all", "-j", ",".join(sorted(job_ids)), "-o", SQUEUE_FORMAT)


def squeue_all() -> Argv:
    """Every job Slurm knows, for capacity and for finding a submission by its comment."""
    return ("squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT)


def squeue_named(name: str) -> Argv:
    """Jobs of one name (every user, every state): finds a submission by name and comment."""
    return ("squeue", "-h", "-t", "all", "-n", name, "-o", SQUEUE_FORMAT)


def show_job(job_id: str) -> Argv:
    return ("scontrol", "-o", "show", "job", job_id)


def show_job_detail(job_id: str) -> Argv:
    return ("scontrol", "show", "job", "-d", job_id)


def batch_script(job_id: str) -> Argv:
    return ("scontrol", "write", "batch_script", job_id, "-")


def sinfo_partition(partition: str) -> Argv:
    return ("sinfo", "-h", "-N", "-p", partition, "-o", SINFO_FORMAT)


def hostnames(nodelist: str) -> Argv:
    return ("scontrol", "show", "hostnames", nodelist)


def resubmit(
    detail_name: str,
    *,
    comment: str,
    gres: Gres,
    num_nodes: int,
    nodes: Sequence[str],
    partition: str,
    work_dir: str,
    std_out: str | None,
    std_err: str | None,
    time_limit: str,
) -> Argv:
    """sbatch (held) of a job's own script read from stdin, with its name, paths and limits."""
    argv: list[str] = [
        "sbatch",
        "--parsable",
        "--hold",
        "--requeue",
        f"--job-name={detail_name}",
        f"--comment={comment}",
        f"--gres={gres}",
        f"--nodes={num_nodes}-{num_nodes}",
        f"--partition={partition}",
        f"--chdir={work_dir}",
    ]
    if nodes:
        argv.append(f"--nodelist={','.join(nodes)}")
    if std_out:
        argv.append(f"--output={std_out}")
    if std_err and std_err != std_out:
        argv.append(f"--error={std_err}")
    if time_limit and time_limit not in ("UNLIMITED", "Partition_Limit"):
        argv.append(f"--time={time_limit}")
    return tuple(argv)
