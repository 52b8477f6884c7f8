"""The training tests' tracker of this process: JAX's 8 CPU devices (one LocalSource for a file), and trackers made
the current one, as jaxmon.start() or publish() would, stopped after the test."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
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
    assert jax.device_count() == 8, "the training tests run on JAX's 8 CPU devices (JAX_NUM_CPU_DEVICES=8)"
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


def settled(tracker: Tracker, steps: int) -> TrainingReading:
    """The reading once the waiter has seen `steps` steps; whatever the loop, its time adds up (every test's loop
    ends on a step seen complete)."""
    wait_until(lambda: (r := tracker.reading()) is not None and r.steps_total >= steps, what=f"{steps} steps seen")
    reading = tracker.reading()
    assert reading is not None
    adds_up(reading, tracker)
    with tracker._lock:  # on the accounting's own (monotonic) clock: to the microsecond
        acct = tracker._ledger
        assert acct.last_done is not None and acct.total() == pytest.approx(acct.last_done - acct.started, abs=1e-6)
    return reading


def slow_step(size: int = 384, repeat: int = 20) -> Callable[[jax.Array], jax.Array]:
    """A jitted step of tens of milliseconds on a CPU device (the device must be slower than the host)."""
    return jax.jit(lambda x: jax.lax.fori_loop(0, repeat, lambda _, c: jnp.tanh(c @ c) / size, x))


def adds_up(reading: TrainingReading, tracker: Tracker) -> None:
    """Productive time and every kind of badput are the time from the start to the last completion: on the
    monotonic clock exactly; the exported Unix timestamps are the wall clock's at each event, which runs at the
    monotonic clock's rate within parts per million where NTP slews it (4 ppm measured on the CI machine), but may
    step (tests/unit/training/test_tracker_bookkeeping.py steps it; this development VM's stepped 0.5 ms every
    100 ms for minutes at a time): so compared at the wall clock's own rate since the tracker started."""
    assert reading.last_step_timestamp is not None
    total = reading.productive_seconds_total + sum(reading.badput_seconds_total.values())
    wall, mono = time.time(), time.monotonic()
    rate = (wall - reading.start_time_seconds) / (mono - tracker._ledger.started)
    assert total * rate == pytest.approx(reading.last_step_timestamp - reading.start_time_seconds, rel=1e-3, abs=1e-3)
    assert abs(reading.start_time_seconds - time.time()) < 600  # a Unix time


def run_delay(*threads: int | None) -> float:
    """The seconds the threads with these native ids spent runnable but not running (the kernel's schedstat: the time
    a loaded machine kept each waiting for a CPU), summed; the lag a thread's view of an event can have beyond its
    own wake."""
    total = 0
    for tid in threads:
        with open(f"/proc/self/task/{tid}/schedstat") as stat:
            total += int(stat.read().split()[1])
    return total / 1e9
