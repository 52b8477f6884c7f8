"""The process's hand (jaxmon.training.hand.HAND): `jaxmon.step` is its bound method, armed by the newest tracker
and disarmed by that tracker's stop(), never by an older one's."""

from __future__ import annotations

import gc
import time
import warnings
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import jaxmon
from jaxmon import training
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training import hand
from jaxmon.training.hand import HAND
from jaxmon.training.tracker import Tracker, TrackerConfig
from tests.helpers import wait_until
from tests.unit.training.conftest import PEAK, booked


def test_jaxmon_step_is_the_hands_bound_method() -> None:
    """One Python call a step: no function in front of the hand's step()."""
    assert jaxmon.step == HAND.step and training.step == HAND.step


def test_the_newest_tracker_gets_the_steps_and_an_older_ones_stop_leaves_it_armed(
    shared_ops: JaxTraining, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = Tracker(shared_ops, TrackerConfig(peak_flops=PEAK))
    newer = Tracker(shared_ops, TrackerConfig(peak_flops=PEAK))
    monkeypatch.setattr(training, "_tracker", newer)
    x = jnp.ones(4)
    try:
        older.stop(10)  # as release() of a start() that stopped after another start() began: too late to disarm
        assert HAND.owner is newer
        for n in range(3):
            x = x + 1
            jaxmon.step(n, x)
        reading = booked(newer, 3)
        assert reading.steps_total == 3 and reading.dispatched_step == 2
        assert older.reading() is None  # it never was handed a step
    finally:
        newer.stop(10)
    assert HAND.owner is None


def test_a_stopped_trackers_reading_keeps_what_was_handed_and_the_hand_holds_nothing_of_it(
    shared_ops: JaxTraining, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = Tracker(shared_ops, TrackerConfig(peak_flops=PEAK))
    monkeypatch.setattr(training, "_tracker", tracker)
    x = jnp.ones(4)
    try:
        for n in range(5):
            x = x * 2
            jaxmon.step(n, x, examples=8)
        booked(tracker, 5)
    finally:
        tracker.stop(10)
    reading = tracker.reading()
    assert reading is not None and reading.steps_total == 5 and reading.dispatched_step == 4
    assert reading.examples_total == 40
    assert HAND.owner is None and HAND._ready == () and len(HAND._handed) == 0
    # Disarmed, a step is dropped with the one warning, and hands nothing to the stopped tracker.
    monkeypatch.setattr(training, "_tracker", None)
    monkeypatch.setattr(hand, "_warned", False)
    with pytest.warns(RuntimeWarning, match=r"jaxmon\.step\(\) does nothing before jaxmon\.start\(\)") as caught:
        jaxmon.step(5, x, examples=8)
    assert caught[0].filename == __file__  # the warning names the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jaxmon.step(6, x)
    assert tracker.reading() == reading


def test_the_hold_step_checks_while_the_waiter_waits_goes_once_the_loop_is_still_and_at_stop(
    shared_ops: JaxTraining, monkeypatch: pytest.MonkeyPatch
) -> None:
    """step() keeps the hold it last checked (the one the waiter waits for) only until the next look's: a loop that
    goes still lets it go (the waiter's let_go()), and nothing of jaxmon keeps its arrays; a stop lets go of it too."""
    tracker = Tracker(shared_ops, TrackerConfig(peak_flops=PEAK))
    monkeypatch.setattr(training, "_tracker", tracker)
    f = jax.jit(lambda w, x: jnp.tanh(w @ x))  # some milliseconds a step on a CPU device: the waiter waits on each
    w = jnp.full((384, 384), 1e-3)
    x = jnp.ones((384, 384))
    f(w, x).block_until_ready()
    checked: list[weakref.ref[Any]] = []
    try:
        for n in range(200):
            x = f(w, x)
            jaxmon.step(n, x)
            if (hold := HAND._checked) is not None and not checked:
                checked.append(weakref.ref(hand.handles(hold)[0]))  # jaxmon's clone, as step() keeps it
        assert checked, "step() never checked a hold the waiter waited for"
        booked(tracker, 200)
        del x, hold
        wait_until(lambda: HAND._checked is None, timeout=5, what="the checked hold let go by a still loop")
        gc.collect()
        assert checked[0]() is None  # nothing of jaxmon's keeps the clone (its buffers are the loop's to free)
        # A stop lets go of one checked since.
        y = f(w, jnp.ones((384, 384)))
        jaxmon.step(200, y)
        HAND._checked = HAND.waiting = hand.Hold([y])  # as step() and the waiter set them
    finally:
        tracker.stop(10)
    assert HAND._checked is None and HAND.waiting is None


def test_a_loop_that_goes_still_after_a_held_step_keeps_nothing_of_it(
    shared_ops: JaxTraining, monkeypatch: pytest.MonkeyPatch
) -> None:
    """step() looks at the newest hold handed until it finds it complete: a loop whose last step was held (the
    waiter took it, and found nothing after it) and that goes still lets it go too."""
    tracker = Tracker(shared_ops, TrackerConfig(peak_flops=PEAK))
    monkeypatch.setattr(training, "_tracker", tracker)
    f = jax.jit(lambda x: x + 1)
    x = f(jnp.ones(4)).block_until_ready()
    try:
        for n in range(3):
            time.sleep(0.05)  # more than a look's time: each step held
            x = f(x)
            jaxmon.step(n, x)
        held = HAND._watched
        assert held is not None  # the last step's hold: no step() since looked at it
        clone = weakref.ref(hand.handles(held)[0])
        del held
        booked(tracker, 3)
        wait_until(lambda: HAND._watched is None and HAND._checked is None, timeout=5, what="the hold let go")
        del x
        gc.collect()
        assert clone() is None  # nothing of jaxmon's keeps the clone
    finally:
        tracker.stop(10)
