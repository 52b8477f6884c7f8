"""The process's hand (jaxmon.training.hand.HAND): `jaxmon.step` is its bound method, armed by the newest tracker
and disarmed by that tracker's stop(), never by an older one's."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import pytest

import jaxmon
from jaxmon import training
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training import hand
from jaxmon.training.hand import HAND
from jaxmon.training.tracker import Tracker, TrackerConfig
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
