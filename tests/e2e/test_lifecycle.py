"""jaxmon.start() after stop() in this process, on real JAX CPU devices and a real HTTP port: a second start gets
its own training options (a new tracker, which step() and track()ed functions made before reach), a stopped
exporter is let go whole (no exit callback keeps its runtime alive), and start() beside publish() shares one tracker
until both stopped. publish() alone: tests/unit/test_publisher_lifecycle.py."""

from __future__ import annotations

import gc
import warnings
import weakref
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import requests
from structlog.testing import capture_logs

import jaxmon
from jaxmon import finalization, training
from tests.helpers import parse_samples, wait_until

pytestmark = pytest.mark.usefixtures("no_jaxmon_env", "restore_logging")


def options(peak: float, window: int) -> dict[str, Any]:
    """A quick exporter (no probe: its programs are not what this tests) with these training options."""
    return {
        "poll": {"interval": "0.5s"},
        "collector": {"probe": False, "training": {"peak_flops": peak, "window": window}},
    }


def steps_seen(count: int) -> None:
    wait_until(
        lambda: (t := training.current()) is not None and (r := t.reading()) is not None and r.steps_total >= count,
        what=f"{count} steps seen complete",
    )


def test_a_second_start_gets_its_own_training_options_and_the_first_is_let_go() -> None:
    callbacks = finalization.registered()
    matmul = jaxmon.track(jax.jit(lambda x: x @ x))  # made before the first start, used under both
    x = jnp.ones((32, 32))
    first = jaxmon.start(0, **options(1e12, 10))
    tracker = training.current()
    assert tracker is not None and (tracker.config.peak_flops, tracker.config.window) == (1e12, 10)
    jaxmon.step(0, matmul(x))
    steps_seen(1)
    runtime = weakref.ref(first.runtime)
    exporter = weakref.ref(first)
    first.stop()
    first.stop()  # a second stop does nothing
    del first
    gc.collect()
    assert exporter() is None and runtime() is None, "nothing keeps a stopped exporter's runtime alive"
    assert training.current() is None
    assert finalization.registered() == callbacks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one "does nothing before start()" warning, if not given yet
        jaxmon.step(1, x)  # between the two: does nothing, never raises

    second = jaxmon.start(0, **options(2e12, 20))
    try:
        new = training.current()
        assert new is not None and new is not tracker
        assert (new.config.peak_flops, new.config.window) == (2e12, 20)
        for n in range(2, 5):
            jaxmon.step(n, matmul(x))  # the tracked function notes its calls to the new tracker
        steps_seen(3)
        reading = new.reading()
        assert reading is not None and reading.steps_total == 3
        flops = sum(d.hardware_flops_total or 0.0 for d in reading.devices)
        assert flops == 3 * 2 * 32**3  # XLA's cost of x @ x, three calls
        assert {d.peak_flops for d in reading.devices} == {2e12}
        # And it is what the second exporter serves.
        url = f"{second.url}/metrics"

        def served() -> list[float]:
            text = requests.get(url, timeout=10).text
            return [v for (name, _), v in parse_samples(text).items() if name == "jaxmon_training_steps_total"]

        wait_until(lambda: served() == [3.0], what="the second exporter serving the new tracker's steps")
    finally:
        second.stop()
    assert training.current() is None
    assert finalization.registered() == callbacks


def test_start_beside_publish_shares_one_tracker_until_both_stopped(tmp_path: Path) -> None:
    publisher = jaxmon.publish(tmp_path, workload="both", interval=3600.0, training={"peak_flops": 1e12})
    tracker = training.current()
    try:
        with capture_logs() as logs:
            exporter = jaxmon.start(0, **options(3e12, 10))
        assert training.current() is tracker, "one tracker: jaxmon.step() feeds one"
        warned = [e for e in logs if "already runs with other training options" in e["event"]]
        assert len(warned) == 1 and "3000000000000.0" in warned[0]["asked"]
        exporter.stop()
        assert training.current() is tracker, "the publisher still holds it"
        jaxmon.step(0, jnp.ones(4))
        steps_seen(1)
    finally:
        publisher.stop()
    assert training.current() is None
