"""Hostile input to every ``icefrog`` subcommand: one table, each row an attack.

A row is the argv, the files to create first (name -> bytes, or ``None`` for a folder), the
exit code it must end with and a fragment its error line must hold. Every row must end
without a traceback and within :data:`TIMEOUT_S` (a hang fails it). Rows run in-process
(an exception escaping ``main`` fails the row with its traceback); rows marked ``proc``
run as ``python -m icefrog_slurm`` in a child process, for the inputs that once hung or
grew memory, and to prove the real entry point. In argv, ``{d}`` is the row's own folder
and ``{db}`` a migrated, empty SQLite state store.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as settings_hyp
from hypothesis import strategies as st
from sqlalchemy import inspect

from icefrog_slurm.cli import main
from icefrog_slurm.commands import solve, tune
from icefrog_slurm.errors import InputError
from icefrog_slurm.settings import load_settings
from icefrog_slurm.store import migrate
from icefrog_slurm.store.sql import make_engine

TIMEOUT_S = 20
REPO = Path(__file__).resolve().parents[2]
BAD_UTF8 = b'{"layers": "\xff\xfe"}'
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
BIG_INT = b"9" * 5000
SURROGATE = os.fsdecode(b"\xff")  # how a non-UTF-8 byte in argv reaches Python


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


def _sqlite(script: str) -> bytes:
    """The bytes of a SQLite database made by ``script``."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(script)
        return conn.serialize()
    finally:
        conn.close()


TUNE = {
    "layers": 4,
    "gpus": 1,
    "batch_sizes": [32],
    "throughput": [{"gpus": 1, "batch": 32, "frozen": 0, "samples_per_s": 100}],
    "grad_var": [1.0, 1.0, 1.0, 1.0],
}
SOLVE = {
    "gpus": 4,
    "gpus_per_node": 4,
    "gpu_mem_gb": 80,
    "jobs": [{"id": "a", "options": [{"gpus": 1, "tta_s": 100}]}],
}
WORKLOAD_HEAD = b"name,time,application,num_replicas,batch_size\n"
PHILLY_HEAD = b"timestamp,duration,num_gpus,gpu_time,cluster\n"
PHILLY_ROW = b"2017-10-03 03:10:00,3600,1,3600,x\n"
FOREIGN_DB = _sqlite("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);")
UNKNOWN_REVISION_DB = _sqlite(
    "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL);"
    "INSERT INTO alembic_version VALUES ('f00dfeed1234');"
)


def _tune(**changes: object) -> bytes:
    return _json({**TUNE, **changes})


def _solve(**changes: object) -> bytes:
    return _json({**SOLVE, **changes})


def _workload(row: str) -> bytes:
    return WORKLOAD_HEAD + row.encode() + b"\n"


@dataclass(frozen=True)
class Case:
    """One hostile run: see the module docstring."""

    id: str
    argv: tuple[str, ...]
    code: int
    fragment: str
    files: Mapping[str, bytes | None] = field(default_factory=dict)
    proc: bool = False


def case(
    ident: str,
    argv: str | list[str],
    code: int,
    fragment: str,
    files: Mapping[str, bytes | None] | None = None,
    *,
    proc: bool = False,
) -> Case:
    args = tuple(argv.split()) if isinstance(argv, str) else tuple(argv)
    return Case(ident, args, code, fragment, dict(files or {}), proc)


SIM = "simulate --quiet --out {d}/out --workload {d}/w.csv"
W_OK = {"w.csv": _workload("j0,0,resnet18-cifar10,1,128")}
SAMPLE = "trace sample --seed 1 --philly {d}/p.csv --out {d}/w.csv"
P_OK = {"p.csv": PHILLY_HEAD + PHILLY_ROW}
SUBMIT = "submit --inbox {d}/no-inbox"
EVAL = "evaluate --out {d}/eval"
DB = "--db sqlite:///{db}"

# one row a line or two: the table reads as a table
# fmt: off
CASES = [
    # --- the command line itself ---------------------------------------------------------
    case("no-command", [], 2, "give a COMMAND"),
    case("unknown-command", "frobnicate", 2, "invalid choice"),
    case("tune-no-file", "tune", 2, "required"),
    case("unknown-option", "tune x.json --bogus", 2, "unrecognized arguments"),
    # --- tune --------------------------------------------------------------------------
    case("tune-missing", "tune {d}/nope.json", 2, "nope.json: no such file"),
    case("tune-surrogate-path", ["tune", "{d}/" + SURROGATE], 2, "\\udcff: no such file"),
    case("tune-folder", "tune {d}/dir", 2, "is a folder", {"dir": None}),
    case("tune-empty", "tune {d}/t.json", 2, "not valid JSON", {"t.json": b""}),
    case("tune-not-utf8", "tune {d}/t.json", 2, "not UTF-8", {"t.json": BAD_UTF8}),
    case("tune-deep", "tune {d}/t.json", 2, "nested deeper", {"t.json": DEEP_JSON}),
    case("tune-bigint", "tune {d}/t.json", 2, "5000 digits",
         {"t.json": b'{"layers": ' + BIG_INT + b"}"}),
    case("tune-1e300", "tune {d}/t.json", 2, "layers", {"t.json": _tune(layers=1e300)}),
    case("tune-nan", "tune {d}/t.json", 2, "NaN", {"t.json": b'{"layers": NaN}'}),
    case("tune-negative-gpus", "tune {d}/t.json", 2, "gpus: must be >= 1",
         {"t.json": _tune(gpus=-1)}),
    case("tune-huge-gpus", "tune {d}/t.json", 2, "gpus: must be <=",
         {"t.json": _tune(gpus=99_999_999_999)}),
    case("tune-huge-batch", "tune {d}/t.json", 2, "batch_sizes[0]: must be <=",
         {"t.json": _tune(batch_sizes=[2**62])}),
    case("tune-many-batches", "tune {d}/t.json", 2, "batch_sizes: at most 1024",
         {"t.json": _tune(batch_sizes=list(range(1, 100_001)))}),
    case("tune-huge-rate", "tune {d}/t.json", 2, "samples_per_s: must be <=",
         {"t.json": _tune(throughput=[{"gpus": 1, "batch": 32, "frozen": 0,
                                       "samples_per_s": 1e300}])}),
    case("tune-unknown-key", "tune {d}/t.json", 2, "bogus: unknown field",
         {"t.json": _tune(bogus=1)}),
    case("tune-empty-key", "tune {d}/t.json", 2, "unknown field", {"t.json": _json({"": 1})}),
    case("tune-not-object", "tune {d}/t.json", 2, "must be an object", {"t.json": b"[]"}),
    case("tune-null-byte", "tune {d}/t.json", 2, "NUL", {"t.json": b'{"layers": "\\u0000"}'}),
    # --- solve ---------------------------------------------------------------------------
    case("solve-missing", "solve {d}/nope.json", 2, "no such file"),
    case("solve-folder", "solve {d}/dir", 2, "is a folder", {"dir": None}),
    case("solve-not-utf8", "solve {d}/s.json", 2, "not UTF-8", {"s.json": b"\xff"}),
    case("solve-deep", "solve {d}/s.json", 2, "nested deeper", {"s.json": DEEP_JSON}),
    case("solve-time-limit-nan", "solve {d}/s.json --time-limit nan", 2, "--time-limit",
         {"s.json": _solve()}),
    case("solve-time-limit-inf", "solve {d}/s.json --time-limit inf", 2, "--time-limit",
         {"s.json": _solve()}),
    case("solve-time-limit-negative", "solve {d}/s.json --time-limit -1", 2, "--time-limit",
         {"s.json": _solve()}),
    case("solve-workers-0", "solve {d}/s.json --workers 0", 2, "--workers", {"s.json": _solve()}),
    case("solve-workers-huge", "solve {d}/s.json --workers 99999999", 2, "--workers",
         {"s.json": _solve()}),
    case("solve-partition-negative", "solve {d}/s.json --partition-gpus -1", 2, "--partition-gpus",
         {"s.json": _solve()}),
    case("solve-bigint-arg", ["solve", "{d}/s.json", "--workers", "9" * 5000], 2, "--workers",
         {"s.json": _solve()}),
    case("solve-huge-cluster", "solve {d}/s.json", 2, "gpus: must be <=",
         {"s.json": _solve(gpus=99_999_999_996)}, proc=True),
    case("solve-huge-option", "solve {d}/s.json", 2, "gpus: must be <=",
         {"s.json": _solve(jobs=[{"id": "a", "options": [{"gpus": 2**62, "tta_s": 1}]}])}),
    case("solve-node-not-string", "solve {d}/s.json", 2, "nodes[0]: must be a non-empty",
         {"s.json": _solve(nodes=[{}])}),
    case("solve-nodes-mismatch", "solve {d}/s.json", 2, "len(nodes)",
         {"s.json": _solve(nodes=["n1", "n2", "n3"])}),
    case("solve-tta-huge", "solve {d}/s.json", 2, "tta_s: must be <=",
         {"s.json": _solve(jobs=[{"id": "a", "options": [{"gpus": 1, "tta_s": 1e300}]}])}),
    case("solve-weight-huge", "solve {d}/s.json", 2, "weight: must be <=",
         {"s.json": _solve(jobs=[{"id": "a", "weight": 1e300,
                                  "options": [{"gpus": 1, "tta_s": 10}]}])}),
    case("solve-empty-id", "solve {d}/s.json", 2, "id: must be a non-empty string",
         {"s.json": _solve(jobs=[{"id": "", "options": [{"gpus": 1, "tta_s": 1}]}])}),
    # --- simulate ------------------------------------------------------------------------
    case("sim-missing", SIM, 2, "--workload"),
    case("sim-folder", SIM, 2, "w.csv: is a folder", {"w.csv": None}),
    case("sim-nul", SIM, 2, "not printable", {"w.csv": _workload("j\x00,0,resnet18-cifar10,1,1")}),
    case("sim-empty", SIM, 2, "missing column", {"w.csv": b""}),
    case("sim-not-utf8", SIM, 2, "not UTF-8", {"w.csv": WORKLOAD_HEAD + b"\xff\n"}),
    case("sim-time-1e300", SIM, 2, "time: must be <=",
         {"w.csv": _workload("j0,1e300,resnet18-cifar10,1,128")}, proc=True),
    case("sim-time-nan", SIM, 2, "time", {"w.csv": _workload("j0,nan,resnet18-cifar10,1,128")}),
    case("sim-time-negative", SIM, 2, "time", {"w.csv": _workload("j0,-5,resnet18-cifar10,1,128")}),
    case("sim-replicas-bigint", SIM, 2, "num_replicas",
         {"w.csv": _workload("j0,0,resnet18-cifar10," + "9" * 5000 + ",128")}),
    case("sim-replicas-huge", SIM, 2, "num_replicas: must be within [1, 4096]",
         {"w.csv": _workload("j0,0,resnet18-cifar10,99999999999,128")}, proc=True),
    case("sim-batch-huge", SIM, 2, "batch_size: must be within",
         {"w.csv": _workload("j0,0,resnet18-cifar10,1,99999999999999999999")}),
    case("sim-unicode-digit", SIM, 2, "num_replicas",
         {"w.csv": _workload("j0,0,resnet18-cifar10,\u00b2,128")}),
    case("sim-unknown-app", SIM, 2, "application", {"w.csv": _workload("j0,0,no-such-app,1,128")}),
    case("sim-replicas-off-unit", SIM, 2, "w.csv:3: num_replicas 2: llama-3b-squad2 runs on a "
         "multiple of 4 GPU(s), at least 4",
         {"w.csv": _workload("j0,0,resnet18-cifar10,1,128\nj1,0,llama-3b-squad2,2,16")}),
    case("sim-replicas-above-gpus", SIM + " --gpus 16", 2, "w.csv:2: num_replicas 32: more GPUs "
         "than --gpus 16; lucid+ and slurm start a job only on the GPUs it requests",
         {"w.csv": _workload("j0,0,resnet18-cifar10,32,128")}),
    case("sim-replicas-above-task", SIM + " --policy lucid+", 2, "w.csv:2: num_replicas 12: "
         "resnet18-cifar10 runs on 1-8 GPUs here; lucid+ starts a job only on the GPUs it",
         {"w.csv": _workload("j0,0,resnet18-cifar10,12,128")}),
    case("sim-gpus-huge", SIM + " --gpus 99999999996", 2, "--gpus", W_OK, proc=True),
    case("sim-gpus-per-node-huge", SIM + " --gpus 4096 --gpus-per-node 4096", 2, "--gpus-per-node",
         W_OK, proc=True),
    case("sim-gpus-zero", SIM + " --gpus 0", 2, "--gpus", W_OK),
    case("sim-seed-negative", SIM + " --seed -1", 2, "--seed", W_OK),
    case("sim-seed-huge", SIM + " --seed 99999999999999999999999", 2, "--seed", W_OK),
    case("sim-noise-nan", SIM + " --profile-noise nan", 2, "--profile-noise", W_OK),
    case("sim-noise-inf", SIM + " --share-noise inf", 2, "--share-noise", W_OK),
    case("sim-noise-huge", SIM + " --profile-noise 1e300", 2, "--profile-noise", W_OK),
    case("sim-out-empty", ["simulate", "--workload", "{d}/w.csv", "--out", ""], 2,
         "argument --out: must not be empty", W_OK),
    case("sim-policy", SIM + " --policy nope", 2, "--policy", W_OK),
    case("sim-out-is-file", SIM, 2, "--out", {**W_OK, "out": b"x"}),
    case("sim-set-bad", SIM + " --set nodot=1", 2, "SECTION.KEY=VALUE", W_OK),
    case("sim-set-nan", SIM + " --set controller.round_period_s=nan", 2, "round_period_s", W_OK),
    case("sim-set-unknown", SIM + " --set controller.bogus=1", 2, "bogus: unknown field", W_OK),
    case("sim-set-tiny-poll", SIM + " --set controller.reconcile_poll_s=1e-300", 2,
         "reconcile_poll_s", W_OK, proc=True),
    case("sim-set-tiny-round", SIM + " --set controller.round_period_s=1e-300", 2, "round_period_s",
         W_OK, proc=True),
    case("sim-set-huge-round", SIM + " --set controller.round_period_s=1e300", 2,
         "round_period_s", W_OK, proc=True),
    case("sim-set-huge-poll", SIM + " --set controller.reconcile_poll_s=1e300", 2,
         "reconcile_poll_s", W_OK, proc=True),
    case("sim-set-huge-shards", SIM + " --set slurm.shards_per_gpu=99999999999999999999999", 2,
         "shards_per_gpu", W_OK),
    case("sim-config-missing", SIM + " --config {d}/nope.toml", 2, "no such file", W_OK),
    case("sim-config-folder", SIM + " --config {d}/c", 2, "is a folder", {**W_OK, "c": None}),
    # --- settings files (controller, db upgrade, submit and simulate read them) ----------
    case("config-not-utf8", "controller --dry-run --config {d}/c.toml", 2, "not UTF-8",
         {"c.toml": b'[slurm]\npartition = "\xff"\n'}),
    case("config-sharing-gres", "controller --dry-run --config {d}/c.toml", 2,
         "sharing.gres: must be one of shard, mps", {"c.toml": b'[sharing]\ngres = "mig"\n'}),
    case("config-deep-array", "controller --dry-run --config {d}/c.toml", 2, "nested",
         {"c.toml": b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n"}),
    case("config-deep-table", "controller --dry-run --config {d}/c.toml", 2, "nested",
         {"c.toml": b"a = " + b"{b=" * 3000 + b"1" + b"}" * 3000 + b"\n"}),
    case("config-bigint", "controller --dry-run --config {d}/c.toml", 2, "number too long",
         {"c.toml": b"[controller]\nround_period_s = " + BIG_INT + b"\n"}),
    case("config-int64", "controller --dry-run --config {d}/c.toml", 2, "max_reports_per_drain",
         {"c.toml": b"[inbox]\nmax_reports_per_drain = 99999999999999999999999\n"}),
    case("config-inf", "controller --dry-run --config {d}/c.toml", 2, "round_period_s",
         {"c.toml": b"[controller]\nround_period_s = inf\n"}),
    case("config-empty-string", "controller --dry-run --config {d}/c.toml", 2, "partition",
         {"c.toml": b'[slurm]\npartition = ""\n'}),
    case("config-nul", "db upgrade --config {d}/c.toml", 2, "state.dir: must be printable",
         {"c.toml": b'[state]\ndir = "/tmp/a\\u0000b"\n'}),
    case("config-unknown", "controller --dry-run --config {d}/c.toml", 2, "unknown field",
         {"c.toml": b"[controller]\nround = 1\n"}),
    case("config-not-toml", "controller --dry-run --config {d}/c.toml", 2, "not valid TOML",
         {"c.toml": b"[[[\n"}),
    case("config-folder", "controller --dry-run --config {d}/c.toml", 2, "is a folder",
         {"c.toml": None}),
    case("config-huge", "controller --dry-run --config {d}/c.toml", 2, "larger than",
         {"c.toml": b"# " + b"x" * (2 << 20) + b"\n"}),
    # --- trace sample --------------------------------------------------------------------
    case("sample-missing", SAMPLE, 2, "no such file"),
    case("sample-folder", SAMPLE, 2, "is a folder", {"p.csv": None}),
    case("sample-not-utf8", SAMPLE, 2, "not UTF-8", {"p.csv": PHILLY_HEAD + b"\xff\n"}),
    case("sample-empty", SAMPLE, 2, "missing column", {"p.csv": b""}),
    case("sample-nul", SAMPLE, 2, "p.csv:2", {"p.csv": PHILLY_HEAD + b"\x00,1,1,1,x\n"}),
    case("sample-hours-unicode", SAMPLE + " --hours \u00b2-6", 2, "--hours", P_OK),
    case("sample-hours-bigint", SAMPLE + " --hours 3-" + "9" * 5000, 2, "--hours", P_OK),
    case("sample-load-inf", SAMPLE + " --load inf", 2, "--load", P_OK),
    case("sample-load-overflow", SAMPLE + " --load 1e308 --jobs 2", 2,
         "--load: --jobs 2 x --load 1e+308 must be at most 1000000 jobs", P_OK),
    case("sample-load-nan", SAMPLE + " --load nan", 2, "--load", P_OK),
    case("sample-jobs-huge", SAMPLE + " --jobs 99999999999", 2, "--jobs: must be within", P_OK),
    case("sample-seed-negative", SAMPLE + " --seed -1", 2, "--seed", P_OK),
    case("sample-out-not-csv", "trace sample --seed 1 --philly {d}/p.csv --out {d}/w.txt", 2,
         "--out", P_OK),
    case("sample-out-folder", SAMPLE, 2, "--out", {**P_OK, "w.csv": None}),
    case("sample-bad-row", SAMPLE, 2, "p.csv:2",
         {"p.csv": PHILLY_HEAD + b"2017-10-03 03:10:00,nan,1,3600,x\n"}),
    case("sample-tasks", SAMPLE + " --tasks nope", 2, "nope", P_OK),
    # --- evaluate: refused before any run starts (nothing written under --out) --------------
    case("evaluate-table", f"{EVAL} nope", 2, "unknown table"),
    case("evaluate-jobs-zero", f"{EVAL} main --jobs 0", 2, "--jobs"),
    case("evaluate-seed-negative", f"{EVAL} main --seeds -1", 2, "--seeds"),
    case("evaluate-seeds-empty", f"{EVAL} main --seeds ,", 2, "--seeds"),
    case("evaluate-seeds-blank", ["evaluate", "--out", "{d}/eval", "main", "--seeds", ""], 2,
         "--seeds: an empty list or item in ''"),
    case("evaluate-policies-blank", ["evaluate", "--out", "{d}/eval", "main", "--policies", ""],
         2, "--policies: an empty list or item in ''"),
    case("evaluate-gpus-zero", f"{EVAL} main --gpus 0", 2, "--gpus"),
    case("evaluate-loads-nan", f"{EVAL} main --loads nan", 2, "--loads"),
    case("evaluate-policy-unknown", f"{EVAL} main --policies icefrog,nope", 2, "--policies"),
    case("evaluate-base-jobs", f"{EVAL} main --base-jobs 0", 2, "--base-jobs"),
    case("evaluate-workloads", f"{EVAL} faithful --workloads 9", 2, "--workloads"),
    case("evaluate-set-unknown", f"{EVAL} main --set controller.bogus=1", 2,
         "bogus: unknown field"),
    case("evaluate-set-huge-round", f"{EVAL} main --set controller.round_period_s=1e300", 2,
         "controller.round_period_s: the simulator needs 1 to 86400 s"),
    case("evaluate-gpus-off-node", f"{EVAL} main --gpus 10", 2,
         "--gpus 10: must be a multiple of --gpus-per-node 4"),
    case("evaluate-tasks-unknown", f"{EVAL} main --tasks alexnet", 2, "--tasks: unknown task"),
    case("evaluate-philly-missing", f"{EVAL} main --philly {{d}}/nope.csv", 2,
         "nope.csv: no such file"),
    case("evaluate-philly-window", f"{EVAL} main --quick --philly {{d}}/p.csv", 2,
         "load 0.25 x 120 jobs asks 30 jobs of the Philly window (hours 3-6), which holds 1",
         P_OK),
    case("evaluate-pollux-missing", f"{EVAL} faithful --quick --pollux {{d}}/nope", 2,
         "nope: no workload"),
    # --- sacct, squeue, show -------------------------------------------------------------
    case("sacct-start-empty", ["sacct", "--db", "sqlite:///{db}", "-S", ""], 2, "--starttime"),
    case("sacct-end-empty", ["sacct", "--db", "sqlite:///{db}", "-E", ""], 2, "--endtime"),
    case("sacct-user-empty", ["sacct", "--db", "sqlite:///{db}", "-u", ""], 2, "--user"),
    case("sacct-user-commas", ["sacct", "--db", "sqlite:///{db}", "-u", ",,"], 2, "--user"),
    case("sacct-user-control", ["sacct", "--db", "sqlite:///{db}", "-u", "a\nb"], 2, "--user"),
    case("sacct-jobs-empty", ["sacct", "--db", "sqlite:///{db}", "-j", ""], 2, "--jobs"),
    case("sacct-jobs-unicode", ["sacct", "--db", "sqlite:///{db}", "-j", "\u0663"], 2, "--jobs"),
    case("sacct-state-empty", ["sacct", "--db", "sqlite:///{db}", "-s", ""], 2, "--state"),
    case("sacct-state-unknown", f"sacct {DB} -s nope", 2, "unknown job state"),
    case("sacct-start-bigint", f"sacct {DB} -S now-{'9' * 5000}", 2, "--starttime"),
    case("sacct-start-far", f"sacct {DB} -S now-99999999999999999999weeks", 2, "--starttime"),
    case("sacct-start-year0", f"sacct {DB} -S 0000-01-01", 2, "--starttime"),
    case("sacct-format-width", f"sacct {DB} -o JobID%99999999999", 2, "width"),
    case("sacct-format-bigint", f"sacct {DB} -o JobID%{'9' * 5000}", 2, "width"),
    case("sacct-format-empty", ["sacct", "--db", "sqlite:///{db}", "-o", ""], 2, "--format"),
    case("sacct-db-missing", "sacct --db sqlite:///{d}/nope.db", 2, "no state store"),
    case("sacct-db-folder", "sacct --db sqlite:///{d}/dir", 2, "no state store", {"dir": None}),
    case("sacct-db-garbage", "sacct --db sqlite:///{d}/g.db", 2, "g.db",
         {"g.db": b"not a database" * 100}),
    case("sacct-db-empty-file", "sacct --db sqlite:///{d}/e.db", 2, "icefrog db upgrade",
         {"e.db": b""}),
    case("sacct-db-foreign", "sacct --db sqlite:///{d}/f.db", 2, "icefrog db upgrade",
         {"f.db": FOREIGN_DB}),
    case("sacct-db-scheme", "sacct --db nosuch://x", 2, "database URL"),
    case("sacct-db-not-url", "sacct --db ::::", 2, "database URL"),
    case("sacct-db-empty", ["sacct", "--db", ""], 2, "database URL"),
    case("sacct-db-unreachable", "sacct --db postgresql+psycopg://u@127.0.0.1:1/x", 1,
         "cannot connect"),
    case("sacct-config-folder", "sacct --config {d}/c", 2, "is a folder", {"c": None}),
    case("sacct-config-not-utf8", "sacct --config {d}/c.toml", 2, "not UTF-8", {"c.toml": b"\xff"}),
    case("squeue-user-empty", ["squeue", "--db", "sqlite:///{db}", "-u", ""], 2, "--user"),
    case("squeue-states-empty", ["squeue", "--db", "sqlite:///{db}", "-t", ""], 2, "--states"),
    case("squeue-jobs-bad", f"squeue {DB} -j 1;DROP", 2, "--jobs"),
    case("squeue-format-bad", f"squeue {DB} -o nope", 2, "unknown field"),
    case("squeue-surrogate-user", ["squeue", "--db", "sqlite:///{db}", "-u", SURROGATE], 2,
         "--user"),
    case("squeue-Format-unknown", f"squeue {DB} -O JobID,nope:5", 2, "unknown field"),
    case("squeue-Format-width", f"squeue {DB} -O JobID:{'9' * 5000}", 2, "width"),
    case("squeue-Format-suffix", ["squeue", "--db", "sqlite:///{db}", "-O", "JobID:5\x1b[2J"], 2,
         "suffix"),
    case("squeue-sort-unknown", f"squeue {DB} --sort=-nope", 2, "--sort"),
    case("squeue-sort-empty", ["squeue", "--db", "sqlite:///{db}", "--sort", ","], 2, "--sort"),
    case("squeue-iterate-zero", f"squeue {DB} -i 0", 2, "--iterate"),
    case("squeue-iterate-huge", f"squeue {DB} -i {'9' * 5000}", 2, "--iterate"),
    case("squeue-iterate-word", f"squeue {DB} -i soon", 2, "--iterate"),
    case("squeue-partition-bad", f"squeue {DB} -p gpu;rm", 2, "--partition"),
    case("squeue-name-control", ["squeue", "--db", "sqlite:///{db}", "-n", "a\nb"], 2, "--name"),
    case("squeue-unknown-flag", f"squeue {DB} --bogus", 2, "unrecognized arguments: --bogus"),
    case("sacct-name-empty", ["sacct", "--db", "sqlite:///{db}", "--name", ""], 2, "--name"),
    case("sacct-name-huge", f"sacct {DB} --name {'x' * 5000}", 2, "--name"),
    case("sacct-partition-bad", f"sacct {DB} -r gpu/../x", 2, "--partition"),
    case("sacct-delimiter-empty", ["sacct", "--db", "sqlite:///{db}", "-P", "--delimiter", ""], 2,
         "--delimiter"),
    case("sacct-delimiter-newline", ["sacct", "--db", "sqlite:///{db}", "-P", "--delimiter", "\n"],
         2, "--delimiter"),
    case("sacct-accounts", f"sacct {DB} -A proj", 2, "no Slurm account"),
    case("sacct-unknown-flag", f"sacct {DB} --bogus", 2, "unrecognized arguments: --bogus"),
    case("show-id-empty", ["show", "job", "", "--db", "sqlite:///{db}"], 2, "ID"),
    case("show-id-unicode", ["show", "job", "\u0663", "--db", "sqlite:///{db}"], 2, "ID"),
    case("show-id-huge", f"show job {'9' * 5000} {DB}", 2, "ID"),
    case("show-actions-negative", f"show job 1 {DB} --actions -1", 2, "--actions"),
    case("show-not-found", f"show job 7 {DB}", 1, "no icefrog job"),
    # --- db upgrade ----------------------------------------------------------------------
    case("db-config-missing", "db upgrade --config {d}/nope.toml", 2, "no such file"),
    case("db-config-folder", "db upgrade --config {d}/c", 2, "is a folder", {"c": None}),
    case("db-foreign", "db upgrade --url sqlite:///{d}/f.db", 2, "customers", {"f.db": FOREIGN_DB}),
    case("db-unknown-revision", "db upgrade --url sqlite:///{d}/f.db", 2, "f00dfeed1234",
         {"f.db": UNKNOWN_REVISION_DB}),
    case("db-garbage", "db upgrade --url sqlite:///{d}/g.db", 2, "g.db",
         {"g.db": b"not a database" * 100}),
    case("db-folder", "db upgrade --url sqlite:///{d}/dir", 2, "dir", {"dir": None}),
    case("db-under-file", "db upgrade --url sqlite:///{d}/file/x.db", 2, "file", {"file": b"x"}),
    case("db-bad-revision", "db upgrade --url sqlite:///{d}/n.db --revision nope", 2,
         "revision nope"),
    case("db-bad-rev", "db upgrade --url sqlite:///{d}/n.db nope", 2, "nope: not a revision"),
    case("db-rev-twice", "db upgrade --url sqlite:///{d}/n.db 0003 --revision 0004", 2, "once"),
    case("db-scheme", "db upgrade --url nosuch://x", 2, "database URL"),
    case("db-url-empty", ["db", "upgrade", "--url", ""], 2, "database URL"),
    case("db-config-empty", ["db", "upgrade", "--config", ""], 2, "the path is empty"),
    case("db-revision-relative", "db upgrade --url sqlite:///{d}/n.db --revision -1", 2,
         "revision -1"),
    case("db-unreachable", "db upgrade --url postgresql+psycopg://u@127.0.0.1:1/x", 1,
         "cannot connect"),
    case("db-no-action", "db", 2, "required: ACTION"),
    case("db-current-missing", "db current --url sqlite:///{d}/nope.db", 2, "does not exist"),
    case("db-current-foreign", "db current --url sqlite:///{d}/f.db", 2, "customers",
         {"f.db": FOREIGN_DB}),
    case("db-current-unknown-revision", "db current --url sqlite:///{d}/f.db", 2, "f00dfeed1234",
         {"f.db": UNKNOWN_REVISION_DB}),
    case("db-current-garbage", "db current --url sqlite:///{d}/g.db", 2, "g.db",
         {"g.db": b"not a database" * 100}),
    case("db-current-scheme", "db current --url nosuch://x", 2, "database URL"),
    case("db-current-bad-port", "db current --url postgresql+psycopg://u:pw@h:notaport/x", 2,
         "postgresql+psycopg://...: its port is not a number"),
    case("db-downgrade-bad-port", "db downgrade --url postgresql+psycopg://u@h:x/y base", 2,
         "its port is not a number"),
    case("db-history-extra", "db history --url x", 2, "unrecognized arguments"),
    case("db-downgrade-no-rev", "db downgrade --url sqlite:///{d}/n.db", 2, "REV"),
    case("db-downgrade-bad-rev", "db downgrade --url sqlite:///{d}/n.db nope", 2, "revision nope"),
    case("db-downgrade-missing", "db downgrade --url sqlite:///{d}/n.db base", 2,
         "nothing to downgrade"),
    case("db-downgrade-foreign", "db downgrade --url sqlite:///{d}/f.db base", 2, "customers",
         {"f.db": FOREIGN_DB}),
    case("db-downgrade-unknown-revision", "db downgrade --url sqlite:///{d}/f.db base", 2,
         "f00dfeed1234", {"f.db": UNKNOWN_REVISION_DB}),
    case("db-downgrade-unknown-target", "db downgrade --url sqlite:///{db} 0005x", 2,
         "revision 0005x"),
    # --- controller --check: refused before anything is looked at --------------------------
    case("check-with-once", "controller --check --once --config {d}/c.toml", 2, "--check",
         {"c.toml": b""}),
    case("check-config-unknown", "controller --check --config {d}/c.toml", 2, "unknown field",
         {"c.toml": b"[controller]\nround = 1\n"}),
    case("check-config-missing", "controller --check --config {d}/nope.toml", 2, "no such file"),
    case("check-config-not-utf8", "controller --check --config {d}/c.toml", 2, "not UTF-8",
         {"c.toml": b'[slurm]\npartition = "\xff"\n'}),
    # --- submit and launch: refused before anything reaches Slurm ------------------------
    case("submit-no-script", SUBMIT, 2, "training script"),
    case("submit-gpus-unicode", SUBMIT + " --gpus \u00b2 -- t.py", 2, "--gpus"),
    case("submit-gpus-huge", SUBMIT + " --gpus 1-99999999999 -- t.py", 2, "--gpus", proc=True),
    case("submit-gpus-bigint", [*SUBMIT.split(), "--gpus", "9" * 5000, "--", "t.py"], 2, "--gpus"),
    case("submit-batch-huge", SUBMIT + " --batch 1-99999999999999999999 -- t.py", 2,
         "--batch: '1-99999999999999999999': must be <="),
    case("submit-max-frozen-nan", SUBMIT + " --max-frozen nan -- t.py", 2, "--max-frozen"),
    case("submit-target-nan", SUBMIT + " --target val_acc>=nan -- t.py", 2, "--target"),
    case("submit-epochs-huge", SUBMIT + " --max-epochs 99999999999999999999 -- t.py", 2,
         "--max-epochs"),
    case("submit-global-batch", SUBMIT + " --global-batch -1 -- t.py", 2, "--global-batch"),
    case("submit-parallelism-unicode", SUBMIT + " --parallelism pp:\u00b2 -- t.py", 2,
         "--parallelism"),
    case("submit-parallelism-bigint",
         [*SUBMIT.split(), "--parallelism", "pp:" + "9" * 5000, "--", "t.py"], 2, "--parallelism"),
    case("submit-gpu-unit-huge", SUBMIT + " --gpu-unit 99999999999 -- t.py", 2, "--gpu"),
    case("submit-name", SUBMIT + " --job-name ../x -- t.py", 2, "--job-name"),
    case("submit-mem-per-gpu", SUBMIT + " --mem-per-gpu 80GB -- t.py", 2, "--mem-per-gpu"),
    case("submit-mem-per-gpu-zero", SUBMIT + " --mem-per-gpu 0 -- t.py", 2, "--mem-per-gpu"),
    case("submit-mem-per-gpu-huge", [*SUBMIT.split(), "--mem-per-gpu", "9" * 5000, "--", "t.py"],
         2, "--mem-per-gpu"),
    case("submit-cpus-per-gpu", SUBMIT + " --cpus-per-gpu 0 -- t.py", 2, "--cpus-per-gpu"),
    case("submit-cpus-per-gpu-unicode", SUBMIT + " --cpus-per-gpu \u00b2 -- t.py", 2,
         "--cpus-per-gpu"),
    case("submit-settings-mem", "submit --config {d}/c.toml -- t.py", 2, "submit.mem_per_gpu_mb",
         {"c.toml": b"[submit]\nmem_per_gpu_mb = -5\n"}),
    case("submit-inbox", SUBMIT + " -- t.py", 2, "no-inbox: no such folder"),
    case("submit-inbox-empty", ["submit", "--inbox", "", "--", "t.py"], 2,
         "argument --inbox: must not be empty"),
    case("submit-workdir", "submit --inbox {d} --workdir {d}/f/w -- {d}/t.py", 2, "--workdir",
         {"f": b"x", "t.py": b"print(1)\n"}),
    case("submit-config-folder", "submit --config {d}/c -- t.py", 2, "is a folder", {"c": None}),
    case("launch-gpus-zero", "launch --dry-run --gpus 0 -- t.py", 2, "--gpus"),
    case("launch-gpus-huge", "launch --dry-run --gpus 99999999999 -- t.py", 2, "--gpus", proc=True),
    # --- admin install-files: nothing written where DEST is not a folder -------------------
    case("admin-no-action", "admin", 2, "required: ACTION"),
    case("admin-dest-empty", ["admin", "install-files", ""], 2, "DEST: must not be empty"),
    case("admin-dest-file", "admin install-files {d}/f", 2, "f: exists and is not a folder",
         {"f": b"x"}),
    case("admin-dest-under-file", "admin install-files {d}/f/x", 2, "a part of it is not a folder",
         {"f": b"x"}),
]
# fmt: on


@pytest.fixture(scope="module")
def state_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("state") / "icefrog.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


def _argv(row: Case, folder: Path, db: Path) -> list[str]:
    return [a.replace("{d}", str(folder)).replace("{db}", str(db)) for a in row.argv]


def _make_files(row: Case, folder: Path) -> None:
    for name, content in row.files.items():
        path = folder / name
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)


def _in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code if isinstance(exc.code, int) else 1
    finally:  # a command that set up logging must not write into a later row's capture
        root.handlers[:], root.level = handlers, level
    return code, capsys.readouterr().err


def _child(argv: list[str], folder: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "icefrog_slurm", *argv],
            capture_output=True,
            timeout=TIMEOUT_S,
            cwd=folder,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: no answer within {TIMEOUT_S} s")
    return done.returncode, done.stderr.decode("utf-8", "backslashreplace")


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("row", CASES, ids=[c.id for c in CASES])
def test_hostile_input_exits_with_a_clear_error(
    row: Case, tmp_path: Path, state_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "case"
    folder.mkdir()
    _make_files(row, folder)
    argv = _argv(row, folder, state_db)
    code, err = _child(argv, folder) if row.proc else _in_process(argv, capsys)
    assert "Traceback" not in err, err
    assert code == row.code, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("icefrog") and "error: " in last, err
    assert row.fragment in last, err
    if row.argv[:1] == ("evaluate",):  # refused before it wrote a trace or a run
        assert not (folder / "eval").exists()


def test_the_table_covers_every_subcommand() -> None:
    from icefrog_slurm.cli import COMMANDS

    covered = {c.argv[0] for c in CASES if c.argv}
    assert set(COMMANDS) <= covered, sorted(set(COMMANDS) - covered)


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/out"), 2,
         "icefrog tune: error: /x/out: No such file or directory"),
        (OSError(errno.ENOSPC, "No space left on device", "/x/out"), 1,
         "icefrog tune: error: /x/out: No space left on device"),
    ],
)  # fmt: skip
def test_a_file_error_names_the_file_in_one_line(
    error: OSError, code: int, line: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The last resort for a path no check foresaw: one line naming it, exit 2 when the path
    is wrong, 1 when the system failed (a full disk)."""

    def fail(_args: object) -> int:
        raise error

    monkeypatch.setattr("icefrog_slurm.commands.tune.run", fail)
    assert main(["tune", "x.json"]) == code
    assert capsys.readouterr().err.strip() == line


def test_an_error_without_a_file_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError about no path is a bug: it keeps its traceback."""

    def fail(_args: object) -> int:
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    monkeypatch.setattr("icefrog_slurm.commands.tune.run", fail)
    with pytest.raises(ConnectionResetError):
        main(["tune", "x.json"])


def _tables_and_rows(url: str, table: str) -> tuple[set[str], list[tuple[object, ...]]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            names = set(inspect(conn).get_table_names())
            rows = [tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {table}")]
        return names, rows
    finally:
        engine.dispose()


def _create(url: str, *statements: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_db_upgrade_leaves_another_applications_database_alone(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _create(
        empty_db_url,
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, name VARCHAR(20))",
        "INSERT INTO customers VALUES (1, 'kept')",
    )
    assert main(["db", "upgrade", "--url", empty_db_url]) == 2
    err = capsys.readouterr().err
    assert "holds tables (customers)" in err and "not an icefrog database" in err
    assert _tables_and_rows(empty_db_url, "customers") == ({"customers"}, [(1, "kept")])


def test_db_upgrade_refuses_a_revision_it_does_not_know(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _create(
        empty_db_url,
        "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)",
        "INSERT INTO alembic_version VALUES ('f00dfeed1234')",
    )
    assert main(["db", "upgrade", "--url", empty_db_url]) == 2
    assert "at revision f00dfeed1234: not a revision of this icefrog" in capsys.readouterr().err
    after = _tables_and_rows(empty_db_url, "alembic_version")
    assert after == ({"alembic_version"}, [("f00dfeed1234",)])


def test_db_upgrade_migrates_an_emptied_version_table(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A version table and nothing else (what a downgrade to base leaves) is an empty
    database: it is migrated."""
    _create(empty_db_url, "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    assert main(["db", "upgrade", "--url", empty_db_url]) == 0
    assert f"is at revision {migrate.head_revision()}" in capsys.readouterr().out


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
_FIELDS = sorted({*tune.FIELDS, *solve.TOP, *solve.JOB, *solve.OPTION, "options", "id"})


def _documents(base: Mapping[str, object]) -> st.SearchStrategy[dict[str, object]]:
    """``base`` with some fields replaced by any JSON value (or dropped)."""
    edit = st.dictionaries(st.sampled_from(_FIELDS), _JSON | st.just(None), max_size=3)
    return edit.map(lambda e: {k: v for k, v in {**base, **e}.items() if v is not None})


@settings_hyp(max_examples=150, deadline=None)
@given(doc=_documents(TUNE))
def test_tune_documents_fail_only_with_input_errors(doc: dict[str, object]) -> None:
    with contextlib.suppress(InputError):
        tune.choose(tune.parse_request(json.loads(json.dumps(doc))))


@settings_hyp(max_examples=150, deadline=None)
@given(doc=_documents(SOLVE))
def test_solve_documents_fail_only_with_input_errors(doc: dict[str, object]) -> None:
    with contextlib.suppress(InputError):
        solve.parse_problem(json.loads(json.dumps(doc)))


@settings_hyp(max_examples=150, deadline=None)
@given(text=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_settings_file_loads_or_fails_with_an_input_error(state_db: Path, text: bytes) -> None:
    path = state_db.parent / "c.toml"
    path.write_bytes(b"[controller]\n" + text)
    with contextlib.suppress(InputError):
        load_settings(path)


_OPTION_TEXT = st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(
    ["", ",", "now-9999999999999999weeks", "JobID%0", "JobID%9999999", "\u0663", "all"]
)


@settings_hyp(max_examples=150, deadline=None)
@given(
    option=st.sampled_from(["--user", "--jobs", "--state", "--starttime", "--endtime", "--format"]),
    value=_OPTION_TEXT,
)
def test_sacct_options_list_or_fail_in_one_line(state_db: Path, option: str, value: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["sacct", "--db", f"sqlite:///{state_db}", f"{option}={value}"])
    assert code in (0, 2), err.getvalue()
    assert code == 0 or err.getvalue().count("\n") == 1, err.getvalue()


@pytest.mark.timeout(TIMEOUT_S)
def test_a_simulated_clock_that_cannot_advance_stops_with_an_error() -> None:
    """Past the workload reader's bound (the engine's own callers): at 1e300 s a round of
    300 s no longer moves a float clock; the loop says so instead of spinning forever."""
    from icefrog_slurm.policies.standin import StandInPolicy
    from icefrog_slurm.settings import Settings
    from icefrog_slurm.sim.engine import Engine, SimOptions
    from icefrog_slurm.sim.workload import TraceJob

    job = TraceJob("j0", 1e300, "resnet18-cifar10", 1, 128)
    engine = Engine([job], StandInPolicy(), settings=Settings(), options=SimOptions(gpus=4))
    with pytest.raises(InputError, match="simulated time cannot advance past 1e"):
        engine.run()
