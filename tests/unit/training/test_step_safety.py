"""What step() and the tracker's waiter do with the user's arrays and figures (issue 33), on real JAX CPU
devices: step() never waits for a device; an array deleted or donated at any moment makes a step `unready` (or a
figure `unread`), never a crash; a figure that is not a finite number >= 0 and a step number that is not an integer
are dropped and counted as `invalid`, once logged per field; a `ready` tree without arrays means the barrier.

The race of a deletion with the waiter, thousands of times in a child under faulthandler, is
tests/e2e/test_step_stress.py."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import jaxmon
from jaxmon import training
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.tracker import Tracker
from jaxmon.training_readings import TrainingReading
from tests.helpers import wait_until
from tests.unit.training.conftest import MakeTracker

# Bound at import: the first use of jaxmon's public names imports the embedded exporter (half a second), which a
# test that times step() or holds the waiter behind a first step must not pay inside it.
step = jaxmon.step


def booked(tracker: Tracker, steps: int, problems: int = 0) -> TrainingReading:
    """The reading once the waiter has taken `steps` steps off its queue (booked, plus `problems` not booked)."""

    def done() -> bool:
        reading = tracker.reading()
        return reading is not None and reading.steps_total + problems >= steps and not tracker.pending()

    wait_until(done, what=f"{steps} steps taken by the waiter")
    reading = tracker.reading()
    assert reading is not None
    return reading


@functools.cache
def slow(size: int = 512, repeat: int = 80) -> Callable[[jax.Array], jax.Array]:
    """A jitted computation of a few hundred milliseconds on a CPU device (a device far slower than step()); its
    values stay near 1 (values that underflow to denormals and zeros made it fast). One for each size in the file:
    its programs are compiled once (0.15-0.25 s each); every test that uses it runs it once before its tracker's
    steps, as it did to compile it."""
    return jax.jit(lambda x: jax.lax.fori_loop(0, repeat, lambda _, c: jnp.tanh(c @ c) / size + 1, x))


def counter(f: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    """A device scalar that takes as long as `f` to compute, in one program: the batch's token count, computed on
    device (every element: x.size)."""
    return jax.jit(lambda x: jnp.sum(f(x) > -2.0))


# -- the training thread never waits for a device -----------------------------------------------------------------


def test_step_returns_while_a_device_scalar_figure_is_still_being_computed(make_tracker: MakeTracker) -> None:
    """step() with a device scalar returns before the device has computed it (before issue 33 it converted the
    figure at once, waiting for the whole computation), and the waiter books its value once it is computed."""
    tracker = make_tracker()
    count = counter(slow())
    x = jnp.ones((512, 512))
    count(x).block_until_ready()  # compiled
    number = jnp.int32(0) + 0  # a device step number too (a TrainState's step)
    tokens = count(x)  # dispatched last: an eager op dispatched after it would wait for it (in order on a device)
    start = time.perf_counter()
    step(number, tokens, examples=tokens, tokens=tokens, model_flops=tokens)
    returned = time.perf_counter() - start
    # The truth is the computation's own state: not done yet when step() returned (is_ready() is safe here: the
    # test's own array, deleted by nobody).
    assert not tokens.is_ready()  # type: ignore[attr-defined]
    tokens.block_until_ready()
    computed = time.perf_counter() - start
    assert returned < computed / 2
    reading = booked(tracker, 1)
    assert reading.steps_total == 1 and reading.step == 0 and reading.dispatched_step == 0
    assert reading.tokens_total == reading.examples_total == 512 * 512
    assert sum(d.model_flops_total or 0.0 for d in reading.devices) == pytest.approx(512 * 512)
    assert reading.problems == {}


def test_device_figures_and_step_numbers_are_read_after_the_step_and_booked(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    f = jax.jit(lambda x: x * 1.0001)
    x = jnp.ones((8, 8))
    for n in range(5):
        x = f(x)
        step(
            jnp.int32(n) if n % 2 else np.int64(n),
            x,
            examples=jnp.float32(2.0),
            tokens=jnp.sum(x > 0),  # 64
            model_flops=np.float32(8e6),
        )
    reading = booked(tracker, 5)
    assert reading.step == 4 and reading.dispatched_step == 4
    assert reading.examples_total == 10 and reading.tokens_total == 5 * 64
    assert sum(d.model_flops_total or 0.0 for d in reading.devices) == pytest.approx(4e7)
    assert reading.problems == {} and reading.duration_count == 4


# -- arrays deleted or donated: unready or unread, never a crash -----------------------------------------------


@pytest.fixture(scope="module")
def slow_on_its_own_device() -> tuple[Callable[[jax.Array], jax.Array], jax.Array]:
    """A slow function, compiled, and its input on a device of its own: programs run in order on a device, so an
    eager op on the same device (the test's `jnp.ones(4) + 1`) would wait for it. Once for the file (its compilation
    and first run, a third of a second): each test leaves the device idle (it waits for its steps' completions)."""
    f = slow()
    x = jax.device_put(jnp.ones((512, 512)), jax.devices()[1])
    f(x).block_until_ready()
    return f, x


def looked_at() -> None:
    """Let the next step() be one the waiter looks at (jaxmon's own handles on its ready arrays): one handed a look
    after the last looked-at one is (the steps between are bounded by it, their arrays never touched)."""
    tracker = training.current()
    assert tracker is not None
    time.sleep(tracker.waiter.every * 1.5)


def behind(f: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """Hold the waiter on a first step of a few hundred milliseconds (its output); everything the test hands next
    must be made (compiled, computed) before, or the first step may be done by then."""
    head = f(x)
    step(0, head)
    tracker = training.current()
    assert tracker is not None
    # The waiter took it and waits for it (it takes the steps handed since in batches: these must come after).
    wait_until(lambda: tracker.waiter.taken == 1 and tracker.pending() == 1, what="the waiter waiting for step 0")
    return head


def test_a_ready_array_deleted_after_step_is_unready_not_a_crash(
    make_tracker: MakeTracker, slow_on_its_own_device: tuple[Callable[[jax.Array], jax.Array], jax.Array]
) -> None:
    """Before issue 33 the waiter called is_ready() on it: SIGSEGV (jaxlib dereferences the emptied array)."""
    tracker = make_tracker()
    f, x = slow_on_its_own_device
    z = jnp.ones(4) + 1  # computed: the waiter would have taken the no-wait path for it
    z.block_until_ready()
    head = behind(f, x)
    y = f(x)
    looked_at()
    step(1, y)
    looked_at()
    step(2, z)
    y.delete()
    z.delete()
    assert not head.is_ready()  # type: ignore[attr-defined] # the waiter was still on step 0: it met both deleted
    reading = booked(tracker, 3)
    assert reading.steps_total == 3 and reading.step == 2
    assert reading.problems == {"unready": 2}
    assert reading.duration_count == 0  # no completion seen after the first: no step duration invented


def test_a_donated_ready_array_and_one_deleted_before_step_are_unready(
    make_tracker: MakeTracker, slow_on_its_own_device: tuple[Callable[[jax.Array], jax.Array], jax.Array]
) -> None:
    tracker = make_tracker()
    f, x = slow_on_its_own_device
    donate = jax.jit(lambda a: a + 1, donate_argnums=0)
    y, small = jnp.ones((64, 64)) + 1, jnp.ones(2) + 1
    donate(jnp.ones((64, 64)) + 1).block_until_ready()
    donate(jnp.ones(2) + 1).block_until_ready()
    gone = jnp.ones(3) + 1
    gone.delete()
    head = behind(f, x)
    looked_at()
    step(1, y)
    y2 = donate(y)  # the next step donates it: deleted under the waiter
    looked_at()
    step(2, gone)  # deleted before step(): jaxmon takes no handle on it
    looked_at()
    step(3, {"loss": y2, "metrics": [donate(small)]})
    assert y.is_deleted() and not head.is_ready()  # type: ignore[attr-defined]
    reading = booked(tracker, 4)
    assert reading.steps_total == 4 and reading.problems == {"unready": 2}
    assert reading.step == 3


def test_a_badput_block_after_a_step_whose_arrays_were_deleted_or_donated_is_no_crash(
    make_tracker: MakeTracker,
) -> None:
    """pause() (a badput() block opening) takes jaxmon's handles on the last step's ready arrays, on the training
    thread: arrays deleted, donated, or deleted in another way every few steps, over many blocks, never crash it;
    the blocks are charged and the steps booked."""
    tracker = make_tracker()
    donate = jax.jit(lambda a: a + 1, donate_argnums=0)
    state = jnp.ones(8)
    for n in range(60):
        loss = jnp.sum(state) + n
        state = donate(state)
        step(n, loss if n % 3 else state)
        if n % 3 == 1:
            loss.delete()  # the last step's ready deleted before the block opens
        elif n % 3 == 0:
            state = donate(state)  # the last step's ready (the state) donated before the block opens
        with jaxmon.badput("eval"):
            pass
    reading = booked(tracker, 60)
    assert reading.steps_total == 60 and reading.step == 59
    assert "eval" in reading.badput_seconds_total
    assert set(reading.problems) <= {"unready"}


def test_a_figure_array_deleted_before_it_is_read_is_dropped_and_the_step_completes(
    make_tracker: MakeTracker, slow_on_its_own_device: tuple[Callable[[jax.Array], jax.Array], jax.Array]
) -> None:
    tracker = make_tracker()
    f, x = slow_on_its_own_device
    count = counter(f)
    count(x).block_until_ready()  # compiled
    examples = jnp.float32(4.0) + 0
    number = jnp.int32(2) + 0
    ready = jnp.ones(2) + 1
    head = behind(f, x)
    tokens = count(x)
    step(1, f(x), examples=examples, tokens=tokens)
    tokens.delete()
    step(number, ready, examples=examples)
    number.delete()  # the step number itself: the step cannot be booked under a number
    assert not head.is_ready()  # type: ignore[attr-defined]
    with capture_logs() as logs:
        reading = booked(tracker, 3, problems=1)
    assert reading.steps_total == 2 and reading.step == 1
    # Step 1's examples booked, its deleted tokens dropped; step 2, with no number, not booked at all.
    assert reading.examples_total == 4 and reading.tokens_total == 0
    assert reading.problems == {"unread": 2}
    assert reading.duration_count == 1  # step 1 completed (its ready array is the user's, not deleted)
    assert {(e["field"], e["error"]) for e in logs} == {("tokens", "unread"), ("step", "unread")}


# -- bad figures and step numbers ---------------------------------------------------------------------------------

BAD_FIGURES: list[tuple[str, Any]] = [
    ("tokens", float("nan")),
    ("tokens", float("inf")),
    ("tokens", -5),
    ("examples", -4),
    ("model_flops", "big"),
    ("examples", True),
    ("tokens", 3 + 0j),
    ("tokens", np.array([1.0, 2.0])),
    ("tokens", np.float32("nan")),
    ("examples", jnp.float32(-1.0)),
    ("model_flops", jnp.array([1.0, 2.0])),
    ("tokens", 10**400),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIGURES, ids=[f"{f}={v!r}"[:40] for f, v in BAD_FIGURES])
def test_a_figure_that_is_not_a_finite_number_at_least_0_is_dropped_and_counted(
    make_tracker: MakeTracker, field: str, value: Any
) -> None:
    tracker = make_tracker()
    good = {"examples": 2, "tokens": 100, "model_flops": 8e6}
    with capture_logs() as logs:
        step(0, jnp.ones(2) + 1, **good)
        step(1, jnp.ones(2) + 1, **{**good, field: value})
        step(2, jnp.ones(2) + 1, **{**good, field: value})
        reading = booked(tracker, 3)
    assert reading.steps_total == 3 and reading.problems == {"invalid": 2}
    totals = {
        "examples": reading.examples_total,
        "tokens": reading.tokens_total,
        "model_flops": sum(d.model_flops_total or 0.0 for d in reading.devices),
    }
    for name, total in totals.items():  # the bad field dropped for its two steps; the others booked
        expected = good[name] * (1 if name == field else 3)
        assert total == pytest.approx(expected) and math.isfinite(total), name
    invalid = [e for e in logs if e.get("error") == "invalid"]
    assert len(invalid) == 1 and invalid[0]["field"] == field  # once per field, with what was given
    assert invalid[0]["given"] and invalid[0]["expected"] == "a finite number >= 0"


def test_a_counter_never_goes_down_or_turns_nan(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    seen = []
    for n, tokens in enumerate([10, float("nan"), -5, 10, float("-inf"), 10]):
        step(n, jnp.ones(2) + n, tokens=tokens, examples=-4 if n % 2 else 1)
        reading = booked(tracker, n + 1)
        seen.append((reading.tokens_total, reading.examples_total))
    assert seen == sorted(seen) and seen[-1] == (30, 3)
    assert all(math.isfinite(t) and math.isfinite(e) for t, e in seen)


BAD_NUMBERS: list[Any] = ["7", 3.0, 2.5, True, None, jnp.float32(3.0), np.array([3]), jnp.array([3, 4])]


@pytest.mark.parametrize("number", BAD_NUMBERS, ids=[repr(v)[:30] for v in BAD_NUMBERS])
def test_a_step_number_that_is_not_an_integer_drops_the_step_and_is_counted(
    make_tracker: MakeTracker, number: Any
) -> None:
    """A step is booked under its number: with none usable it is not booked (its time falls to the next step's
    interval, which is then counted as a jump). A float is refused even when integral (3.0): pass an int."""
    tracker = make_tracker()
    with capture_logs() as logs:
        step(0, jnp.ones(2) + 1, tokens=5)
        step(number, jnp.ones(2) + 1, tokens=5)
        step(number, jnp.ones(2) + 1, tokens=5)
        step(3, jnp.ones(2) + 1, tokens=5)
        reading = booked(tracker, 4, problems=2)
    assert reading.steps_total == 2 and reading.step == 3 and reading.dispatched_step == 3
    assert reading.problems == {"invalid": 2, "jump": 1}
    assert reading.tokens_total == 10  # the dropped steps' figures are not booked either
    invalid = [e for e in logs if e.get("error") == "invalid"]
    assert len(invalid) == 1 and invalid[0]["field"] == "step" and invalid[0]["expected"] == "an integer"


def test_integers_of_every_kind_are_step_numbers(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    numbers: list[Any] = [0, np.int32(1), np.uint64(2), jnp.int32(3), np.array(4), jnp.array(5, dtype=jnp.uint8)]
    for number in numbers:
        step(number, jnp.ones(2) + 1)
    reading = booked(tracker, len(numbers))
    assert reading.step == 5 and reading.problems == {} and reading.duration_count == 5


# -- a ready tree without arrays ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ready", ["number", "dict", "none"])
def test_a_ready_tree_without_arrays_waits_on_the_barrier(make_tracker: MakeTracker, ready: str) -> None:
    """`step(n, n)` or a dict of host floats: the steps complete when the devices are done, as without `ready`.
    Before issue 33 they "completed" when the waiter took them off the queue: in a loop that runs ahead of the
    devices, within microseconds of each other (0.2 ms for 10 steps of 20 ms)."""
    tracker = make_tracker()
    f = slow(384, 40)
    x = jnp.ones((384, 384))
    f(x).block_until_ready()
    jax.block_until_ready(tracker.ops.barrier())  # type: ignore[no-untyped-call]  # compiled (not in the loop)
    args: tuple[Any, ...] = {"number": (1,), "dict": ({"loss": 0.5, "lr": 1e-3},), "none": ()}[ready]
    for n in range(8):
        x = f(x)  # dispatched: the loop runs ahead of the device
        step(n, *args)
        time.sleep(0.005)  # the host's own work (the next batch): jaxmon's waiter gets the GIL meanwhile
    behind = time.time()
    assert not x.is_ready()  # type: ignore[attr-defined]  # the device was still on the last step at `behind`
    x.block_until_ready()
    reading = booked(tracker, 8)
    assert reading.duration_count == 7 and reading.problems == {}
    # The last step was booked complete once the device had computed it: after `behind`, not when it was queued.
    assert reading.last_step_timestamp is not None and reading.last_step_timestamp >= behind


def test_an_array_jaxmon_cannot_hold_is_named_in_the_log_not_taken_for_a_deletion(source: LocalSource) -> None:
    """hold() of an array that is not deleted but cannot be held (here a tracer, as a step() called inside a jitted
    function gives it) returns no handle, and the log says why, with the error, instead of leaving the step's
    `unready` to read as the user deleting arrays (what hid the multi-process arrays' failed clone())."""
    ops = JaxTraining(source)
    held: list[Any] = []

    def inside(x: jax.Array) -> jax.Array:
        held.append(ops.hold(x))
        return x + 1

    with capture_logs() as logs:
        jax.jit(inside)(jnp.ones(3)).block_until_ready()
    assert held == [None]
    (entry,) = [e for e in logs if "could not take its own handle" in e["event"]]
    assert "Tracer" in entry["error"] or "tracer" in entry["error"].lower(), entry
    alive = jnp.ones(3) + 1
    assert ops.hold(alive) is not None  # a plain array is held, and says nothing
