"""jaxmon.publish()'s lifecycle in this process, on real JAX CPU devices: the document written at stop(remove=False)
holds the steps since the last periodic one, a stopped publisher is let go whole (no exit callback holds it), and a
later publish() gets a training tracker with its own options. The embedded exporter's: tests/e2e/test_lifecycle.py."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import jax.numpy as jnp
import pytest

import jaxmon
from jaxmon import finalization, training
from jaxmon.births import BADPUT_KINDS, PROBLEM_REASONS
from jaxmon.publisher import Publisher
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("no_jaxmon_env", "restore_logging")


def steps_seen(count: int) -> None:
    wait_until(
        lambda: (t := training.current()) is not None and (r := t.reading()) is not None and r.steps_total >= count,
        what=f"{count} steps seen complete",
    )


def first_document(publisher: Publisher) -> None:
    wait_until(lambda: publisher.writes == 1, what="the first document")


def test_stop_keeping_the_file_writes_the_steps_since_the_last_document(tmp_path: Path) -> None:
    # One document at start, the next an hour later: every step below comes after the last periodic one.
    publisher = jaxmon.publish(tmp_path, workload="kept", interval=3600.0)
    try:
        first_document(publisher)
        # No step() yet: the training counters are there at 0 (born at zero, jaxmon.births), each built-in badput
        # kind and every problem's reason included, since the tracker's start.
        first = json.loads(publisher.path.read_text())["training"]
        assert first["steps_total"] == 0 and first["tokens_total"] == 0 and first["productive_seconds_total"] == 0
        assert set(first["badput_seconds_total"]) >= set(BADPUT_KINDS)
        assert set(first["badput_seconds_total"].values()) == {0}
        assert set(first["problems"]) == set(PROBLEM_REASONS) and set(first["problems"].values()) == {0}
        assert 0 <= first["elapsed_seconds"] < 60
        x = jnp.ones((64, 64))
        for n in range(7):
            x = x @ x / 64.0
            jaxmon.step(n, x, examples=32)
        steps_seen(7)
    finally:
        publisher.stop(remove=False)
    doc = json.loads(publisher.path.read_text())
    assert publisher.writes == 2
    assert doc["training"]["steps_total"] == 7
    assert doc["training"]["step"] == 6
    assert doc["training"]["examples_total"] == 7 * 32


def test_stop_removing_the_file_writes_no_last_document(tmp_path: Path) -> None:
    publisher = jaxmon.publish(tmp_path, workload="gone", interval=3600.0)
    first_document(publisher)
    publisher.stop()
    assert publisher.writes == 1
    assert not publisher.path.exists()


def test_a_stopped_publisher_is_let_go_and_a_new_one_gets_its_own_training_options(tmp_path: Path) -> None:
    callbacks = finalization.registered()
    first = jaxmon.publish(tmp_path, workload="a", interval=3600.0, training={"peak_flops": 1e12, "window": 10})
    tracker = training.current()
    assert tracker is not None and (tracker.config.peak_flops, tracker.config.window) == (1e12, 10)
    first_document(first)
    first.stop()
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None, "nothing keeps a stopped publisher alive (its exit callback is unregistered)"
    assert training.current() is None, "the last holder stopped the tracker"
    assert finalization.registered() == callbacks

    second = jaxmon.publish(tmp_path, workload="a", interval=3600.0, training={"peak_flops": 2e12, "window": 20})
    try:
        new = training.current()
        assert new is not None and new is not tracker
        assert (new.config.peak_flops, new.config.window) == (2e12, 20)
        jaxmon.step(0, jnp.ones(4))  # reaches the new tracker
        steps_seen(1)
    finally:
        second.stop()
    assert training.current() is None
    assert finalization.registered() == callbacks


def test_the_document_a_stop_keeps_holds_every_step_handed(tmp_path: Path) -> None:
    """Issue 50: publish().stop(remove=False) wrote 5,119 of 6,000 steps, every one of them complete: the last
    document is written once the tracker booked every step handed."""
    publisher = jaxmon.publish(tmp_path, workload="burst", interval=3600.0)
    try:
        first_document(publisher)
        x = jnp.ones(8)
        for n in range(6000):
            jaxmon.step(n, x, tokens=4)
        x.block_until_ready()
    finally:
        publisher.stop(remove=False)
    doc = json.loads(publisher.path.read_text())["training"]
    assert (doc["steps_total"], doc["step"], doc["tokens_total"]) == (6000, 5999, 6000 * 4)
