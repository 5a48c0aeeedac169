"""Model Trainer parts that need no second process: checkpoints (atomic, torn ones
skipped), reports (parse back with the controller's parser), decisions, the frozen
penalty (eq 3), the one-replica gradient statistics, the FLOP table and the CPU analogue of GPU
utilisation."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from icefrog_launcher import checkpoint  # noqa: E402
from icefrog_launcher.decision import read_decision  # noqa: E402
from icefrog_launcher.profiler import (  # noqa: E402
    StepTimer,
    cpu_utilization,
    find_layers,
    layer_flops,
    param_bytes,
    utilization,
)
from icefrog_launcher.reports import Reporter  # noqa: E402
from icefrog_launcher.stats import GradStatsCollector  # noqa: E402
from icefrog_slurm.errors import InputError  # noqa: E402
from icefrog_slurm.protocol import (  # noqa: E402
    Decision,
    Envelope,
    parse_decision,
    parse_envelope,
    parse_payload,
)

pytestmark = pytest.mark.torch


def test_checkpoint_round_trip_and_pruning(tmp_path: Path) -> None:
    for n in range(4):
        checkpoint.save(tmp_path, n, {"n": n, "w": torch.full((3,), float(n))})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000002.json", "ckpt-00000002.pt", "ckpt-00000003.json", "ckpt-00000003.pt"
    ]  # fmt: skip
    found = checkpoint.load_latest(tmp_path)
    assert found is not None and found[0] == 3 and found[1]["w"].tolist() == [3.0] * 3


def test_torn_or_corrupt_checkpoint_is_never_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint.save(tmp_path, 1, {"n": 1})
    checkpoint.save(tmp_path, 2, {"n": 2})
    newest = tmp_path / "ckpt-00000002.pt"
    newest.write_bytes(newest.read_bytes()[:-10])  # torn: truncated after the manifest
    found = checkpoint.load_latest(tmp_path)
    assert found is not None and found == (1, {"n": 1})
    assert "skipping checkpoint ckpt-00000002" in capsys.readouterr().err
    # flipped byte, same size: the checksum catches it
    good = (tmp_path / "ckpt-00000001.pt").read_bytes()
    (tmp_path / "ckpt-00000001.pt").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert checkpoint.load_latest(tmp_path) is None
    # a .pt without its manifest (crash before the commit marker) is invisible
    (tmp_path / "ckpt-00000005.pt").write_bytes(good)
    assert checkpoint.latest_number(tmp_path) == 2


def test_reports_parse_back(tmp_path: Path) -> None:
    reporter = Reporter(inbox=str(tmp_path), slurm_job_id="17", job_name="mlp")
    before = time.time_ns() // 1000
    path = reporter.send("metric", {"epoch": 3, "name": "val_acc", "value": 0.5})
    assert path is not None and path.name == f"{reporter.seq - 1}-metric.json"
    envelope = parse_envelope(path.read_bytes())
    assert (envelope.kind, envelope.slurm_job_id) == ("metric", "17")
    assert envelope.seq >= before  # microseconds: never reused after the folder is emptied
    assert parse_payload("metric", envelope.payload).value == 0.5
    if shutil.which("munge"):
        assert envelope.credential.startswith("MUNGE:")
    # a restarted job continues after reports still waiting in the folder
    again = Reporter(inbox=str(tmp_path), slurm_job_id="17", job_name="mlp")
    assert again.seq == envelope.seq + 1
    # and after the controller has archived them (empty folder), numbers still grow
    path.unlink()
    later = Reporter(inbox=str(tmp_path), slurm_job_id="17", job_name="mlp")
    second = later.send("metric", {"epoch": 4, "name": "val_acc", "value": 0.6})
    assert second is not None and parse_envelope(second.read_bytes()).seq > envelope.seq
    assert (
        Reporter(inbox=str(tmp_path), slurm_job_id="17", job_name="m", enabled=False).send(
            "metric", {}
        )
        is None
    )


def test_report_without_munge_is_written_unsigned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No munge program: the report is still written (by security.drop_report: mode 0600, the
    inbox's ``<seq>-<kind>.json`` name) with an empty credential, as before the move."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    reporter = Reporter(inbox=str(tmp_path / "inbox"), slurm_job_id="18", job_name="m")
    path = reporter.send("metric", {"epoch": 1, "name": "loss", "value": 2.0})
    assert path is not None
    envelope = parse_envelope(path.read_bytes())
    assert envelope.credential == ""
    assert path.name == f"{envelope.seq}-metric.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_reports_wait_for_munged_and_keep_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """munged away: a report is kept, not written unsigned; back: the kept ones are signed and
    written first, in order; the last report waits for munged (here: it comes back)."""
    from icefrog_launcher import reports
    from icefrog_slurm import security

    up = [False]

    def sign(envelope: Envelope, **_: object) -> Envelope:
        if not up[0]:
            raise security.MungeUnavailable("munged: socket refused")
        return dataclasses.replace(envelope, credential=f"MUNGE:{envelope.seq}")

    monkeypatch.setattr(security, "sign", sign)
    reporter = Reporter(inbox=str(tmp_path / "inbox"), slurm_job_id="19", job_name="m")
    assert reporter.send("metric", {"epoch": 1, "name": "loss", "value": 2.0}) is None
    assert reporter.send("metric", {"epoch": 2, "name": "loss", "value": 1.0}) is None
    assert list(reporter.folder.iterdir()) == [] and len(reporter.waiting) == 2
    up[0] = True
    last = reporter.send("metric", {"epoch": 3, "name": "loss", "value": 0.5})
    written = sorted(reporter.folder.iterdir(), key=lambda p: int(p.name.split("-")[0]))
    assert last == written[-1] and reporter.waiting == []
    envelopes = [parse_envelope(p.read_bytes()) for p in written]
    assert [e.payload["epoch"] for e in envelopes] == [1, 2, 3]
    assert all(e.credential == f"MUNGE:{e.seq}" for e in envelopes)
    up[0] = False
    monkeypatch.setattr(reports, "FINAL_WAIT_S", 0.2)
    monkeypatch.setattr(time, "sleep", lambda s: up.__setitem__(0, True))  # back after a wait
    final = reporter.send("finished", {"reason": "max_epochs", "epoch": 3, "final_metric": 0.5})
    assert final is not None and parse_envelope(final.read_bytes()).credential.startswith("MUNGE:")


def _fake_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    from icefrog_slurm import security

    def sign(envelope: Envelope, **_: object) -> Envelope:
        return dataclasses.replace(envelope, credential=f"MUNGE:{envelope.seq}")

    monkeypatch.setattr(security, "sign", sign)


def test_reports_wait_for_a_writable_inbox_and_keep_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An inbox that cannot be written (missing: its parent is a file, as root can write a
    read-only folder; then a full disk) fails no report: each is kept in order, one warning
    an outage, and written, oldest first, once the inbox takes writes again."""
    import errno

    from icefrog_launcher import reports
    from icefrog_slurm import security

    _fake_sign(monkeypatch)
    blocker = tmp_path / "shared"
    blocker.write_text("not a folder")
    inbox = blocker / "inbox"
    reporter = Reporter(inbox=str(inbox), slurm_job_id="20", job_name="m")  # raised before
    assert reporter.send("metric", {"epoch": 0, "name": "loss", "value": 3.0}) is None
    assert reporter.send("metric", {"epoch": 1, "name": "loss", "value": 2.0}) is None
    assert len(reporter.waiting) == 2
    err = capsys.readouterr().err
    assert err.count("warning: reports cannot be written") == 1 and "kept, in order" in err
    blocker.unlink()  # the inbox is back (mounted again)
    inbox.mkdir(parents=True)
    last = reporter.send("metric", {"epoch": 2, "name": "loss", "value": 1.0})
    assert last is not None and reporter.waiting == [] and last.parent == reporter.folder
    written = sorted(reporter.folder.iterdir(), key=lambda p: int(p.name.split("-")[0]))
    assert last == written[-1]
    envelopes = [parse_envelope(p.read_bytes()) for p in written]
    assert [e.payload["epoch"] for e in envelopes] == [0, 1, 2]
    assert all(e.credential == f"MUNGE:{e.seq}" for e in envelopes)
    assert "written to" in capsys.readouterr().err
    # a full disk: the same, and no temp file is left behind
    real_write = security.write_atomic
    full = [True]

    def write_atomic(path: Path, data: bytes, **kw: int) -> None:
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data, **kw)

    monkeypatch.setattr(security, "write_atomic", write_atomic)
    monkeypatch.setattr(reports, "MAX_WAITING", 3)  # bounded: the oldest are dropped
    for epoch in range(3, 8):
        assert reporter.send("metric", {"epoch": epoch, "name": "loss", "value": 0.5}) is None
    assert [e.payload["epoch"] for e in reporter.waiting] == [5, 6, 7]
    assert capsys.readouterr().err.count("No space left on device") == 1
    full[0] = False
    reporter.send("metric", {"epoch": 8, "name": "loss", "value": 0.5})
    assert reporter.waiting == [] and "2 oldest reports dropped" in capsys.readouterr().err
    tail = sorted(reporter.folder.iterdir(), key=lambda p: int(p.name.split("-")[0]))[3:]
    assert [parse_envelope(p.read_bytes()).payload["epoch"] for p in tail] == [5, 6, 7, 8]
    # the last report waits for the inbox as for munged, then gives up without raising
    full[0] = True
    monkeypatch.setattr(reports, "FINAL_WAIT_S", 0.0)
    final = {"reason": "max_epochs", "epoch": 8, "final_metric": 0.5}
    assert reporter.send("finished", final) is None
    assert "1 reports of this job were not written" in capsys.readouterr().err


def test_decision_parsing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    decision = Decision(round=3, gpus=2, batch=64, frozen=4, shared=True)
    assert parse_decision(decision.to_json()) == decision
    assert read_decision(tmp_path / "missing.json") is None
    bad = tmp_path / "d.json"
    bad.write_text(json.dumps({"round": 1, "gpus": 1, "batch": 0, "frozen": 0}))
    assert read_decision(bad) is None
    assert "decision.batch: must be >= 1" in capsys.readouterr().err
    with pytest.raises(InputError, match=r"decision\.colour: unknown field"):
        parse_decision(json.dumps({"round": 1, "gpus": 1, "batch": 1, "frozen": 0, "colour": 1}))


def test_frozen_penalty_eq3() -> None:
    # the spec's worked example: prefix variance 20 at freeze time, suffix 80 now
    stats = GradStatsCollector(2)
    stats.last_var, stats.frozen_var = [0.0, 80.0], [20.0, 0.0]
    assert stats.penalty(1) == pytest.approx(0.8)
    stats.last_var, stats.frozen_var = [5.0, 1.0], [5.0, 0.0]
    assert stats.penalty(0) == 1.0
    stats.last_var, stats.frozen_var = [0.0, 0.0], [0.0, 0.0]
    assert stats.penalty(1) == 1.0
    # a negative estimate (the unbiased estimator can dip below 0) counts as 0
    stats.last_var, stats.frozen_var = [0.0, 30.0], [-1.0, 0.0]
    assert stats.penalty(1) == 1.0


def test_one_replica_statistics_estimate_variance() -> None:
    """Gradients = G + noise/sqrt(m) with known tr(Sigma): the pair estimator recovers it."""
    gen = torch.Generator().manual_seed(0)
    m, dims = 16, [200, 50]
    true_g = [torch.full((d,), 0.5) for d in dims]  # |G|^2 = 50 and 12.5
    sigma2 = [2.0, 8.0]  # per-coordinate per-sample variance: tr(Sigma) = 400 and 400
    stats = GradStatsCollector(2, every=2)
    index = torch.tensor([0, 1])
    for step in range(400):
        grads = [
            g + torch.randn(d, generator=gen) * (s / m) ** 0.5
            for g, d, s in zip(true_g, dims, sigma2, strict=True)
        ]
        stats.finish_step(index, grads, step=step, local_batch=m, world=1)
    var, sqr = stats.end_epoch(frozen=0)
    assert var == pytest.approx([400.0, 400.0], rel=0.1)
    assert sqr == pytest.approx([50.0, 12.5], rel=0.15)
    stats.freeze_changed(0, 1)
    var2, _ = stats.end_epoch(frozen=1)
    assert var2[0] == var[0]  # the frozen layer keeps its at-freeze value (eq 3)


def test_a_measured_step_pairs_only_with_the_step_right_after_it_on_one_replica() -> None:
    """A one-replica step's copy (saved in a checkpoint at a stop) is paired only with the
    next step of one replica: a resume on two replicas drops it (it no longer rides in
    every checkpoint), and one that comes back to one replica at another step pairs
    nothing with it."""
    index = torch.tensor([0, 1])
    grads = [torch.ones(4), torch.ones(3)]
    stats = GradStatsCollector(2, every=8)
    stats.finish_step(index, grads, step=8, local_batch=4, world=1)
    assert stats.state_dict()["previous"]  # kept for the pair, also across a stop
    moved = GradStatsCollector(2, every=8)
    moved.load_state_dict(stats.state_dict())
    moved.finish_step(index, grads, step=17, local_batch=4, world=1)  # not step 9
    assert moved.state_dict()["previous"] == [] and moved.state_dict()["sums"] == []
    two = GradStatsCollector(2, every=8)
    two.load_state_dict(stats.state_dict())
    two._finish_pollux = lambda *a, **k: None  # type: ignore[method-assign]
    two.finish_step(index, grads, step=16, local_batch=4, world=2)
    assert two.state_dict()["previous"] == []


def test_statistics_so_far_are_what_the_epoch_end_gives_without_resetting() -> None:
    """``so_far`` (the trainer's mid-epoch reports): None before the epoch's first measured
    step, then the averages so far, equal to what ``end_epoch`` returns at that point, and
    reading them resets nothing; layers not measured this epoch keep their last values,
    frozen ones their at-freeze values."""
    gen = torch.Generator().manual_seed(1)
    stats = GradStatsCollector(2, every=2)
    index = torch.tensor([0, 1])
    assert stats.so_far(0) is None

    def steps(n: int, scale: float) -> None:
        for step in range(n):
            grads = [torch.randn(10, generator=gen) * scale, torch.randn(5, generator=gen)]
            stats.finish_step(index, grads, step=step, local_batch=8, world=1)

    steps(20, 1.0)
    first = stats.so_far(0)
    assert first is not None and all(v > 0 for v in first[0])
    assert stats.so_far(0) == first  # reading twice: the same, nothing reset
    steps(20, 3.0)  # noisier steps: the running average moves
    second = stats.so_far(0)
    assert second is not None and second[0][0] > first[0][0]
    assert stats.end_epoch(0) == second
    assert stats.so_far(0) is None  # a new epoch: nothing measured yet
    stats.freeze_changed(0, 1)
    steps(4, 1.0)
    got = stats.so_far(1)
    assert got is not None and got[0][0] == second[0][0]  # frozen: its at-freeze value
    assert got == stats.end_epoch(1)


def test_layers_and_flops() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    layers = find_layers(model)
    assert len(layers) == 3
    flops = layer_flops(model, layers, torch.randn(5, 8))
    # forward 2*5*8*16 and the weight gradient (the input needs none) of the same size
    assert flops == [2 * 2 * 5 * 8 * 16, 0.0, 2 * 2 * 5 * 16 * 4 + 2 * 5 * 16 * 4]
    assert [param_bytes(layer) for layer in layers] == [(8 * 16 + 16) * 4, 0.0, (16 * 4 + 4) * 4]
    assert all(p.grad is None for p in model.parameters())


def test_cpu_utilization_is_cpu_time_over_the_thread_budget() -> None:
    assert cpu_utilization(1.0, 2.0, 1) == 0.5
    assert cpu_utilization(1.0, 2.0, 2) == 0.25
    assert cpu_utilization(5.0, 2.0, 2) == 1.0  # clipped (threads beyond torch's budget)
    assert cpu_utilization(1.0, 0.0, 1) == -1.0  # nothing measured: unknown
    cpu = torch.device("cpu")
    assert utilization(cpu, 1.0, 4.0) == cpu_utilization(1.0, 4.0, torch.get_num_threads())


def test_step_timer_sums_cpu_time_of_measured_steps_only() -> None:
    timer = StepTimer(torch.device("cpu"))
    # step 1 opens the window; step 2 is measured (3 CPU s in 4 s); step 3 is not
    for end, cpu, measured in ((10.0, 1.0, True), (14.0, 4.0, True), (20.0, 9.0, False)):
        timer.fwd_start, timer.fwd_end = end - 2.0, end - 1.0
        timer.record(end, measured, cpu=cpu)
    means = timer.take()
    assert means is not None
    assert (means["iter"], means["cpu"]) == (4.0, 3.0)
    assert timer.take() is None


def _measured_step(timer: StepTimer, work: object) -> None:
    timer.fwd_start = time.perf_counter()
    timer.fwd_end = time.perf_counter()
    work()  # type: ignore[operator]
    timer.record(time.perf_counter(), True)


def test_cpu_utilization_tells_computing_from_waiting() -> None:
    """A step that sleeps (waiting, as on a shared device) uses less of its budget than a
    step that computes; both lie in 0..1."""
    x = torch.randn(256, 256)
    results = []
    for work in (lambda: time.sleep(0.2), lambda: [x @ x for _ in range(200)]):
        timer = StepTimer(torch.device("cpu"))
        timer.record(time.perf_counter(), False)
        _measured_step(timer, work)
        means = timer.take()
        assert means is not None
        results.append(utilization(torch.device("cpu"), means["cpu"], means["iter"]))
    sleeping, computing = results
    assert 0.0 <= sleeping < computing <= 1.0


@pytest.mark.parametrize("floor", [0.0, None])
def test_trainer_reports_statistics_within_an_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, floor: float | None
) -> None:
    """Within an epoch the trainer reports its statistics so far after every further
    eighth, labelled with the epoch in progress, its end's report last (the one the store
    keeps); never sooner than MID_EPOCH_STATS_MIN_S after the last report, so with the
    default (60 s) these one-second epochs report at their ends only."""
    from icefrog_launcher import Trainer
    from icefrog_launcher import trainer as trainer_module
    from icefrog_slurm.protocol import GRAD_REPORTS_PER_EPOCH, GradStats
    from tests.support.munge import ensure_munged
    from tests.support.tiny_job import tiny_job, tiny_mlp, train

    why = ensure_munged()
    if why:
        pytest.skip(why)
    if floor is not None:
        monkeypatch.setattr(trainer_module, "MID_EPOCH_STATS_MIN_S", floor)
    data, config = tiny_job(tmp_path, samples=512, batch=(16, 16), max_epochs=2, job_id="9")
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = Trainer(model, opt, data, config=config, env={}, stats_every=2)
    assert train(trainer, opt) == 64
    paths = sorted((tmp_path / "inbox" / "9").glob("*-grad_stats.json"))
    reports = [parse_payload("grad_stats", parse_envelope(p.read_bytes()).payload) for p in paths]
    assert all(isinstance(r, GradStats) for r in reports)
    epochs = [r.epoch for r in reports]
    if floor is None:
        assert epochs == [0, 1]
    else:
        # 32 steps an epoch, a pair measured every 2: each eighth has new statistics
        assert epochs == [0] * GRAD_REPORTS_PER_EPOCH + [1] * GRAD_REPORTS_PER_EPOCH
        assert len({r.grad_var for r in reports}) == len(reports)  # each a new average
    last = reports[-1]
    assert list(last.grad_var) == pytest.approx([v / 16 for v in trainer.stats.last_var])


def test_an_eighth_without_statistics_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the statistics so far waits for the device: an eighth with nothing measured
    yet is read once, not again at each of its micro-batches, and reports nothing."""
    from icefrog_launcher import Trainer
    from icefrog_launcher import trainer as trainer_module
    from icefrog_slurm.protocol import GRAD_REPORTS_PER_EPOCH
    from tests.support.munge import ensure_munged
    from tests.support.tiny_job import tiny_job, tiny_mlp, train

    why = ensure_munged()
    if why:
        pytest.skip(why)
    monkeypatch.setattr(trainer_module, "MID_EPOCH_STATS_MIN_S", 0.0)
    data, config = tiny_job(tmp_path, samples=512, batch=(16, 16), max_epochs=1, job_id="10")
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = Trainer(model, opt, data, config=config, env={}, stats_every=2)
    reads: list[int] = []

    def nothing_yet(frozen: int) -> None:
        reads.append(trainer.position)
        return None

    monkeypatch.setattr(trainer.stats, "so_far", nothing_yet)
    assert train(trainer, opt) == 32
    assert len(reads) == GRAD_REPORTS_PER_EPOCH - 1  # one read an eighth, 32 micro-batches
    assert len(list((tmp_path / "inbox" / "10").glob("*-grad_stats.json"))) == 1  # the end's
