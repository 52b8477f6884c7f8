"""The tracker's bookkeeping on clocks the test holds (issue 33): badput intervals kept whatever their number,
timestamps from the wall clock at each event, a bounded cache of tracked programs, the peak warning when MFU is
first wanted, and a reading whose work does not grow with the window. Real JAX CPU devices; only the clocks are the
test's."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from structlog.testing import capture_logs

import jaxmon
from jaxmon import training
from jaxmon.training.ledger import INTERVALS_AFTER_DROP, MAX_INTERVALS
from tests.unit.training.conftest import PEAK, MakeTracker, booked, python_calls

NO_PEAK_LOG = "no peak FLOP/s known for this device kind: no MFU or HFU series (set collector.training.peak_flops)"


class Clock:
    """A clock that moves only when the test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ready() -> jax.Array:
    return jnp.ones(4).block_until_ready()


def test_an_open_eval_holding_ten_thousand_data_blocks_is_charged_whole(make_tracker: MakeTracker) -> None:
    """Issue 33's case: a 98 s badput("eval") holding 10 000 badput("data") blocks. The intervals were a deque of
    10 000: the open eval fell out first, and its 98 s read as host badput, with no problem counted."""
    clock = Clock(0.0)
    tracker = make_tracker(clock=clock, wall=Clock(1e9))
    clock.now = 1.0
    jaxmon.step(0, ready())
    booked(tracker, 1)
    clock.now = 2.0
    with jaxmon.badput("eval"):
        for _ in range(10_000):
            with jaxmon.badput("data"):
                clock.now += 0.001
            clock.now += 0.0088
    assert clock.now == pytest.approx(100.0)
    clock.now = 101.0
    jaxmon.step(1, ready())
    reading = booked(tracker, 2)
    badput = reading.badput_seconds_total
    assert badput["eval"] == pytest.approx(98.0)
    assert badput["host"] == pytest.approx(2.0)  # 1 -> 2 and 100 -> 101
    assert badput.get("data", 0.0) == 0.0  # each instant of a data block was the eval's, which started first
    # Nothing was lost: the data blocks inside the open eval change no figure, so dropping them is no problem.
    assert "intervals" not in reading.problems
    assert reading.productive_seconds_total + sum(badput.values()) == pytest.approx(101.0)


def test_intervals_past_the_bound_are_dropped_oldest_first_counted_and_the_kept_ones_charged(
    make_tracker: MakeTracker,
) -> None:
    """A loop of badput blocks and no step: past MAX_INTERVALS the oldest closed ones go, each counted, and their
    time reads as host badput (the open block among them stays)."""
    clock = Clock(0.0)
    tracker = make_tracker(clock=clock, wall=Clock(1e9))
    jaxmon.step(0, ready())
    booked(tracker, 1)
    blocks = MAX_INTERVALS + 1
    for _ in range(blocks):
        with jaxmon.badput("data"):
            clock.now += 0.001
        clock.now += 0.001
    jaxmon.step(1, ready())
    reading = booked(tracker, 2)
    dropped = reading.problems["intervals"]
    assert dropped == blocks - INTERVALS_AFTER_DROP
    badput = reading.badput_seconds_total
    assert badput["data"] == pytest.approx(INTERVALS_AFTER_DROP * 0.001)  # the newest ones, kept
    assert badput["host"] == pytest.approx(clock.now - INTERVALS_AFTER_DROP * 0.001)


def test_timestamps_are_the_wall_clock_at_each_event_and_durations_the_monotonic_clock(
    make_tracker: MakeTracker,
) -> None:
    """A wall clock that steps (chrony's makestep at boot, a VM resumed): the start and each completion are the
    wall clock's at that moment; step durations and the accounting never see the step. A wall-clock offset taken
    once at the start stayed an hour behind, and JaxmonTrainingStalled read it."""
    clock, wall = Clock(50.0), Clock(1_700_000_000.0)
    tracker = make_tracker(clock=clock, wall=wall)
    clock.now, wall.now = 51.0, 1_700_000_001.0
    jaxmon.step(0, ready())
    reading = booked(tracker, 1)
    assert reading.start_time_seconds == 1_700_000_000.0
    assert reading.last_step_timestamp == 1_700_000_001.0
    # The wall clock steps an hour forward; a second later the next step completes.
    wall.now += 3600.0
    clock.now, wall.now = 52.0, wall.now + 1.0
    jaxmon.step(1, ready())
    reading = booked(tracker, 2)
    assert reading.last_step_timestamp == 1_700_003_602.0
    assert reading.duration_sum == 1.0 and reading.duration_count == 1
    assert reading.productive_seconds_total + sum(reading.badput_seconds_total.values()) == pytest.approx(2.0)
    assert reading.start_time_seconds == 1_700_000_000.0  # the start stays what the wall clock said then
    # And back by two hours (a VM resumed from a snapshot): the timestamp follows the clock, the duration does not.
    wall.now -= 7200.0
    clock.now, wall.now = 53.0, wall.now + 1.0
    jaxmon.step(2, ready())
    reading = booked(tracker, 3)
    assert reading.last_step_timestamp == 1_699_996_403.0
    assert reading.duration_sum == 2.0 and reading.duration_count == 2


def test_a_steps_timestamp_is_its_completion_not_when_the_waiter_booked_it(make_tracker: MakeTracker) -> None:
    """Read beside the monotonic clock, the wall clock's time of the event is the one the completion had, even
    when the booking comes later: the start and the last completion differ by the accounting's seconds exactly."""
    real = Clock(0.0)
    tracker = make_tracker(clock=real, wall=lambda: 1e9 + real.now)
    real.now = 3.0
    jaxmon.step(0, ready())
    reading = booked(tracker, 1)
    assert reading.last_step_timestamp is not None
    total = reading.productive_seconds_total + sum(reading.badput_seconds_total.values())
    assert reading.last_step_timestamp - reading.start_time_seconds == total == 3.0


def test_the_peak_warning_comes_once_when_mfu_is_first_wanted_not_at_start(make_tracker: MakeTracker) -> None:
    """CPU devices have no peak: the warning said so at every start(), even in a process that never steps."""
    clock = Clock(0.0)
    with capture_logs() as logs:
        tracker = make_tracker(clock=clock, wall=Clock(1e9), peak_flops=None)
        for n in range(3):  # steps without FLOPs want no MFU
            jaxmon.step(n, ready())
        booked(tracker, 3)
        assert [e for e in logs if e["event"] == NO_PEAK_LOG] == []
        for n in range(3, 6):
            jaxmon.step(n, ready(), model_flops=8e9)
        reading = booked(tracker, 6)
    warned = [e for e in logs if e["event"] == NO_PEAK_LOG]
    assert len(warned) == 1 and warned[0]["device_kind"] == jax.devices()[0].device_kind, warned
    assert all(d.mfu is None and d.peak_flops is None for d in reading.devices)


def test_the_peak_warning_comes_with_the_first_tracked_program_with_a_cost(make_tracker: MakeTracker) -> None:
    clock = Clock(0.0)
    f = jaxmon.track(jax.jit(lambda x: jnp.tanh(x @ x)))
    with capture_logs() as logs:
        tracker = make_tracker(clock=clock, wall=Clock(1e9), peak_flops=None)
        assert [e for e in logs if e["event"] == NO_PEAK_LOG] == []
        x = jnp.ones((8, 8))
        for n in range(3):
            x = f(x)
            jaxmon.step(n, x)
        booked(tracker, 3)
    assert len([e for e in logs if e["event"] == NO_PEAK_LOG]) == 1


def test_a_tracked_function_keeps_a_bounded_number_of_programs_and_measures_a_forgotten_one_again(
    make_tracker: MakeTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dynamic shapes: every new signature is a program. Past MAX_PROGRAMS the least recently called is forgotten
    and counted; called again, its cost is read again and its step gets its own FLOPs."""
    monkeypatch.setattr(training, "MAX_PROGRAMS", 3)
    clock = Clock(0.0)
    tracker = make_tracker(clock=clock, wall=Clock(1e9))
    fn = jax.jit(lambda x: jnp.tanh(x @ x.T))
    f = jaxmon.track(fn)
    sizes = [8, 16, 24, 32, 40, 8]  # five programs, then the first again (forgotten by then)
    truth = {n: _flops(fn.lower(jnp.ones((n, 4))).compile().cost_analysis()) for n in set(sizes)}
    assert len(set(truth.values())) == len(truth)  # each shape's program has FLOPs of its own
    device = jax.devices()[0]
    flops: list[float] = []
    for number, size in enumerate(sizes):
        x = f(jnp.ones((size, 4)))
        jaxmon.step(number, x)
        reading = booked(tracker, number + 1)
        total = next(d.hardware_flops_total for d in reading.devices if d.id == device.id)
        assert total is not None
        flops.append(total)
        assert len(f._programs) <= 3
    per_step = [b - a for a, b in zip([0.0, *flops], flops, strict=False)]
    assert per_step == [pytest.approx(truth[s]) for s in sizes]
    assert reading.problems["programs"] == 3  # 8's at 32, 16's at 40, 24's at 8 again
    assert list(f._programs.values())[-1].cost is not None


def _flops(analysis: Any) -> float:
    return float(analysis["flops"])


def test_a_reading_reads_no_step_of_the_window_whatever_its_length(make_tracker: MakeTracker) -> None:
    """reading() holds the lock the waiter books with: at window=100000 with 8 devices it rescanned the window for
    every device (0.146 s a poll, the waiter blocked meanwhile). The window is arrays: the same Python calls read it
    at 10 steps and at 1000."""
    calls = {}
    keys = [(d.platform, d.id) for d in jax.devices()]
    for window in (10, 1000):
        clock = Clock(0.0)
        tracker = make_tracker(clock=clock, wall=Clock(1e9), window=window)
        jaxmon.step(0, ready())
        booked(tracker, 1)
        ledger = tracker._ledger
        with tracker._lock:  # the waiter's bookkeeping of `window` more steps, as it does it at each completion
            for n in range(window):
                ledger.run(n, [n + 1.0], [n], [], dict.fromkeys(keys, 1e9), {})
        calls[window] = python_calls(tracker.reading)
        reading = tracker.reading()
        assert reading is not None
        assert {(d.platform, d.id): d.mfu for d in reading.devices} == dict.fromkeys(keys, pytest.approx(1e9 / PEAK))
    assert calls[1000] == calls[10], calls  # a Python read of each step would be 990 calls more at least


def test_a_restart_clears_the_predicted_peak_memory_window(make_tracker: MakeTracker) -> None:
    """Before issue 38 only the MFU window started again at a restore: the peak of the steps before it stayed."""
    from jaxmon.training.communication import Communication
    from jaxmon.training.handed import Program

    tracker = make_tracker()
    key = tracker.ops.devices()[0].key
    program = Program(fn=None, communication=Communication({}, 1234, (key,)))
    for n in range(3):
        tracker.called(program)
        jaxmon.step(n, ready())
    reading = booked(tracker, 3)
    assert {(d.platform, d.id): d.program_peak_memory_bytes for d in reading.devices}[key] == 1234
    jaxmon.step(1, ready())  # back to step 1: a restore, no tracked call since
    reading = booked(tracker, 4)
    assert reading.problems.get("back") == 1
    assert all(d.program_peak_memory_bytes is None for d in reading.devices)
