"""The last stop of the tracker leaves the interpreter's exit waiting for every tracker thread still inside JAX.

A daemon thread that comes back from C++ while the interpreter finalizes is ended by a forced unwind, which C++ code
that catches everything turns into an abort of the whole process: on a TPU v5e chip a process that stopped jaxmon
while a sampled trace was being stopped aborted at exit, 3 of 3 times (bench/results/tpu-step-cost-20261206). The
waiter was waited for; the sampler, inside the profiler's stop, was not."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from jaxmon import finalization, training
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.handed import SamplerConfig
from tests.helpers import wait_until
from tests.unit.training.conftest import MakeTracker


class SlowStop:
    """A profiler whose stop() stays inside until `go` is set (JAX's stop of a large trace on a TPU takes a while)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Event()
        self.stopping = threading.Event()

    def start(self, python: bool) -> None:
        self.started.set()

    def stop(self) -> bytes:
        self.stopping.set()
        self.go.wait(30)
        return b""

    def export(self, directory: Path) -> None:
        pass

    def devices(self) -> Mapping[tuple[str, int], tuple[str, int]]:
        return {}


class Ops(JaxTraining):
    def __init__(self, source: object, profiler: SlowStop) -> None:
        super().__init__(source)  # type: ignore[arg-type]
        self._slow = profiler

    def profiler(self) -> SlowStop:  # type: ignore[override]
        return self._slow


def test_the_exit_waits_for_a_sampler_still_stopping_the_profiler(
    make_tracker: MakeTracker, source: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiler = SlowStop()
    tracker = make_tracker(ops=Ops(source, profiler), profile=SamplerConfig(10, 2))
    monkeypatch.setattr(training, "_users", 1)
    (sampler_thread,) = tracker.sampler.threads
    tracker.sampler.handed(8)  # block 10's trace starts two steps ahead
    assert profiler.started.wait(10)
    before = set(finalization._callbacks)
    monkeypatch.setattr(training, "RELEASE_WAIT", 0.2)
    training.release(tracker)  # stop(): the sample ends early, inside the profiler's stop
    assert profiler.stopping.is_set() and sampler_thread.is_alive()
    added = set(finalization._callbacks) - before
    assert len(added) == 1, "no exit wait for the sampler still inside the profiler"
    callback = finalization._callbacks.pop(added.pop())
    profiler.go.set()
    callback()  # what the interpreter's exit runs: it returns once the sampler left
    wait_until(lambda: not sampler_thread.is_alive(), what="the sampler thread ended")
    assert tracker.sampler.reading() is not None
