"""The daemon decides a round with Python's cyclic garbage collector paused (the first
round's growth would set off full collections in the middle of it), and gives the collector
back as it found it."""

from __future__ import annotations

import gc

import pytest

from icefrog_slurm.controller.daemon import collector_paused
from icefrog_slurm.domain.plan import PolicyResult
from icefrog_slurm.domain.snapshot import Snapshot
from icefrog_slurm.policies.standin import StandInPolicy
from icefrog_slurm.settings import Settings
from icefrog_slurm.sim.engine import Engine, SimOptions
from icefrog_slurm.sim.workload import TraceJob


class _Watching(StandInPolicy):
    """The stand-in, noting whether the collector was on at each decision."""

    def __init__(self) -> None:
        self.collector: list[bool] = []

    def decide(self, snapshot: Snapshot, *, settings: Settings) -> PolicyResult:
        self.collector.append(gc.isenabled())
        return super().decide(snapshot, settings=settings)


def test_the_controller_decides_with_the_collector_paused() -> None:
    policy = _Watching()
    jobs = [TraceJob("j0", 0.0, "resnet18-cifar10", 1, 128)]
    engine = Engine(jobs, policy, settings=Settings(), options=SimOptions(gpus=4))
    assert gc.isenabled()
    engine.run()
    assert policy.collector and not any(policy.collector)
    assert gc.isenabled()


def test_the_collector_is_given_back_as_it_was() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a failed tick")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off: left off
    finally:
        gc.enable()
