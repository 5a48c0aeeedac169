"""What one user's input costs the controller: a hostile declaration's estimate, the
reading of Slurm's job list, and a scan of a job folder of many files. Prints the figures;
asserts nothing.

``declaration``: the estimator's candidates for one job declaring LAYERS layers (every depth
legal up to 90 %), per-GPU batches 1..2^30, on a cluster of GPUS GPUs: wall time and the
tracemalloc peak, tuned over at most ``core.tuner.MAX_DEPTHS`` depths and (``--every-depth``)
over every legal depth, as before that bound.

``squeue``: one parse of a ``squeue --json`` document of JOBS running jobs (one node each,
each with its per-node GPU allocation), the median of a few parses after a first one.

``folder``: a scan of an inbox of one job folder of FILES report files in shuffled order
(``inbox_files.scan``: the listing, bounded by ``MAX_OWNER_LOOKS``, and the bounded heap
that chooses the 1000 reports a drain reads first, ``inbox.max_reports_per_owner``'s
default), the CPU time of one scan.

``dots``: a scan of an inbox where one user (uid 65534) holds FOLDERS job folders, each
with NAMES hard links of a few empty files named as files still being written (``.x<n>``),
dated ahead to 2096 (a user sets a file's mtime, not its ctime): the CPU time, the peak of
the Python memory it allocates (tracemalloc) and what it kept, of two scans in a row (the
second starts after the folder where the first stopped). Run as root.

    .venv/bin/python -m benchmarks.hostile_costs declaration --gpus 1024 [--every-depth]
    .venv/bin/python -m benchmarks.hostile_costs squeue --jobs 2400
    .venv/bin/python -m benchmarks.hostile_costs folder --files 100000
    .venv/bin/python -m benchmarks.hostile_costs dots --folders 100 --names 10000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Sequence

from icefrog_slurm.core.samples import ProfileSample
from icefrog_slurm.domain.records import JobRecord, JobView, Progress
from icefrog_slurm.domain.snapshot import Current, JobSnapshot
from icefrog_slurm.policies import estimate
from icefrog_slurm.policies.estimate import Estimator
from icefrog_slurm.protocol import GradStats, JobSpec
from icefrog_slurm.settings import settings_from_mapping
from icefrog_slurm.slurm import parse
from icefrog_slurm.store import inbox_files


def declaration(layers: int, gpus: int, every_depth: bool) -> None:
    spec = JobSpec(1, gpus, 1, 2**30, 0.9, "acc", ">=", 0.9, 10, 10000, (1.0,) * layers,
                   (1.0,) * layers)  # fmt: skip
    grad = GradStats(epoch=3, frozen=1001 % layers, grad_var=(1e-6,) * layers,
                     grad_sqr=(0.5,) * layers)  # fmt: skip
    rec = JobRecord(99, "big", 0, "root", "running", 0.0, None, None, spec, ("9",), Progress())
    sample = ProfileSample(1, 64, 0, False, 0.0, 0.0, 0.0, 0.16, 400.0, 20e9, 0.4)
    job = JobSnapshot(JobView(rec, (sample,), grad), None, Current())
    if every_depth:  # the tuning as it was before MAX_DEPTHS
        estimate.spread_depths = lambda depths, keep=None: depths  # type: ignore[assignment]
    tracemalloc.start()
    started = time.perf_counter()
    got = Estimator().candidates(
        job, now=100.0, gpus_per_node=4, capacity=gpus, settings=settings_from_mapping({})
    )
    wall = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    depths = "every depth" if every_depth else "at most MAX_DEPTHS depths"
    print(f"{layers} layers on {gpus} GPUs, {depths}: {wall:.2f} s, peak {peak / 1e6:.0f} MB, "
          f"{len(got)} candidates")  # fmt: skip


def squeue(jobs: int, runs: int = 5) -> None:
    records = [
        {"job_id": i + 1, "user_id": 1000, "group_id": 1000, "job_state": "RUNNING",
         "name": f"j{i}", "nodes": f"node{i % 240 + 1}", "node_count": 1, "partition": "gpu",
         "tres_per_node": "gres:gpu:2", "gres_detail": ["gpu:a800:2(IDX:0-1)"],
         "comment": f"icefrog:k{i}"}
        for i in range(jobs)
    ]  # fmt: skip
    text = json.dumps({"jobs": records})
    parse.parse_squeue_json(text)  # the first: nothing remembered yet
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        parse.parse_squeue_json(text)
        times.append(time.perf_counter() - started)
    print(f"squeue --json of {jobs} running jobs: {statistics.median(times) * 1e3:.0f} ms a parse")


def folder(files: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "4242")
        os.mkdir(job)
        seqs = list(range(1, files + 1))
        random.Random(7).shuffle(seqs)
        for seq in seqs:
            with open(os.path.join(job, f"{seq}-progress.json"), "w"):
                pass
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            started = time.process_time()
            kept = inbox_files.scan(fd, stale_before=0.0, per_owner=1000).items
            cpu = time.process_time() - started
        finally:
            os.close(fd)
    print(f"a job folder of {files} reports: the first {len(kept)} chosen in {cpu:.2f} s of CPU "
          f"(at most {inbox_files.MAX_OWNER_LOOKS} names listed)")  # fmt: skip


def dots(folders: int, names: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        inbox, sources = os.path.join(tmp, "inbox"), os.path.join(tmp, "sources")
        os.mkdir(inbox)
        os.mkdir(sources)  # beside the inbox, on its filesystem
        links = 0
        for f in range(folders):
            job = os.path.join(inbox, f"{4242 + f}")
            os.mkdir(job)
            for n in range(names):
                if links % 60_000 == 0:  # below a filesystem's links to one file (ext4: 65,000)
                    source = os.path.join(sources, str(links))
                    open(source, "w").close()
                    os.utime(source, (4_000_000_000, 4_000_000_000))  # 2096: mtime, not ctime
                os.link(source, os.path.join(job, f".x{n}"))
                links += 1
            os.chown(job, 65534, 65534)
        fd = os.open(inbox, os.O_RDONLY | os.O_DIRECTORY)
        try:
            turns: dict[int, str] = {}
            for nth in (1, 2):
                tracemalloc.start()
                started = time.process_time()
                found = inbox_files.scan(
                    fd, stale_before=time.time() - 3600, per_owner=1000, turns=turns
                )
                cpu = time.process_time() - started
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                turns = found.turns
                print(
                    f"scan {nth}: {folders} folders x {names} dot names of one owner: "
                    f"{cpu:.2f} s of CPU, {peak / 2**20:.1f} MiB at peak, "
                    f"{len(found.items)} entries kept, next turn after {turns.get(65534)}"
                )
        finally:
            os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("declaration")
    d.add_argument("--layers", type=int, default=4096)
    d.add_argument("--gpus", type=int, default=1024)
    d.add_argument("--every-depth", action="store_true")
    s = sub.add_parser("squeue")
    s.add_argument("--jobs", type=int, default=2400)
    f = sub.add_parser("folder")
    f.add_argument("--files", type=int, default=100_000)
    t = sub.add_parser("dots")
    t.add_argument("--folders", type=int, default=100)
    t.add_argument("--names", type=int, default=10_000)
    args = ap.parse_args(argv)
    if args.what == "declaration":
        declaration(args.layers, args.gpus, args.every_depth)
    elif args.what == "squeue":
        squeue(args.jobs)
    elif args.what == "folder":
        folder(args.files)
    else:
        dots(args.folders, args.names)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
