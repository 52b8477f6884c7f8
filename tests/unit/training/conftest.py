"""The training tests' tracker of this process: JAX's 8 CPU devices (one LocalSource for a file), and trackers made
the current one, as jaxmon.start() or publish() would, stopped after the test."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from jaxmon import training
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.tracker import Tracker, TrackerConfig
from jaxmon.training_readings import TrainingReading
from tests.helpers import wait_until

# The peak FLOP/s per device the trackers are given: CPU devices have none in the table.
PEAK = 1e12

MakeTracker = Callable[..., Tracker]


@pytest.fixture(scope="module")
def source() -> LocalSource:
    return LocalSource(sidecar_defaults=False)


@pytest.fixture(scope="session")
def shared_ops() -> JaxTraining:
    """The JAX side of the trackers made without one of their own: a JaxTraining compiles its barrier as the tracker
    starts, a program for each of the 8 devices (a quarter of a second, most of a short test's time), so one for the
    session. A test of what a tracker's start compiles or keeps (its barrier) gives it a JaxTraining of its own."""
    return JaxTraining(LocalSource(sidecar_defaults=False))


@contextmanager
def trackers(default: JaxTraining, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeTracker]:
    """Make trackers of this process (options as TrackerConfig's keywords, peak_flops PEAK unless given; `ops` the
    JAX side, `default` unless given; `clock` and `wall` its clocks, the real ones unless given), each made the
    current one through `monkeypatch`; all stopped at the end."""
    made: list[Tracker] = []

    def make(
        ops: JaxTraining | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        **config: Any,
    ) -> Tracker:
        config = {"peak_flops": PEAK, **config}
        tracker = Tracker(ops or default, TrackerConfig(**config), clock=clock, wall=wall)
        monkeypatch.setattr(training, "_tracker", tracker)
        made.append(tracker)
        return tracker

    try:
        yield make
    finally:
        for tracker in made:
            tracker.stop(10)


@pytest.fixture
def make_tracker(shared_ops: JaxTraining, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeTracker]:
    """trackers() of `shared_ops` for a test, stopped after it."""
    with trackers(shared_ops, monkeypatch) as make:
        yield make


def booked(tracker: Tracker, steps: int) -> TrainingReading:
    """The reading once the waiter has booked `steps` steps."""
    wait_until(lambda: (r := tracker.reading()) is not None and r.steps_total >= steps, what=f"{steps} steps booked")
    reading = tracker.reading()
    assert reading is not None
    return reading


def python_calls(call: Callable[[], Any]) -> int:
    """How many Python functions `call()` calls (sys.setprofile's count: C loops over arrays are one call), with the
    cyclic GC off (a collection's callbacks are no call of `call`'s)."""
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    gc.disable()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls
