"""The loss gauge (issue 42) from a real tracker on JAX CPU devices to the rendered families: the loop's loss is a
known function of the step number computed on the device, so the truth of every value read is computed here from
the step the reading names (`loss_step`), never from what jaxmon says. The loops that wait read periods out (a
value that moves on, ready trees of other shapes, a loop that ended) are
tests/integration/training/test_loss_timing.py's."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from prometheus_client.core import Metric
from structlog.testing import capture_logs

import jaxmon
from jaxmon.families.training import training_families
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.tracker import Tracker
from jaxmon.training_readings import MAX_LOSS_NAME, MAX_LOSS_NAMES, TrainingReading, bounded_loss
from tests.unit.training.conftest import MakeTracker, booked

LABELS = {"workload": "w", "process_index": "0", "host": "h"}
DEADLINE = 120.0  # seconds a loop may take on a loaded machine to show what a test waits for


def families(reading: TrainingReading) -> dict[str, Metric]:
    """The training families as the exporter renders them for this reading, by name."""
    return {f.name: f for f in training_families([(LABELS, reading)])}


def exported(reading: TrainingReading) -> tuple[dict[str, float], float | None]:
    """The loss gauge's samples by `name`, and the loss step's sample (None: no series)."""
    fams = families(reading)
    loss = {s.labels["name"]: s.value for s in fams["jaxmon_training_loss"].samples}
    for s in fams["jaxmon_training_loss"].samples:
        assert {k: v for k, v in s.labels.items() if k != "name"} == LABELS
    steps = [s.value for s in fams["jaxmon_training_loss_step"].samples]
    assert len(steps) <= 1
    return loss, steps[0] if steps else None


def run_until(
    step: Callable[[int], Any], tracker: Tracker, done: Callable[[TrainingReading], bool], pause: float = 0.005
) -> TrainingReading:
    """Steps n = 0, 1, ... handed to jaxmon.step(n, step(n)) until `done(reading)` holds for a reading taken
    between steps; that reading."""
    deadline = time.monotonic() + DEADLINE
    n = 0
    while time.monotonic() < deadline:
        jaxmon.step(n, step(n))
        n += 1
        time.sleep(pause)
        reading = tracker.reading()
        if reading is not None and done(reading):
            return reading
    raise AssertionError(f"not seen in {DEADLINE} s of steps ({n} steps)")


# The loop's loss and accuracy of step n, computed on the device in float32; the truth is the same sum on the host.
inverse = jax.jit(lambda n: 1.0 / (n.astype(jnp.float32) + 1.0))
both = jax.jit(lambda n: {"loss": 1.0 / (n.astype(jnp.float32) + 1.0), "acc": n.astype(jnp.float32) * 0.5})


def truth(n: int) -> float:
    return float(np.float32(1.0) / (np.float32(n) + np.float32(1.0)))


def test_a_dict_of_two_scalars_is_two_names_of_one_step(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    reading = run_until(lambda n: both(jnp.int32(n)), tracker, lambda r: bool(r.loss))
    assert reading.loss_step is not None
    n = reading.loss_step
    expected = {"acc": float(np.float32(n) * np.float32(0.5)), "loss": truth(n)}
    assert reading.loss == expected
    assert exported(reading) == (expected, float(n))


def test_a_diverged_loss_is_exported_as_nan_and_inf(make_tracker: MakeTracker) -> None:
    """A NaN is the news, not a bad figure: exported as it is (an inf too), never dropped nor counted invalid."""
    tracker = make_tracker()
    diverge = jax.jit(lambda n: {"loss": jnp.log(-1.0 - n.astype(jnp.float32)), "scale": jnp.exp(1e4 + n * 0.0)})
    reading = run_until(lambda n: diverge(jnp.int32(n)), tracker, lambda r: bool(r.loss))
    assert math.isnan(reading.loss["loss"]) and reading.loss["scale"] == float("inf")
    loss, step = exported(reading)
    assert math.isnan(loss["loss"]) and loss["scale"] == float("inf") and step == reading.loss_step
    assert reading.problems.get("invalid", 0) == 0


def test_more_than_sixteen_names_keep_the_first_sixteen_sorted_and_say_so_once(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    many = jax.jit(lambda n: {f"m{i:02d}": n.astype(jnp.float32) + i for i in range(20)})
    with capture_logs() as logs:
        reading = run_until(lambda n: many(jnp.int32(n)), tracker, lambda r: bool(r.loss))
        assert reading.loss_step is not None
        n = reading.loss_step
        assert reading.loss == {f"m{i:02d}": float(n + i) for i in range(MAX_LOSS_NAMES)}
        for _ in range(3):
            tracker.reading()
    said = [e for e in logs if "loss gauge" in e["event"]]
    assert len(said) == 1 and said[0]["left_out"] == 20 - MAX_LOSS_NAMES and said[0]["log_level"] == "warning"


def test_names_are_cut_made_valid_and_bounded_like_other_label_values() -> None:
    long = "x" * (MAX_LOSS_NAME + 10)
    kept, left_out = bounded_loss({long: 1.0, long + "y": 2.0, "": 3.0, "bad\udcff": 4.0, "loss": 5.0})
    # Sorted: "" (left out: no label), "bad?", "loss", then the long ones: one cut name, the first in order.
    assert kept == {"bad?": 4.0, "loss": 5.0, "x" * MAX_LOSS_NAME: 1.0}
    assert left_out == 2
    names = {f"n{i:03d}": float(i) for i in range(100)}
    kept, left_out = bounded_loss(names)
    assert list(kept) == sorted(names)[:MAX_LOSS_NAMES] and left_out == 100 - MAX_LOSS_NAMES
    assert bounded_loss({}) == ({}, 0)


def test_no_loss_is_exported_before_one_was_read(make_tracker: MakeTracker) -> None:
    """Gauges are not counters: no series at 0 before the first read (with_zeros and Births leave them alone)."""
    from jaxmon.births import Births, with_zeros

    tracker = make_tracker()
    x = jnp.ones((8,))
    jaxmon.step(0, x)
    reading = booked(tracker, 1)
    assert exported(with_zeros(reading)) == ({}, None)
    read = TrainingReading(loss={"loss": 0.25}, loss_step=7)
    held = Births(lambda: 0).training("key", with_zeros(read))  # a new series no scrape has served yet
    assert exported(held) == ({"loss": 0.25}, 7.0)  # a gauge is served as read from the first render


def test_a_dict_of_a_thousand_scalars_holds_and_reads_the_sixteen_it_exports(
    make_tracker: MakeTracker, source: LocalSource
) -> None:
    """A step's dict of 1000 metrics costs what one of 16 does (issue 49: 7.6 ms a look and 5.4 ms a read before):
    only the names the loss gauge exports are held and read."""

    class Counting(JaxTraining):
        held = read = 0

        def hold(self, array: Any) -> Any | None:
            Counting.held += 1
            return super().hold(array)

        def value(self, handle: Any) -> Any:
            Counting.read += 1
            return super().value(handle)

    ops = Counting(source)
    tracker = make_tracker(ops=ops)
    first = jax.jit(lambda n: {f"m{i:04d}": n.astype(jnp.float32) + i for i in range(MAX_LOSS_NAMES)})
    rest = {f"m{i:04d}": jnp.float32(i) for i in range(MAX_LOSS_NAMES, 1000)}  # (one program of 1000 outputs
    reading = run_until(  # compiles for a minute here)
        lambda n: {**first(jnp.int32(n)), **rest}, tracker, lambda r: bool(r.loss) and r.steps_total >= 3
    )
    looks = tracker.waiter.looks
    assert reading.loss == {f"m{i:04d}": float(reading.loss_step + i) for i in range(MAX_LOSS_NAMES)}  # type: ignore[operator]
    # Each hold takes 16 handles (a step's number is no array here: none of its own), each loss read 16 values.
    assert 0 < Counting.held <= MAX_LOSS_NAMES * (looks + 2), (Counting.held, looks)
    assert 0 < Counting.read <= MAX_LOSS_NAMES * (looks + 2), (Counting.read, looks)
