"""The elastic data loader on its own: it reads and moves only the shared DataPosition, and
a position saved mid-epoch resumes the same order with another process count and batch,
also when torch DataLoader workers read ahead of the training loop."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import Dataset, IterableDataset, TensorDataset, get_worker_info  # noqa: E402

from icefrog_launcher import Trainer  # noqa: E402
from icefrog_launcher.config import JobConfig  # noqa: E402
from icefrog_launcher.data import ElasticDataLoader, epoch_order  # noqa: E402
from icefrog_launcher.position import DataPosition  # noqa: E402
from icefrog_slurm.protocol import Decision  # noqa: E402
from icefrog_slurm.security import write_atomic  # noqa: E402

pytestmark = pytest.mark.torch

SIZE = 23


def _dataset() -> TensorDataset:
    return TensorDataset(torch.arange(SIZE))


class Indexed(Dataset[tuple[Any, ...]]):
    """Sample i is (i,); with ``record`` each read also leaves a file <i>-<pid> there (the
    workers are other processes), so a test sees what was read ahead."""

    def __init__(self, size: int, record: Path | None = None) -> None:
        self.size, self.record = size, record

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        if self.record is not None:
            (self.record / f"{index}-{os.getpid()}").touch()
        return (torch.tensor(index),)


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(3))


class Points(Dataset[tuple[Any, ...]]):
    """Sample i is (features, i): a model's input and the sample's identity."""

    def __len__(self) -> int:
        return 50

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return torch.full((2,), float(index)), torch.tensor(index)


def tagged(samples: list[tuple[Any, ...]]) -> dict[str, Any]:
    """A collate_fn: the indices and where it ran (a worker id, or -1 in the main process)."""
    info = get_worker_info()
    return {"x": torch.stack([s[0] for s in samples]), "worker": info.id if info else -1}


def with_pid(samples: list[tuple[Any, ...]]) -> tuple[torch.Tensor, int]:
    return torch.stack([s[0] for s in samples]), os.getpid()


class Interrupted(Exception):
    pass


class StopAt:
    """A before_step that stops at the boundary after ``steps`` steps, as the trainer's
    requeue exit does, once the workers have had time to fill their prefetch queue."""

    def __init__(self, steps: int) -> None:
        self.steps, self.calls = steps, 0

    def __call__(self) -> None:
        if self.calls == self.steps:
            time.sleep(0.5)
            raise Interrupted
        self.calls += 1


def _take(
    position: DataPosition,
    world: int,
    steps: int | None = None,
    dataset: Any = None,
    seed: int = 5,
    **loader_args: Any,
) -> list[list[int]]:
    """Every rank's samples, step by step, over one shared copy of the position each."""
    ranks: list[list[int]] = []
    for rank in range(world):
        at = dataclasses.replace(position)
        data = _dataset() if dataset is None else dataset
        loader = ElasticDataLoader(
            data, at, rank=rank, world=world, seed=seed, loader_args=loader_args
        )
        seen: list[int] = []
        for n, (x,) in enumerate(loader):
            seen += x.tolist()
            if steps is not None and n + 1 == steps:
                break
        ranks.append(seen)
    return ranks


def test_the_loader_moves_the_shared_position_and_skips_a_short_remainder() -> None:
    at = DataPosition(epoch=2, samples=0, batch=4)
    counts: list[tuple[int, int]] = []
    boundaries: list[int] = []
    loader = ElasticDataLoader(
        _dataset(),
        at,
        rank=1,
        world=3,
        seed=5,
        before_step=lambda: boundaries.append(at.samples),
        on_step=lambda g, m: counts.append((g, m)),
    )
    assert len(loader) == 2  # 23 samples, 12 a step
    batches = [x.tolist() for (x,) in loader]
    order = epoch_order(SIZE, 5, 2, True).tolist()
    assert batches == [order[4:8], order[16:20]]  # rank 1's slice of each step (11 = 4+4+3)
    assert counts == [(12, 4), (11, 4)] and boundaries == [0, 12, 23]
    assert at == DataPosition(epoch=2, samples=SIZE, batch=4)
    short = DataPosition(epoch=2, samples=SIZE - 2, batch=4)  # 2 left, fewer than world
    assert list(ElasticDataLoader(_dataset(), short, world=3, seed=5)) == []
    assert short.samples == SIZE


def test_a_position_saved_mid_epoch_resumes_the_order_with_another_world_and_batch() -> None:
    before = _take(DataPosition(epoch=1, samples=0, batch=3), world=2, steps=2)
    after = _take(DataPosition(epoch=1, samples=12, batch=5), world=3)
    seen = sorted(i for rank in before + after for i in rank)
    assert seen == list(range(SIZE))  # every sample once: 12 before, 11 after
    assert sum(map(len, before)) == 12


def test_a_tensor_dataset_read_in_one_go_gives_the_batches_the_dataloader_gives() -> None:
    """The direct TensorDataset path and torch's DataLoader (here without workers, made to
    run by a collate_fn) hand out the same batches."""
    direct = _take(DataPosition(epoch=3, batch=4), world=2)
    through = _take(
        DataPosition(epoch=3, batch=4), world=2, collate_fn=torch.utils.data.default_collate
    )
    assert direct == through and sum(map(len, direct)) == SIZE  # steps of 8, 8 and 7


def test_an_interruption_with_workers_reading_ahead_resumes_at_the_consumed_sample(
    tmp_path: Path,
) -> None:
    """Two workers read up to four batches ahead; the trainer stops (before_step raises, as
    its requeue exit does) after two steps: the position counts those two steps only, and a
    resume with another world size and batch, again with workers, gives exactly the rest."""
    size, world, batch, stop_after = 40, 2, 3, 2
    read = tmp_path / "read"
    read.mkdir()
    positions, before = [], []
    for rank in range(world):
        at = DataPosition(epoch=4, batch=batch)
        loader = ElasticDataLoader(
            Indexed(size, read if rank == 0 else None),
            at,
            rank=rank,
            world=world,
            seed=9,
            before_step=StopAt(stop_after),
            loader_args={"num_workers": 2, "prefetch_factor": 2},
        )
        seen: list[int] = []
        with pytest.raises(Interrupted):
            for (x,) in loader:
                seen += x.tolist()
        positions.append(at.samples)
        before.append(seen)
    consumed = stop_after * world * batch
    assert positions == [consumed, consumed]
    fetched = {name.split("-")[0] for name in os.listdir(read)}
    pids = {name.split("-")[1] for name in os.listdir(read)}
    assert len(fetched) > len(before[0]) and str(os.getpid()) not in pids  # read ahead, elsewhere
    after = _take(
        DataPosition(epoch=4, samples=consumed, batch=5),
        world=3,
        dataset=Indexed(size),
        seed=9,
        num_workers=2,
    )
    seen = [i for rank in before + after for i in rank]
    assert sorted(seen) == list(range(size))  # none twice, none lost
    order = epoch_order(size, 9, 4, True).tolist()
    assert sorted(i for rank in after for i in rank) == sorted(order[consumed:])


def test_collate_fn_runs_in_the_workers_and_pin_memory_reaches_the_dataloader() -> None:
    at = DataPosition(batch=4)
    loader = ElasticDataLoader(
        Indexed(16),
        at,
        seed=1,
        loader_args={"num_workers": 2, "collate_fn": tagged, "pin_memory": True},
    )
    assert loader.dataloader.pin_memory is True
    if torch.accelerator.is_available():
        batches = list(loader)
        assert all(b["x"].is_pinned() for b in batches)
    else:  # torch's DataLoader saw the flag and says it cannot pin here
        with pytest.warns(UserWarning, match="pin_memory"):
            batches = list(loader)
    assert [b["x"].tolist() for b in batches] == epoch_order(16, 1, 0, True).view(4, 4).tolist()
    assert {b["worker"] for b in batches} == {0, 1}  # collated in the workers
    assert loader.fetch([3, 5])["worker"] == -1 and at.samples == 16  # the same collate here


def test_persistent_workers_follow_a_batch_changed_between_epochs() -> None:
    """One worker pool for both epochs; the sampler reads the new per-GPU batch."""
    size, world = 30, 2
    ats = [DataPosition(epoch=0, batch=3) for _ in range(world)]
    loaders = [
        ElasticDataLoader(
            Indexed(size),
            ats[rank],
            rank=rank,
            world=world,
            loader_args={"num_workers": 2, "persistent_workers": True, "collate_fn": with_pid},
        )
        for rank in range(world)
    ]
    pids: list[set[int]] = [set() for _ in range(world)]
    for epoch, batch in ((0, 3), (1, 5)):
        seen: list[int] = []
        for rank, loader in enumerate(loaders):
            ats[rank].epoch, ats[rank].samples, ats[rank].batch = epoch, 0, batch
            sizes = []
            for x, pid in loader:
                sizes.append(len(x))
                seen += x.tolist()
                pids[rank].add(pid)
            assert sizes == [batch] * (size // (batch * world))
        assert sorted(seen) == list(range(size))
        assert seen[:batch] == epoch_order(size, 0, epoch, True)[:batch].tolist()
    assert all(len(p) == 2 for p in pids)  # the same two workers in both epochs


def test_an_iterable_dataset_and_managed_or_unknown_arguments_are_refused() -> None:
    at = DataPosition()
    with pytest.raises(TypeError, match="map-style"):
        ElasticDataLoader(Stream(), at)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'batch_size' is the elastic loader's own"):
        ElasticDataLoader(_dataset(), at, loader_args={"batch_size": 8})
    with pytest.raises(ValueError, match="'sampler'"):
        ElasticDataLoader(_dataset(), at, loader_args={"sampler": [0, 1]})
    with pytest.raises(TypeError, match=r"'num_worker' is not a torch\.utils\.data\.DataLoader"):
        ElasticDataLoader(_dataset(), at, loader_args={"num_worker": 2})
    with pytest.raises(ValueError, match="in_order=False"):
        ElasticDataLoader(Indexed(4), at, loader_args={"num_workers": 2, "in_order": False})


def _trained(workdir: Path, stop_after: int | None) -> tuple[Trainer, list[list[int]], int]:
    """One epoch of a linear model through a Trainer whose loader has two workers and a
    collate_fn; USR1 after ``stop_after`` samples (the trainer checkpoints and exits 75)."""
    config = JobConfig(batch=(4, 8), max_epochs=1, workdir=str(workdir))
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    args = {"num_workers": 2, "collate_fn": with_pid_pair}
    trainer = Trainer(model, optimizer, Points(), config=config, env={}, loader_args=args)
    seen: list[list[int]] = []
    status = 0
    try:
        for _ in trainer.epochs():
            for x, index, pid in trainer.loader:
                assert pid != os.getpid()  # read by a worker
                optimizer.zero_grad()
                trainer.model(x).sum().backward()
                optimizer.step()
                seen.append(index.tolist())
                if sum(map(len, seen)) == stop_after:
                    os.kill(os.getpid(), signal.SIGUSR1)
    except SystemExit as stop:
        status = int(stop.code or 0)
    return trainer, seen, status


def with_pid_pair(samples: list[tuple[Any, ...]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    xs, ys = zip(*samples, strict=True)
    return torch.stack(xs), torch.stack(ys), os.getpid()


@pytest.mark.usefixtures("keep_signal_handlers")
def test_the_trainer_with_loader_workers_checkpoints_the_consumed_position(
    tmp_path: Path,
) -> None:
    """A stop signal after 3 steps of 4: the checkpoint says 12 samples, although the two
    workers had read further; resumed with a decision for batch 7, the trainer trains
    exactly the rest."""
    first, before, status = _trained(tmp_path, stop_after=12)
    assert status == 75 and first.loader.dataloader.num_workers == 2
    flat = [i for batch in before for i in batch]
    assert first.position == 12 and flat == epoch_order(50, 0, 0, True)[:12].tolist()
    write_atomic(tmp_path / "decision.json", Decision(1, 1, 7, 0).to_json().encode())
    second, after, status = _trained(tmp_path, stop_after=None)
    assert status == 0 and second.samples_done == 50 and second.epoch == 1
    assert [len(b) for b in after] == [7] * 5 + [3]  # 38 left
    assert sorted(flat + [i for batch in after for i in batch]) == list(range(50))


def worker_seed(samples: list[tuple[Any, ...]]) -> tuple[torch.Tensor, int]:
    return torch.stack([s[0] for s in samples]), torch.initial_seed()


def test_workers_are_seeded_from_the_position_and_leave_the_training_rng_alone() -> None:
    def seeds(rank: int, samples: int) -> list[int]:
        at = DataPosition(epoch=2, samples=samples, batch=2)
        args = {"num_workers": 2, "collate_fn": worker_seed}
        loader = ElasticDataLoader(Indexed(12), at, rank=rank, world=2, loader_args=args)
        return [seed for _, seed in loader]

    torch.manual_seed(3)
    state = torch.get_rng_state()
    first = seeds(0, 0)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn from the global RNG
    assert seeds(0, 0) == first and len(set(first)) == 2  # two workers, the same seeds again
    assert not set(seeds(1, 0)) & set(first)  # another rank's workers: other seeds
    assert not set(seeds(0, 4)) & set(first)  # resumed mid-epoch: other seeds


def mark_worker(worker_id: int) -> None:
    os.environ["TEST_WORKER_INIT"] = str(worker_id)


def with_pid_and_init(samples: list[tuple[Any, ...]]) -> tuple[torch.Tensor, int, str]:
    return torch.stack([s[0] for s in samples]), os.getpid(), os.environ["TEST_WORKER_INIT"]


def stop_signals_child() -> None:
    """In a session of its own, as torchrun starts a trainer: at the first batch TERM to its
    whole process group (torchrun's stop) and USR1 to each worker (Slurm's); two epochs with
    persistent workers; prints what it saw, then exits as a trainer does."""
    got: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    at = DataPosition(batch=2)
    args = {
        "num_workers": 2,
        "persistent_workers": True,
        "collate_fn": with_pid_and_init,
        "worker_init_fn": mark_worker,
    }
    loader = ElasticDataLoader(Indexed(40), at, loader_args=args)
    seen: list[int] = []
    pids: set[int] = set()
    inits: set[str] = set()
    for epoch in range(2):
        at.epoch, at.samples = epoch, 0
        for x, pid, init in loader:
            seen += x.tolist()
            inits.add(init)
            if not pids:
                os.killpg(0, signal.SIGTERM)
            if pid not in pids:
                pids.add(pid)
                os.kill(pid, signal.SIGUSR1)
                time.sleep(0.2)  # delivered before the next batch is asked for
    print(
        json.dumps({"seen": sorted(seen), "pids": len(pids), "inits": sorted(inits), "term": got})
    )


def test_workers_outlive_the_stop_signals_and_the_process_still_exits(tmp_path: Path) -> None:
    """torchrun's TERM to the trainer's process group and Slurm's USR1 to the workers: the
    epoch goes on to the step boundary where the trainer would checkpoint (no DataLoader
    error), the user's worker_init_fn ran, and the process exits without waiting forever for
    its persistent workers."""
    code = "from tests.unit.test_data_loader import stop_signals_child; stop_signals_child()"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["seen"] == sorted(list(range(40)) * 2) and out["pids"] == 2
    assert out["inits"] == ["0", "1"] and out["term"] == [signal.SIGTERM]
