"""The protocol between the training thread and the waiter (jaxmon/training/hand.py), under a GIL that switches
threads every microsecond, so that the waiter's looks, holds and pops interleave with step(), pause() and a tracked
call at every point: every step handed is booked once, under its own number with its own figures, whatever came
between, and every hold handed is waited on; nothing is counted that was not so, and no step is left behind."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmon
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.hand import PAUSED, Found, Given, Hold
from jaxmon.training.handed import TrackerConfig
from jaxmon.training.ledger import Run
from jaxmon.training.waiter import Waiter
from tests.helpers import wait_until
from tests.unit.training.conftest import MakeTracker, booked


class Recording(JaxTraining):
    """The tracker's JAX side, noting every handle step() holds and every handle the waiter waited on."""

    def __init__(self, source: LocalSource) -> None:
        super().__init__(source)
        self.held: dict[int, Any] = {}
        self.waited: set[int] = set()

    def hold(self, array: Any) -> Any | None:
        handle = super().hold(array)
        if handle is not None:
            self.held[id(handle)] = handle  # kept: an id is never another handle's meanwhile
        return handle

    def wait(self, handles: list[Any]) -> None:
        super().wait(handles)
        self.waited.update(map(id, handles))


@pytest.fixture
def switching() -> Iterator[None]:
    """The GIL handed between threads every microsecond (5 ms by default)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_step_is_booked_once_with_its_own_figures_however_the_threads_interleave(
    make_tracker: MakeTracker, source: LocalSource, switching: None, seed: int
) -> None:
    rng = random.Random(seed)
    ops = Recording(source)
    tracker = make_tracker(ops=ops)
    f = jaxmon.track(jax.jit(lambda x: x * 1.0001))
    x = jnp.ones(64)
    f(x).block_until_ready()
    jnp.int32(0), jnp.float32(1.0)  # JAX's own first calls, before the loop
    examples = tokens = 0.0
    steps = 2000
    n = 0
    for _ in range(steps):
        x = f(x)
        kind = rng.randrange(6)
        number: Any = n
        given: dict[str, Any] = {"examples": 4, "tokens": 512}
        if kind == 1:
            number = np.int64(n)  # a NumPy number: follows on
        elif kind == 2:
            number = jnp.int32(n)  # a device number: a Given and a hold of its own
        elif kind == 3:
            given = {"examples": 4, "tokens": jnp.float32(256.0)}  # a device figure
        elif kind == 4:
            given = {"examples": np.int64(8), "tokens": 512}  # other figures
        jaxmon.step(number, x, **given)
        examples += float(given["examples"])
        tokens += float(given["tokens"])
        n += 1
        if rng.random() < 0.02:
            with jaxmon.badput("eval"):  # pause(): a mark the waiter is hurried to
                pass
        if rng.random() < 0.01:
            n += 5  # a jump: counted, never a lost step
    reading = booked(tracker, steps)
    # The waiter counts a look's steps booked once the tracker has them: a moment after the reading shows them.
    wait_until(lambda: tracker.pending() == 0, timeout=5, what="the waiter's count of booked steps")
    assert reading.steps_total == steps
    assert reading.examples_total == examples and reading.tokens_total == tokens
    assert reading.step == n - 1 and reading.dispatched_step == n - 1
    assert set(reading.problems) <= {"jump"}, reading.problems
    assert ops.held
    # Every hold handed is waited on: one pause() handed after its step was booked (a still loop's) at the next look.
    wait_until(lambda: set(ops.held) <= ops.waited, timeout=5, what="a wait on every hold handed")
    devices = {(d.platform, d.id): d.hardware_flops_total for d in reading.devices}
    assert devices[(jax.devices()[0].platform, jax.devices()[0].id)] is not None  # each call's FLOPs booked


class Slow(Recording):
    """Recording, whose holds take `slow` seconds (the GIL let go meanwhile) once `slow` is set."""

    slow = 0.0

    def hold(self, array: Any) -> Any | None:
        time.sleep(self.slow)
        return super().hold(array)


def test_a_hold_pause_hands_after_the_waiter_booked_its_step_is_still_waited_on(
    make_tracker: MakeTracker, source: LocalSource
) -> None:
    """A badput() block opens after a burst of steps, and its hold takes longer than the waiter waits for a still
    loop: the waiter books the steps unheld meanwhile, and the hold comes alone, after them. It is still waited on
    (a look of a lone hold once took it as a look's hold of no step, and dropped it)."""
    ops = Slow(source)
    tracker = make_tracker(ops=ops)
    f = jaxmon.track(jax.jit(lambda x: x * 1.0001))
    x = jnp.ones(64)
    for n in range(300):
        x = f(x)
        jaxmon.step(n, x)
    ops.slow = 3 * tracker.waiter.still  # past the waiter's wait for a step, which then books the burst unheld
    with jaxmon.badput("eval"):
        pass
    ops.slow = 0.0
    assert booked(tracker, 300).steps_total == 300
    wait_until(lambda: set(ops.held) <= ops.waited, timeout=5, what="a wait on the block's hold")
    wait_until(lambda: not tracker.hand._handed, timeout=5, what="nothing left handed (the block's Done too)")


class Gated(Recording):
    """Recording, whose waits block until `gate` is set once `gated` is."""

    def __init__(self, source: LocalSource) -> None:
        super().__init__(source)
        self.gated = False
        self.gate = threading.Event()

    def wait(self, handles: list[Any]) -> None:
        if self.gated:
            self.gate.wait(30)
        super().wait(handles)


def test_a_waiter_running_late_is_handed_two_holds_at_most(make_tracker: MakeTracker, source: LocalSource) -> None:
    """The waiter stuck on a step (a loaded machine's waiter, or its wait): the loop steps on, one step a look's time
    apart, each due a hold; it is handed one more hold than it took at most, not one a step, each keeping its step's
    arrays. Once it wakes, every step is booked and every hold handed waited on."""
    ops = Gated(source)
    tracker = make_tracker(ops=ops)
    f = jax.jit(lambda x: x * 1.0001)
    x = jnp.ones(1024)
    f(x).block_until_ready()
    ops.gated = True
    jaxmon.step(0, f(x))
    wait_until(lambda: tracker.waiter.taken == 1, timeout=5, what="the waiter waiting on step 0's hold")
    for n in range(1, 9):
        time.sleep(tracker.waiter.every * 1.5)  # each step due a hold
        x = f(x)
        jaxmon.step(n, x)
    held = sum(type(item) is Hold for item in list(tracker.hand._handed))
    assert held <= 2, held  # (one a step before: 8)
    ops.gate.set()
    assert booked(tracker, 9).steps_total == 9
    wait_until(lambda: set(ops.held) <= ops.waited, timeout=5, what="a wait on every hold handed")


class Paced:
    """The waiter's JAX side, scripted: the hold it waits for still runs when it looks; while it waits, the training
    thread hands `during` (as step() would) and the wait returns at `seen` on the waiter's clock."""

    def __init__(self, handed: deque[Any], clock: list[float]) -> None:
        self.handed, self.clock = handed, clock
        self.during: list[Any] = []
        self.seen = 0.0

    def ready(self, handles: list[Any]) -> bool:
        return False

    def is_array(self, value: Any) -> bool:
        return False

    def wait(self, handles: list[Any]) -> None:
        self.handed.extend(self.during)
        self.clock[0] = self.seen


def scripted(handed: deque[Any], ops: Any, clock: list[float]) -> tuple[Waiter, list[float]]:
    """A waiter of `handed` on the scripted `ops` and `clock` (no thread, a typical step of 20 ms), and the dates it
    books, each run's in turn (the last of them its last completion)."""
    hand = SimpleNamespace(waiting=None, let_go=lambda: None)
    dates: list[float] = []

    def book(runs: list[Run], loss: Any, of: Any) -> None:
        for run in runs:
            assert run.done is not None
            dates.extend(run.done)

    waiter = Waiter(hand, handed, ops, lambda: clock[0], book, lambda *a, **k: None,  # type: ignore[arg-type]
                    lambda: 0.020, lambda: dates[-1] if dates else 0.0, TrackerConfig().stall_factor)  # fmt: skip
    return waiter, dates


def test_a_found_hold_dates_its_own_step_by_the_call_that_found_it_and_not_the_steps_handed_since() -> None:
    """A loop two steps ahead: step 2's hold is waited for; while the waiter (woken 100 ms late) waits, the loop
    hands step 3 (the hold still runs), then step 4, whose step() finds step 2's hold complete and hands a Found
    before it. Step 2 completed by the Found's time, not the late wake; step 3, handed before the Found but after
    the hold, is no Found's: the next look dates it after step 2, by its own hold. A Found of another hold (a
    step() that read `waiting` before the look changed it) says nothing of this one."""
    handed: deque[Any] = deque()
    clock = [0.0]
    ops = Paced(handed, clock)
    waiter, dates = scripted(handed, ops, clock)
    hold2, hold4, other = Hold([object()]), Hold([object()]), Hold([object()])
    handed.extend([Given(0, None, None, None, ()), 0.000, 0.010, 0.020, hold2])  # steps 0-2, step 2 held
    clock[0] = 0.021
    ops.during = [0.030, Found(0.071, other), Found(0.072, hold2), 0.072]  # steps 3 and 4, step 4's call found it
    ops.seen = 0.172  # the waiter's late wake
    waiter._take(len(handed))
    assert dates[2] == pytest.approx(0.072)  # by the Found, not the wake at 0.172
    handed.append(hold4)
    ops.during, ops.seen = [], 0.095
    waiter._take(len(handed))
    assert len(dates) == 5 and dates[4] == pytest.approx(0.095)
    assert 0.072 < dates[3] < dates[4], dates  # step 3 after step 2's completion: no mark at the Found


def test_a_found_of_a_hold_handed_after_the_newest_dates_the_newest_too() -> None:
    """The waiter takes steps 0-2 (step 2 held) late: the loop has handed step 3 with a hold of its own (one due per
    `every` while the waiter was busy), and step 4's call found step 3's complete. Step 2 completed by then too (the
    device runs them in order), not by the late look: the case of a loaded machine, whose waiter booked a loop's
    steps 56 ms late (restart badput 15 ms of 100) when only the hold it waited for was looked at. A Found of a hold
    handed before this look's newest says nothing of it."""
    handed: deque[Any] = deque()
    clock = [0.0]
    ops = Paced(handed, clock)
    waiter, dates = scripted(handed, ops, clock)
    hold1, hold2, hold3 = Hold([object()]), Hold([object()]), Hold([object()])
    handed.extend([Given(0, None, None, None, ()), 0.000, 0.010, hold1, 0.020, hold2])  # steps 0-2, 1 and 2 held
    clock[0] = 0.021
    ops.during = [Found(0.030, hold1), 0.030, hold3, Found(0.041, hold3), 0.041]  # steps 3 (held) and 4
    ops.seen = 0.172  # the waiter's late wake
    waiter._take(len(handed))
    assert dates[2] == pytest.approx(0.041)  # by step 3's Found, not the wake at 0.172 (nor step 1's Found)


def test_a_waiting_loop_s_steps_before_an_unnamed_pause_are_not_queued_into_it() -> None:
    """A loop that waits for each step (8 ms apart) pauses 60 ms unnamed (the step() after it hands a PAUSED), then
    steps on, its newest held and seen. The typical step (20 ms: a busier minute's, within the stall threshold's 3
    spacings: the device could have kept up) and the service fitted to the pause's end (the next hand-off, 90 ms)
    both exceed its rhythm: queued, steps 0-3 would complete at 20, 40, 60 and 80 ms, the pause read as its device's.
    The host was seen no step ahead of its device (the look's lead is 0): each step was done by the next call, the
    last a typical step after (the queue's). A burst (steps 0.1 ms apart, Keras's epoch) is no host its device kept
    up with: queued as before."""
    for spacing, expected in ((0.008, [0.008, 0.016, 0.024, 0.044]), (0.0001, [0.020, 0.040, 0.060, 0.080])):
        handed: deque[Any] = deque()
        clock = [0.0]
        ops = Paced(handed, clock)
        waiter, dates = scripted(handed, ops, clock)
        steps = [spacing * k for k in range(4)]
        handed.extend([Given(0, None, None, None, ()), *steps, PAUSED, 0.090, 0.098, 0.106, Hold([object()])])
        clock[0] = 0.107
        ops.seen = 0.110
        waiter._take(len(handed))
        assert dates[:4] == pytest.approx(expected), (spacing, dates)
        assert dates[-1] == pytest.approx(0.110), dates


class PacedThenStill(Paced):
    """Paced, and a barrier on every device that is complete at once (the device was done with the steps)."""

    def barrier(self) -> list[Any]:
        return [BARRIER]

    def ready(self, handles: list[Any]) -> bool:
        return handles == [BARRIER]


BARRIER = object()


def test_a_waiting_loop_s_steps_after_its_last_hold_are_not_queued_into_the_stillness_after_them() -> None:
    """A loop that waits for each step (8 ms apart: step k completes at 8 (k + 1) ms) is seen no step ahead of its
    device at a look (step 2 held, seen at 24 ms), hands steps 3-6 unheld and goes still (the loop ended, or runs
    Python for a while, unnamed). Found still at 0.5 s, the barrier done at once, the typical step 20 ms (a busier
    minute's, within the stall threshold's 3 spacings): queued at it, steps 3-6 would complete at 44, 64, 84 and
    104 ms, the stillness read as its device's (a batched-durations trial here: the last four steps of 1.3 ms read
    3.7 ms each). Each was done by the next call (the look's lead, 0): at 32, 40 and 48 ms, the last a typical step
    after (no call bounds it)."""
    handed: deque[Any] = deque()
    clock = [0.017]
    ops = PacedThenStill(handed, clock)
    waiter, dates = scripted(handed, ops, clock)
    handed.extend([Given(0, None, None, None, ()), 0.000, 0.008, 0.016, Hold([object()])])
    ops.seen = 0.024
    waiter._take(len(handed))
    assert dates[-1] == pytest.approx(0.024)
    handed.extend([0.024, 0.032, 0.040, 0.048])
    clock[0] = 0.5
    waiter._book_unheld(len(handed), paused=True)
    assert dates[3:] == pytest.approx([0.032, 0.040, 0.048, 0.068]), dates


class Draining:
    """The waiter's JAX side for a still loop: a barrier's wait returns when the device finished the work handed
    before it, at `done` on the waiter's clock."""

    def __init__(self, clock: list[float], done: float, idle: bool = False) -> None:
        self.clock, self.done, self.idle = clock, done, idle
        self.barriers = 0

    def barrier(self) -> list[Any]:
        self.barriers += 1
        return [object()]

    def ready(self, handles: list[Any]) -> bool:
        return self.idle

    def is_array(self, value: Any) -> bool:
        return False

    def wait(self, handles: list[Any]) -> None:
        self.clock[0] = self.done


def test_a_still_loop_whose_device_is_slower_than_the_pace_is_dated_by_a_barrier_on_its_devices() -> None:
    """A loop that handed three steps ahead of its device and stopped calling (no pause()): by the stall threshold's
    pace (3 typical steps of 20 ms) they would be done by 0.18 s, but a loaded machine's device runs them at 0.3 s
    each. A barrier on every device, dispatched once the pace has passed, is seen complete at 0.9 s: the steps are
    dated up to it, not at the pace (Keras's fit read 0.50 s of 0.82 in the suite where they were)."""
    handed: deque[Any] = deque()
    clock = [0.5]  # the pace has passed
    ops = Draining(clock, done=0.9)
    waiter, dates = scripted(handed, ops, clock)
    handed.extend([Given(0, None, None, None, ()), 0.001, 0.002, 0.003])
    waiter._book_unheld(len(handed), paused=True)
    assert ops.barriers == 1
    assert dates == pytest.approx([0.3, 0.6, 0.9], abs=1e-3)  # (the queue from the first hand-off, 1 ms in)


def test_a_barrier_done_at_once_says_the_still_loops_device_was_idle_however_late_its_wait_returns() -> None:
    """The same still loop, whose device was done with its steps: the barrier is complete at the first look at it
    (within LOOK of its dispatch). A loaded machine wakes the waiter 0.4 s after that; the steps stay at the typical
    pace after their hand-offs, not spread up to the late wake (a 60 ms pause of the loop's read as steps of 20 ms)."""
    handed: deque[Any] = deque()
    clock = [0.5]
    ops = Draining(clock, done=0.9, idle=True)
    waiter, dates = scripted(handed, ops, clock)
    handed.extend([Given(0, None, None, None, ()), 0.001, 0.002, 0.003])
    ops.ready = lambda handles: (clock.__setitem__(0, 0.9), True)[1]  # type: ignore[method-assign]  # checked late
    waiter._book_unheld(len(handed), paused=True)
    assert ops.barriers == 1
    assert dates == pytest.approx([0.021, 0.041, 0.061], abs=1e-3)
