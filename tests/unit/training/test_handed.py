"""The handed steps (hand.py's protocol): what step() appends, and the waiter's reading of it back, must be the steps
as step() was given them: numbers on from the step before, its figures and tracked calls, the holds where they were."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import jax.numpy as jnp
import numpy as np

import jaxmon
from jaxmon.training.hand import PAUSED, Found, Given, Hand, Hold
from jaxmon.training.handed import Program
from jaxmon.training.sampler import Off
from jaxmon.training.waiter import Waiter
from tests.unit.training.conftest import MakeTracker, booked


class Waiting:
    """The waiter's side as step() reads it: nothing taken, no hold asked for but the first step's (the first step
    is held: none was yet)."""

    booked = holds = 0
    every = float("inf")
    room = 10**9

    def wake(self) -> None:
        pass


class Ops:
    """A JAX side with no arrays: a hold is a barrier's outputs (none here)."""

    def arrays(self, ready: object) -> list[object]:
        return []

    def barrier(self) -> list[object]:
        return []

    def is_array(self, value: object) -> bool:
        return False


def hand(times: list[float]) -> tuple[Hand, deque[Any]]:
    handed: deque[Any] = deque()
    clock = iter(times)
    h = Hand()
    h.arm(object(), Ops(), lambda: next(clock), handed, Waiting(), Off(), lambda *a, **k: None, 100)  # type: ignore[arg-type]
    return h, handed


def parsed(items: list[Any]) -> list[tuple[float, Any, int]]:
    """The waiter's steps of `items`: (hand-off, context, place in it)."""
    waiter = Waiter.__new__(Waiter)  # its parsing alone: no thread
    waiter._given, waiter._offset, waiter.holds = Given(None, None, None, None, ()), 0, 0
    taken = waiter._parse(items)
    out = []
    bounds = [*taken.starts[1:], len(taken.handed)]
    for start, context, offset, stop in zip(taken.starts, taken.givens, taken.offsets, bounds, strict=True):
        out += [(taken.handed[k], context, offset + k - start) for k in range(start, stop)]
    return out


def test_a_step_that_follows_on_is_its_hand_off_time_alone() -> None:
    h, handed = hand([float(k) for k in range(10)])
    for n in range(3):
        h.step(n, examples=32)
    h.step(7, examples=32)  # a jump: a context first
    h.step(8, examples=np.int64(32))  # a NumPy figure, equal: follows on
    h.step(9, examples=64)  # other figures
    items = list(handed)
    first, jump, other = (item for item in items if type(item) is Given)
    assert items == [first, 0.0, items[2], 1.0, 2.0, jump, 3.0, 4.0, other, 5.0] and type(items[2]) is Hold
    assert (first.number, jump.number, other.number) == (0, 7, 9) and other.examples == 64
    steps = parsed(items)
    assert [(context.number + offset, context.examples) for _, context, offset in steps] == [
        (0, 32), (1, 32), (2, 32), (7, 32), (8, 32), (9, 64),
    ]  # fmt: skip


def test_numpy_numbers_and_figures_are_python_numbers_and_follow_on() -> None:
    h, handed = hand([float(k) for k in range(10)])
    for n in range(4):
        h.step(np.int64(n), tokens=np.float32(512), examples=np.int32(4))
    items = list(handed)
    assert [type(item) for item in items] == [Given, float, Hold, float, float, float]
    assert items[0] == Given(0, 4, 512.0, None, ()) and type(items[0].number) is int


def test_a_pause_and_a_hold_are_where_they_were() -> None:
    h, handed = hand([0.0, 0.001, 1.0, 1.001])
    h.paused_after = 0.5
    h.step(0)
    h.step(1)
    h.asked = object()  # the waiter asks: the next step is held
    h.step(2)
    h.step(3)
    items = list(handed)
    kinds = [type(i) if i is not PAUSED else PAUSED for i in items]
    assert kinds == [Given, float, Hold, float, PAUSED, float, Hold, float]
    waiter = Waiter.__new__(Waiter)
    waiter._given, waiter._offset, waiter.holds = Given(None, None, None, None, ()), 0, 0
    steps = waiter._parse(items)
    assert len(steps.handed) == 4 and steps.pauses == [2] and steps.held == [0, 2]


class Readiness(Ops):
    """A JAX side whose holds are complete once `done` is set."""

    done = False

    def ready(self, handles: object) -> bool:
        return self.done


def test_step_says_when_it_finds_the_newest_hold_complete_before_the_waiter_waits_for_it() -> None:
    """The waiter has not taken the held step yet (woken late, or busy with the look before): the loop's next call
    that finds it complete says so, a Found before its own step; a hold that still runs is looked at again only
    once a GIL switch interval of the loop's time has passed, and one found complete no more."""
    handed: deque[Any] = deque()
    ops = Readiness()
    times = iter([0.0, 0.001, 0.002, 0.010, 0.0101, 0.011])
    h = Hand()
    h.arm(object(), ops, lambda: next(times), handed, Waiting(), Off(), lambda *a, **k: None, 100)  # type: ignore[arg-type]
    h.step(0)  # held: the first step
    h.step(1)  # it still runs
    h.step(2)  # within a switch interval: not looked at
    ops.done = True
    h.step(3)  # found complete
    h.step(4)
    items = list(handed)
    assert h.waiting is None  # (no waiter waits)
    assert [type(item) for item in items] == [Given, float, Hold, float, float, Found, float, float]
    found = items[5]
    assert found.hold is items[2] and found.at == 0.0101 and items[6] == 0.010
    assert h._watched is None and h._checked is None  # nothing of the hold kept once found complete


def test_a_loop_whose_figures_change_books_each_step_with_its_own(make_tracker: MakeTracker) -> None:
    """Figures that change every 700 steps (a sequence-length schedule), tokens computed each step (another int object
    each time, equal), and a step number that jumps: each step is booked with its own figures, follow-on or not."""
    tracker = make_tracker()
    ready = jnp.ones(())
    ready.block_until_ready()
    examples = tokens = 0
    steps = 0
    for n in [*range(2100), *range(5000, 5300)]:
        batch = (32, 64, 16)[min(n // 700, 2)]
        length = int("512")  # not the cached constant: an equal int, another object each step
        jaxmon.step(n, ready, examples=batch, tokens=batch * length)
        examples, tokens, steps = examples + batch, tokens + batch * length, steps + 1
        if n % 50 == 0:
            time.sleep(0.001)  # a few looks within the run
    reading = booked(tracker, steps)
    assert (reading.steps_total, reading.examples_total, reading.tokens_total) == (steps, examples, tokens)
    assert reading.problems.get("jump") == 1 and not reading.problems.get("invalid")


def test_a_step_of_two_tracked_calls_follows_on_too() -> None:
    """Two calls of a program a step (gradient accumulation) make a new tuple of programs each step: equal ones
    follow on all the same (a float handed, no context)."""
    h, handed = hand([k / 1000 for k in range(100)])  # 1 ms apart
    program = Program(None)
    for n in range(4):
        h.called(program)
        h.called(program)
        h.step(n, examples=32)
    assert [type(item) for item in handed] == [Given, float, Hold, float, float, float]
    assert handed[0].calls == (program, program)
