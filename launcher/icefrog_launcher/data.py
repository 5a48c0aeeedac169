"""The elastic data loader: every replica takes its share of one global sequence of
samples, so the data position is a single number (samples consumed in the epoch) that
survives a restart with another process count or per-GPU batch.

The epoch's order is a permutation seeded by (seed, epoch), the same on every rank. A step
takes the next ``world x batch`` indices; rank r gets the r-th of ``world`` near-equal
slices. A remainder smaller than ``world`` is skipped.

The samples are read by a ``torch.utils.data.DataLoader`` whose batch sampler is
:class:`ElasticBatchSampler`: the user's DataLoader arguments (``num_workers``,
``pin_memory``, ``collate_fn``, ``persistent_workers``, ``prefetch_factor``,
``worker_init_fn``, ``generator``...) carry over; the batch size, order and each rank's share
are the sampler's. The DataLoader reads ahead, so the position counts only the batches the
training loop has taken: it moves when a batch is handed out, never when a worker fetches
one, and a checkpoint at a step boundary resumes at exactly the next sample.

The loader knows the trainer only through the shared
:class:`~icefrog_launcher.position.DataPosition` (which it reads and moves forward) and the
three callables it is given.
"""

from __future__ import annotations

import inspect
import os
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset, default_collate

from icefrog_launcher.position import DataPosition


class SizedDataset(Protocol):
    """What the loader needs of a dataset: a length and samples by index (a map-style
    ``torch.utils.data.Dataset`` with ``__len__``, e.g. ``TensorDataset``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


MANAGED = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
"""DataLoader arguments the elastic loader sets itself: the per-GPU batch is the
controller's decision, the order and each rank's share are the elastic sampler's."""

LOADER_ARGS = frozenset(inspect.signature(DataLoader.__init__).parameters) - {
    "self",
    "dataset",
    *MANAGED,
}
"""DataLoader arguments a user may pass (``loader_args``), as this torch names them."""


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}
"""torchrun's stop (TERM to the trainer's process group) and Slurm's (USR1)."""


def _start_workers(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)``, which forks its workers, with the stop signals blocked meanwhile:
    a worker forked just before a stop signal to the process group would otherwise die of
    it before its ``worker_init_fn`` leaves the group. The workers inherit the blocked
    signals and :class:`_WorkerInit` drops one that came early; this process receives its
    own once they are unblocked."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _WorkerInit:
    """A DataLoader worker's ``worker_init_fn``: keep the job's stop signals from killing
    the worker, then run the user's (picklable, as the spawn and forkserver contexts need).

    A worker killed by a signal makes the DataLoader raise in the training process before
    it reaches the step boundary where it checkpoints. torchrun stops a trainer by sending
    TERM to its process group, which holds its workers: the worker leaves that group (the
    DataLoader's own ``terminate()``, sent to the worker itself, still ends it; ignoring TERM
    would make the interpreter's exit wait for it forever). Slurm sends USR1 to every
    process of a multi-node step: the worker ignores it. The training process shuts its
    workers down itself, and a worker whose training process is gone exits on its own."""

    def __init__(self, then: Callable[[int], None] | None) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        os.setpgid(0, 0)
        # forked with the stop signals blocked (_start_workers): one sent to the training
        # process's group before this worker left it is pending here; ignoring a signal
        # discards it, then TERM gets back the action it had
        kept = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if kept is None else kept)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        if self.then is not None:
            self.then(worker_id)


def _mix(values: Sequence[int]) -> int:
    """One 63-bit seed from several integers."""
    seed = 0
    for value in values:
        seed = (seed * 1_000_003 + value) % (1 << 63)
    return seed


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(size)
    generator = torch.Generator().manual_seed(_mix([seed, epoch]))
    return torch.randperm(size, generator=generator)


def step_counts(left: int, step: int, world: int) -> list[int]:
    """Global samples of each step over ``left`` samples, ``step`` a step: full steps, then
    the remainder when every one of ``world`` ranks gets a sample of it."""
    full, rest = divmod(max(left, 0), step)
    return [step] * full + ([rest] if rest >= world else [])


def local_count(count: int, rank: int, world: int) -> int:
    """Rank ``rank``'s share of a step of ``count`` samples (``tensor_split``'s sizes)."""
    return count // world + (rank < count % world)


def check_loader_args(loader_args: Mapping[str, Any]) -> dict[str, Any]:
    """The user's DataLoader arguments, or TypeError/ValueError naming the wrong one."""
    args = dict(loader_args)
    for name in args:
        if name in MANAGED:
            raise ValueError(
                f"loader_args: {name!r} is the elastic loader's own (the per-GPU batch comes "
                "from the controller's decision, the order from the seed and epoch)"
            )
        if name not in LOADER_ARGS:
            raise TypeError(
                f"loader_args: {name!r} is not a torch.utils.data.DataLoader argument "
                f"(allowed: {', '.join(sorted(LOADER_ARGS))})"
            )
    if args.get("in_order", True) is not True:
        raise ValueError("loader_args: in_order=False would hand out batches out of step order")
    return args


class ElasticBatchSampler(Sampler[list[int]]):
    """This rank's indices of each remaining step of the epoch, from the data position as
    it stands when iteration starts (epoch, samples consumed, per-GPU batch). It reads the
    position again at every ``iter``, so a DataLoader with persistent workers follows a
    batch changed between epochs; within an iteration the batch stays fixed."""

    def __init__(
        self, size: int, position: DataPosition, *, rank: int, world: int, seed: int, shuffle: bool
    ) -> None:
        self.size, self.position = size, position
        self.rank, self.world, self.seed, self.shuffle = rank, world, seed, shuffle

    def counts(self) -> list[int]:
        """Global samples of each remaining step."""
        at = self.position
        return step_counts(self.size - at.samples, at.batch * self.world, self.world)

    def __iter__(self) -> Iterator[list[int]]:
        at = self.position  # read now: the DataLoader may ask for the first batch later
        order = epoch_order(self.size, self.seed, at.epoch, self.shuffle)
        return self._slices(order, at.samples, self.counts())

    def _slices(self, order: torch.Tensor, start: int, counts: list[int]) -> Iterator[list[int]]:
        for count in counts:
            yield order[start : start + count].tensor_split(self.world)[self.rank].tolist()
            start += count

    def __len__(self) -> int:
        return len(self.counts())


def _no_op() -> None:
    return None


def _no_count(global_count: int, local_count: int) -> None:
    return None


def _as_is(batch: Any) -> Any:
    return batch


class ElasticDataLoader:
    """Iterates the current epoch from ``position`` with its per-GPU batch as it is when
    iteration starts.

    ``before_step`` runs before each step (the trainer may checkpoint and exit there);
    ``on_step(global_count, local_count)`` after a step's batch is taken and the position
    moved past it; ``to_device`` moves the batch this rank yields. ``loader_args`` are
    ``torch.utils.data.DataLoader``'s own (``num_workers``, ``pin_memory``, ``collate_fn``,
    ``persistent_workers``...; not those in :data:`MANAGED`). A ``TensorDataset`` read
    without workers, pinning or a collate_fn is indexed in one go instead (faster: one
    gather a tensor instead of one ``__getitem__`` a sample and a stack).

    Without a ``generator`` of the user's, the DataLoader gets one seeded by (seed, epoch,
    position, rank) at each iteration: its workers' seeds then follow the data position,
    and reading data draws nothing from the training process's global RNG. A worker leaves
    the training process's process group and ignores USR1 before the user's
    ``worker_init_fn`` runs (:class:`_WorkerInit`: the job's stop signals must reach the
    training process, not kill its workers)."""

    def __init__(
        self,
        dataset: SizedDataset,
        position: DataPosition,
        *,
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        before_step: Callable[[], None] = _no_op,
        on_step: Callable[[int, int], None] = _no_count,
        to_device: Callable[[Any], Any] = _as_is,
        loader_args: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise TypeError(
                "the elastic loader needs a map-style dataset (__len__ and __getitem__): "
                f"{type(dataset).__name__} is iterable-only, so a restart could not resume it "
                "at a sample"
            )
        args = check_loader_args(loader_args or {})
        args["worker_init_fn"] = _WorkerInit(args.get("worker_init_fn"))
        self.dataset = dataset
        self.position = position
        self.rank, self.world, self.seed = rank, world, seed
        self.shuffle = shuffle
        self.size = len(dataset)
        self._before_step = before_step
        self._on_step = on_step
        self._to_device = to_device
        self.sampler = ElasticBatchSampler(
            self.size, position, rank=rank, world=world, seed=seed, shuffle=shuffle
        )
        self.dataloader: DataLoader[Any] = DataLoader(
            dataset,  # type: ignore[arg-type]  # any map-style dataset, as DataLoader takes
            batch_sampler=self.sampler,
            **args,
        )
        self._collate: Callable[[list[Any]], Any] = args.get("collate_fn") or default_collate
        self._own_generator = args.get("generator") is None
        self._direct = (
            isinstance(dataset, TensorDataset)
            and not args.get("num_workers")
            and not args.get("pin_memory")
            and args.get("collate_fn") is None
        )

    def __len__(self) -> int:
        """Steps left in the epoch from the position."""
        return len(self.sampler)

    def fetch(self, indices: torch.Tensor | Sequence[int]) -> Any:
        """One batch of these samples, read in this process and collated as the
        DataLoader's workers would."""
        if self._direct:
            assert isinstance(self.dataset, TensorDataset)
            index = torch.as_tensor(indices, dtype=torch.long)
            return tuple(tensor.index_select(0, index) for tensor in self.dataset.tensors)
        wanted = [int(i) for i in indices]
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(wanted) if getitems else [self.dataset[i] for i in wanted]
        return self._collate(samples)

    def _batches(self) -> Iterator[Any]:
        if self._direct:
            return (self.fetch(indices) for indices in self.sampler)
        if self._own_generator:  # workers' seeds from the position, not the training RNG
            at = self.position
            key = [self.seed, at.epoch, at.samples, self.rank]
            self.dataloader.generator = torch.Generator().manual_seed(_mix(key))
        return _start_workers(self.dataloader)

    def __iter__(self) -> Iterator[Any]:
        at = self.position
        batches: Iterator[Any] | None = None
        for count in self.sampler.counts():
            self._before_step()  # may checkpoint and exit (requeue) on a stop signal
            if batches is None:  # workers start once the first step is sure to run
                batches = self._batches()
            batch = next(batches)
            at.samples += count  # consumed: handed to the loop (not read ahead)
            self._on_step(count, local_count(count, self.rank, self.world))
            yield self._to_device(batch)
        self._before_step()
        at.samples = self.size  # a remainder smaller than world is skipped
