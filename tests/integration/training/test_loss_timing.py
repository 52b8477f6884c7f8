"""The loss gauge (issue 42) in loops of real waiting: a value that moves on with the loop (two read periods), ready
trees of other shapes stepped over a whole read period, and a loop that ended (120 paced steps). The truth of each
value read is computed here from the step the reading names, as in tests/unit/training/test_loss.py, which has the
gauge's other claims and the helpers used here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import pytest

import jaxmon
from jaxmon.training.waiter import LOOK_MAX
from jaxmon.training_readings import TrainingReading
from tests.unit.training.conftest import MakeTracker, booked
from tests.unit.training.test_loss import DEADLINE, exported, inverse, run_until, truth


def test_the_loss_gauge_is_the_loss_of_the_step_it_names_and_follows_the_loop(make_tracker: MakeTracker) -> None:
    """jaxmon.step(n, loss) with loss = 1/(n+1) on the device: every reading's value is the loss of its loss_step,
    as read (float32's value exactly), and it moves on with the loop (read again after LOOK_MAX)."""
    tracker = make_tracker()
    seen: dict[int, float] = {}

    def note(reading: TrainingReading) -> bool:
        if reading.loss:
            assert reading.loss_step is not None
            assert reading.loss == {"loss": truth(reading.loss_step)}
            assert exported(reading) == ({"loss": truth(reading.loss_step)}, float(reading.loss_step))
            seen[reading.loss_step] = reading.loss["loss"]
        else:
            assert reading.loss_step is None and exported(reading) == ({}, None)
        return len(seen) >= 3

    started = time.monotonic()
    run_until(lambda n: inverse(jnp.int32(n)), tracker, note)
    # At most one read a LOOK_MAX: three distinct steps read take at least two periods.
    assert time.monotonic() - started >= 2 * LOOK_MAX
    steps = sorted(seen)
    assert steps[0] < steps[1] < steps[2] and seen[steps[0]] > seen[steps[2]]


@pytest.mark.parametrize(
    ("ready", "what"),
    [
        (lambda n: jnp.full((4,), 1.0 / (n + 1)), "a vector"),
        (lambda n: (inverse(jnp.int32(n)), inverse(jnp.int32(n + 1))), "a tuple of scalars"),
        (lambda n: {"loss": inverse(jnp.int32(n)), "logits": jnp.ones((2, 2))}, "a dict with a non-scalar"),
        (lambda n: [inverse(jnp.int32(n))], "a list of one scalar"),
    ],
)
def test_a_ready_that_is_not_a_scalar_or_a_dict_of_scalars_gives_no_loss_series(
    make_tracker: MakeTracker, ready: Callable[[int], Any], what: str
) -> None:
    """Steps booked over more than a read period: a scalar or a dict of scalars is read at the first look (the
    first read waits for no period), so a loss of these shapes would have been read by then."""
    tracker = make_tracker()
    start = time.monotonic()
    reading = run_until(ready, tracker, lambda r: r.steps_total >= 5 and time.monotonic() - start > LOOK_MAX)
    assert (reading.loss, reading.loss_step) == ({}, None), what
    assert exported(reading) == ({}, None), what


def test_a_loop_that_ended_shows_a_loss_of_its_last_steps_not_its_first(make_tracker: MakeTracker) -> None:
    """Issue 49: a loop of 120 five-millisecond steps that then ended still showed step 0's loss. Once the loop is
    still, the newest loss held is read: a step of the loop's last LOOK_MAX of host time (a step is held once per
    look), with that step's loss."""
    tracker = make_tracker()
    steps, pace = 120, 0.005
    for n in range(steps):
        jaxmon.step(n, inverse(jnp.int32(n)))
        time.sleep(pace)
    booked(tracker, steps)
    reading = tracker.reading()
    deadline = time.monotonic() + DEADLINE
    while reading is not None and (reading.loss_step or 0) < steps - 1 - LOOK_MAX / pace:
        assert time.monotonic() < deadline, reading.loss_step
        time.sleep(0.05)
        reading = tracker.reading()
    assert reading is not None and reading.loss_step is not None
    assert reading.loss == {"loss": truth(reading.loss_step)}
