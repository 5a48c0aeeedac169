"""Pure builders of the Slurm command lines the CLI backend runs (argv tuples, no I/O).

Each builder returns the exact argv; tests pin them. Verified on 22.05 (see
tests/golden/slurm-22.05/): ``NumNodes`` must be given as ``N-N`` to change a job
submitted with -N1, a requeued job needs ``StartTime=now`` or it waits ~120 s, and
``scancel --batch`` signals only the batch shell.
"""

from __future__ import annotations

from collections.abc import Sequence

from icefrog_slurm.domain.cluster import Gres
from icefrog_slurm.slurm.port import SubmitRequest

Argv = tuple[str, ...]

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
    argv += host_share(request.gres, request.mem_per_gpu_mb, request.cpus_per_gpu)
    return tuple(argv)


def host_share(gres: Gres, mem_per_gpu_mb: int | None, cpus_per_gpu: int | None) -> list[str]:
    """The memory and cores a job asks for besides its GPUs (nothing: slurm.conf's defaults
    apply). Per GPU for whole GPUs; a shared job (``shard``, ``mps``) holds one GPU's worth,
    asked per node (``--mem``, ``--cpus-per-task``: the job has one task), as Slurm gives no
    per-GPU defaults to a job without GPUs."""
    out: list[str] = []
    if gres.kind == "gpu":
        if mem_per_gpu_mb is not None:
            out.append(f"--mem-per-gpu={mem_per_gpu_mb}M")
        if cpus_per_gpu is not None:
            out.append(f"--cpus-per-gpu={cpus_per_gpu}")
    else:
        if mem_per_gpu_mb is not None:
            out.append(f"--mem={mem_per_gpu_mb}M")
        if cpus_per_gpu is not None:
            out.append(f"--cpus-per-task={cpus_per_gpu}")
    return out


def as_user(argv: Argv, *, uid: int, gid: int) -> Argv:
    """Run ``argv`` as exactly that user (root only): ``setpriv`` sets the real and effective
    uid and gid, the user's own supplementary groups from the group database
    (``--init-groups``: the groups the user has at login, no more, none of root's), and
    ``no_new_privs``; it execs the command directly (no shell, no PAM session)."""
    return (
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--init-groups",
        "--no-new-privs",
        "--",
        *argv,
    )


def release(job_id: str) -> Argv:
    return ("scontrol", "release", job_id)


def update_job(
    job_id: str,
    *,
    gres: Gres | None = None,
    num_nodes: int | None = None,
    nodes: Sequence[str] | None = None,
    start_now: bool = False,
    requeue: bool = False,
) -> Argv:
    """``scontrol update jobid=X`` with only the fields given (nodes=() clears the pin;
    ``requeue``: the job may be requeued again)."""
    argv: list[str] = ["scontrol", "update", f"jobid={job_id}"]
    if num_nodes is not None:
        argv.append(f"NumNodes={num_nodes}-{num_nodes}")
    if gres is not None:
        argv.append(f"Gres={gres}")
    if nodes is not None:
        argv.append(f"ReqNodeList={','.join(nodes)}" if nodes else "ReqNodeList=")
    if start_now:
        argv.append("StartTime=now")
    if requeue:
        argv.append("Requeue=1")
    if len(argv) == 3:
        raise ValueError("update_job needs at least one field to change")
    return tuple(argv)


def signal_batch(job_id: str, signal: str) -> Argv:
    return ("scancel", "--batch", f"--signal={signal}", job_id)


def requeue_hold(job_id: str) -> Argv:
    return ("scontrol", "requeuehold", job_id)


def hold(job_id: str) -> Argv:
    """A user hold (JobHeldUser), even as root: ``scontrol hold`` by root would be an
    administrator's hold, which icefrog never releases."""
    return ("scontrol", "uhold", job_id)


def cancel(job_id: str) -> Argv:
    return ("scancel", job_id)


def squeue_json() -> Argv:
    """Every job Slurm knows (every state, until MinJobAge) as JSON: one call serves polls,
    capacity and look-ups (22.05 ignores filters with --json; later versions honour them)."""
    return ("squeue", "--json", "--states=all")


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
    time_limit_min: int | None,
    mem_per_gpu_mb: int | None = None,
    cpus_per_gpu: int | None = None,
) -> Argv:
    """sbatch (held) of a job's own script read from stdin, with its name, paths, limits and
    host memory and cores (:func:`host_share`)."""
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
    if time_limit_min is not None:
        argv.append(f"--time={time_limit_min}")
    argv += host_share(gres, mem_per_gpu_mb, cpus_per_gpu)
    return tuple(argv)
