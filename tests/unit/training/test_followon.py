"""A step that follows on is handed as its hand-off time alone (steps.py): the waiter's batch of them, read back as
Handoff tuples (`expand`) or as columns (`Run.of`), must be the steps as step() was given them: numbers on from the
step before, its figures and tracked calls, the holds where they were."""

from __future__ import annotations

import time
from collections import deque

import jax.numpy as jnp

import jaxmon
from jaxmon.training.hand import Hand
from jaxmon.training.handed import Program
from jaxmon.training.sampler import Off
from jaxmon.training.steps import MARK, NO_CALLS, RESUMED, Handoff, Hold, Item, Run, expand
from tests.unit.training.conftest import MakeTracker, booked

CALLS = ("program",)
BASE = (9, 32, 4096, 1e9, CALLS)


def step(handed: float, number: object, examples: object = 32, hold: Hold | None = None) -> Handoff:
    return (handed, number, examples, 4096, 1e9, CALLS, hold)


def test_floats_follow_on_from_the_step_before_them() -> None:
    hold = Hold([object()])
    items = [1.0, 2.0, step(3.0, 12, hold=hold), 4.0]
    batch, base = expand(items, BASE)
    assert batch == [
        (1.0, 10, 32, 4096, 1e9, CALLS, None),
        (2.0, 11, 32, 4096, 1e9, CALLS, None),
        step(3.0, 12, hold=hold),
        (4.0, 13, 32, 4096, 1e9, CALLS, None),
    ]
    assert base == (13, 32, 4096, 1e9, CALLS)


def test_a_tuple_with_other_figures_is_the_base_of_the_floats_after_it_and_a_marker_is_none() -> None:
    items = [step(1.0, 10, examples=64), (1.5, MARK, None, None, None, NO_CALLS, Hold([])), 2.0]
    batch, base = expand(items, BASE)
    assert [b[1:3] for b in batch] == [(10, 64), (MARK, None), (11, 64)]
    assert base == (11, 64, 4096, 1e9, CALLS)


def test_a_batch_that_follows_on_is_read_as_columns() -> None:
    hold = Hold([object()])
    run = Run.of([1.0, 2.0, 3.0, step(4.0, 13, hold=hold)], BASE)
    assert run is not None
    assert (run.handed, run.numbers, run.holds) == ([1.0, 2.0, 3.0, 4.0], range(10, 14), [hold])
    assert (run.examples, run.tokens, run.model_flops, run.programs) == (32, 4096, 1e9, CALLS)
    assert run.last() == (13, 32, 4096, 1e9, CALLS)
    assert run.handoffs() == expand([1.0, 2.0, 3.0, step(4.0, 13)], BASE)[0]


def test_a_batch_that_does_not_follow_on_is_no_run() -> None:
    assert Run.of([1.0, 2.0], None) is None  # no step before it known
    assert Run.of([1.0, step(2.0, 12)], BASE) is None  # a number skipped
    assert Run.of([1.0, step(2.0, 11, examples=64)], BASE) is None  # other figures
    assert Run.of([1.0, step(2.0, 11, examples=32.0)], BASE) is None  # an equal figure of another type
    assert Run.of([1.0, (1.5, RESUMED, None, None, None, NO_CALLS, None), step(2.0, 11)], BASE) is None  # a pause
    assert Run.of([1.0, (2.0, 11, 32, 4096, 1e9, NO_CALLS, None)], BASE) is None  # other tracked calls
    assert Run.of([1.0], (9, float("nan"), 4096, 1e9, CALLS)) is not None  # checked when booked (Books.run)


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


class Waiting:
    """The waiter's side as step() reads it: no look wanted, none under way."""

    want = False
    taken = 0
    every = 0.02
    resumed_after = float("inf")

    def wake(self) -> None:
        pass


def test_a_step_of_two_tracked_calls_follows_on_too() -> None:
    """Two calls of a program a step (gradient accumulation) make a new tuple of programs each step: equal ones
    follow on all the same (a float handed, not a tuple)."""
    handed: deque[Item] = deque()
    clock = iter(k / 1000 for k in range(100))  # 1 ms apart: within a look
    hand = Hand()
    hand.arm(object(), Ops(), lambda: next(clock), handed, Waiting(), Off(), lambda *a, **k: None, 100)  # type: ignore[arg-type]
    program = Program(None)
    for n in range(4):
        hand.called(program)
        hand.called(program)
        hand.step(n, examples=32)
    assert [type(item) for item in handed] == [tuple, float, float, float]
    run = Run.of(list(handed)[1:], (0, 32, None, None, (program, program)))
    assert run is not None and run.numbers == range(1, 4)


class Ops:
    """A JAX side that holds nothing (the steps above are never looked at)."""

    def arrays(self, ready: object) -> list[object]:
        return []

    def barrier(self) -> list[object]:
        return []
