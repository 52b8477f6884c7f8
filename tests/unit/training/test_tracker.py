"""The training tracker in this process on real JAX CPU devices: durations, FLOPs, MFU, badput, gaps, donation,
no sync added. Each number is checked against what the test measures or computes itself. The loops of seconds (a
late wake, badput blocks opened after it, pipelined and host-bound loops, unknown completions, long looks) are
tests/integration/training/test_tracker_timing.py's."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxmon
from jaxmon import training
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining, cost_numbers
from jaxmon.sources.local.workload import CompileCounters, live_array_bytes
from jaxmon.training import hand
from jaxmon.training.tracker import MAX_USER_KINDS, OTHER_KIND
from tests.unit.training.conftest import PEAK, MakeTracker, adds_up, run_delay, settled, slow_step


def test_step_durations_are_what_a_loop_timing_its_own_completions_measures(make_tracker: MakeTracker) -> None:
    """The loop syncs on each step and notes when it completed (jaxmon must not, and does not need to)."""
    tracker = make_tracker()
    f = slow_step()
    x = jnp.ones((384, 384))
    done = []
    threads = (threading.get_native_id(), tracker.waiter.thread.native_id)
    late = 0.0  # how long the loop and the waiter waited for a CPU while each saw the first and the last completion
    for n in range(12):
        x = f(x)
        jaxmon.step(n, x)
        if n == 1:  # (the loop's next call: it dates step 0 where the waiter saw it late)
            late += run_delay(*threads)
        if n in (0, 11):
            late -= run_delay(*threads)
        x.block_until_ready()
        done.append(time.monotonic())
        if n == 5:
            time.sleep(0.05)  # one longer step: its interval includes the host's pause
    reading = settled(tracker, 12)
    late += run_delay(*threads)
    assert reading.duration_count == 11 and reading.steps_total == 12 and reading.step == 11
    assert reading.dispatched_step == 11
    # Completion to completion, summed: the first and the last completion, as the loop saw them (both threads wake on
    # the same event; each observation lags it by a thread wake), within 10 ms and the time the two threads waited
    # for a CPU while they saw them (a loaded machine: beside three CPU burners the loop's own view of its first step
    # was 38 ms late once in 30 runs; a waiter kept waiting past a last step finds it done, and dates it by the
    # typical step).
    assert reading.duration_sum == pytest.approx(done[-1] - done[0], abs=0.01 + late)
    longest = max(b - a for a, b in itertools.pairwise(done))
    assert longest > 0.05
    buckets = dict(reading.duration_buckets)
    assert buckets[float("inf")] == 11 and buckets[0.01] < 11  # the long step is past 10 ms


def test_hardware_flops_are_xla_cost_analysis_per_device_per_call(make_tracker: MakeTracker) -> None:
    """One device, and eight: each call adds the compiled program's per-device FLOPs to each device it runs on."""
    tracker = make_tracker()
    single = jaxmon.track(jax.jit(lambda w, x: jnp.tanh(x @ w).sum()))
    w, x = jnp.ones((128, 64)), jnp.ones((32, 128))
    mesh = Mesh(np.array(jax.devices()), ("d",))
    batch = jax.device_put(jnp.ones((64, 128)), NamedSharding(mesh, PartitionSpec("d")))  # type: ignore[no-untyped-call]
    sharded = jaxmon.track(jax.jit(lambda w, b: (b @ w).sum()))
    for n in range(3):
        loss = single(w, x)
        other = sharded(w, batch)
        jaxmon.step(n, loss, other)
    reading = settled(tracker, 3)
    one = single.lower(w, x).compile().cost_analysis()["flops"]
    eight = sharded.lower(w, batch).compile().cost_analysis()["flops"]
    per_device = {(d.platform, d.id): d.hardware_flops_total for d in reading.devices}
    default = jax.devices()[0].id
    for device in range(8):
        expected = 3 * eight + (3 * one if device == default else 0)
        assert per_device[("cpu", device)] == pytest.approx(expected), device
    # The sharded program is the per-device count: global / 8 here (a batch-sharded matmul).
    assert eight == pytest.approx(sharded.lower(w, batch).cost_analysis()["flops"] / 8, rel=0.01)


def test_mfu_and_hfu_are_the_flops_over_the_window_time_and_the_peak(make_tracker: MakeTracker) -> None:
    tracker = make_tracker(window=100)
    f = jaxmon.track(slow_step(256, 5))
    x = jnp.ones((256, 256))
    model_flops = 8 * 1e9  # the whole job's: 1e9 per device
    for n in range(6):
        x = f(x)
        jaxmon.step(n, x, model_flops=model_flops)
    reading = settled(tracker, 6)
    cost = f.lower(x).compile().cost_analysis()["flops"]
    window = reading.duration_sum  # every step is in the window
    device = next(d for d in reading.devices if d.id == x.sharding._device.id)  # type: ignore[attr-defined]
    assert device.model_flops_total == pytest.approx(6e9)
    assert device.peak_flops == PEAK and device.peak_source == "setting"
    # The first step opens the window (no interval of its own): 5 steps of model FLOPs over their 5 durations.
    assert device.mfu == pytest.approx(5 * 1e9 / (window * PEAK))
    assert device.hfu == pytest.approx(5 * cost / (window * PEAK))
    idle = next(d for d in reading.devices if d.id != device.id)
    assert idle.hfu is None and idle.mfu == pytest.approx(device.mfu)  # model FLOPs are split over every device


def test_badput_blocks_are_charged_by_kind_and_the_time_adds_up(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    f = slow_step(256, 5)
    x = jnp.ones((256, 256))
    # The blocks as the loop times them, outside the `with` and inside it: the tracker's interval opens and closes
    # between the two (a busy machine wakes a 50 ms sleep late, and may preempt the loop between the brackets).
    outer = inner = 0.0
    for n in range(8):
        x = f(x)
        jaxmon.step(n, x)
        x.block_until_ready()  # the device is idle from here until the next step(): the data block is inside
        if n in (2, 4, 6):
            started = time.perf_counter()
            with jaxmon.badput("data"):
                opened = time.perf_counter()
                time.sleep(0.05)
                inner += time.perf_counter() - opened
            outer += time.perf_counter() - started
    reading = settled(tracker, 8)
    assert inner >= 0.15
    assert inner - 0.005 <= reading.badput_seconds_total["data"] <= outer + 0.005, (inner, outer)
    adds_up(reading, tracker)
    assert reading.badput_seconds_total["startup"] > 0


def test_badput_kinds_past_the_tenth_count_as_other_and_compile_and_checkpoint_keep_their_own(
    make_tracker: MakeTracker,
) -> None:
    tracker = make_tracker()
    f = slow_step(64, 1)
    x = jnp.ones((64, 64))
    kinds = [f"eval-{i}" for i in range(MAX_USER_KINDS + 3)]  # a kind made of data: one per evaluation
    for n, kind in enumerate(kinds):
        with jaxmon.badput(kind):
            time.sleep(0.01)
        x = f(x)  # the first call compiles: compile badput
        jaxmon.step(n, x)
        x.block_until_ready()  # the next block is in the device's idle time: charged whole
    with jaxmon.badput("checkpoint"):  # a built-in kind, after the user kinds ran out
        time.sleep(0.01)
    x = f(x)
    jaxmon.step(len(kinds), x)
    x.block_until_ready()
    reading = settled(tracker, len(kinds) + 1)
    named = set(reading.badput_seconds_total) - {"startup", "stall", "restart", "host"}
    assert named == set(kinds[:MAX_USER_KINDS]) | {OTHER_KIND, "compile", "checkpoint"}, sorted(named)
    # The three blocks past the tenth kind (10 ms each, and what the waiter's clock adds around them). A block is
    # charged from the completion the waiter saw, which a busy machine delays by a moment past the real one: a
    # block may lose that moment (seen: 29.5 ms of 30 with the other core running the other test worker).
    assert 0.025 <= reading.badput_seconds_total[OTHER_KIND] < 0.1
    assert reading.problems["badput_kinds"] == 3
    assert len(reading.badput_seconds_total) <= 18


def test_compile_badput_is_the_compilations_the_loop_timed(make_tracker: MakeTracker) -> None:
    """Each step compiles a new program, ahead of time, timed by the loop around XLA's compile alone (traced and
    lowered before the timing), while the devices are idle: compile badput is that time, less a little of each
    compile() call that is not XLA's (0.6 ms measured) and whatever a busy machine adds around it."""
    x = jnp.ones((8,)).block_until_ready()
    tracker = make_tracker()
    jaxmon.step(0, x)
    settled(tracker, 1)
    compiling = 0.0
    for n in range(1, 5):
        lowered = jax.jit(lambda v, k=n: v * (k + 2.0) + 1.0).lower(x)  # a new program each step
        started = time.perf_counter()
        compiled = lowered.compile()  # XLA's backend compile: the event jaxmon reads
        compiling += time.perf_counter() - started
        x = compiled(x)
        jaxmon.step(n, x)
        x.block_until_ready()
        settled(tracker, n + 1)  # the next compilation starts after jaxmon saw this step complete: idle time
    reading = settled(tracker, 5)
    compile_badput = reading.badput_seconds_total.get("compile", 0.0)
    assert compiling > 0.004
    assert 0.7 * compiling <= compile_badput <= compiling + 0.001, (compile_badput, compiling)


def test_orbax_blocking_checkpoint_events_count_as_checkpoint_badput(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    f = slow_step(128, 5)
    x = f(jnp.ones((128, 128)))
    jaxmon.step(0, x)
    x.block_until_ready()  # the save below is in the device's idle time
    time.sleep(0.1)  # a blocking save, as Orbax reports it: the event fires at its end with its duration
    jax.monitoring.record_event_duration_secs("/jax/checkpoint/write/async/blocking_duration_secs", 0.1)
    x = f(x)
    jaxmon.step(1, x)
    reading = settled(tracker, 2)
    assert reading.badput_seconds_total["checkpoint"] == pytest.approx(0.1, abs=0.01)


@pytest.mark.parametrize("timed", [0.05, 0.1])
def test_an_orbax_save_starts_at_its_start_event_where_that_came_before_the_time_it_reports(
    make_tracker: MakeTracker, timed: float
) -> None:
    """Orbax times a save from a moment before its start event and records the duration after a log line: the
    interval is the longer of the two, never past the save's brackets."""
    tracker = make_tracker()
    f = slow_step(128, 5)
    x = f(jnp.ones((128, 128)))
    jaxmon.step(0, x)
    x.block_until_ready()
    settled(tracker, 1)  # the save below is in the device's idle time, after jaxmon saw the step complete
    started = time.perf_counter()
    jax.monitoring.record_event("/jax/orbax/write/start")
    time.sleep(0.1)
    jax.monitoring.record_event_duration_secs("/jax/orbax/write/total_duration_secs", timed)
    measured = time.perf_counter() - started
    x = f(x)
    jaxmon.step(1, x)
    reading = settled(tracker, 2)
    assert 0.1 <= reading.badput_seconds_total["checkpoint"] <= measured + 0.001


class LateFirstLook(JaxTraining):
    """The tracker's JAX side on a loaded machine whose waiter runs its first look `late` after it began (its thread
    preempted between the look's start and its clock's read): the steps the loop handed meanwhile wait unread."""

    late = 0.06

    def __init__(self, source: LocalSource) -> None:
        super().__init__(source)
        self._looked = False

    def ready(self, handles: list[Any]) -> bool:
        if not self._looked and threading.current_thread() is not threading.main_thread():
            self._looked = True
            time.sleep(self.late)
        return super().ready(handles)


@pytest.mark.parametrize("late", [False, True])
def test_a_step_counter_that_goes_back_or_jumps_is_counted_and_its_gap_is_no_step(
    make_tracker: MakeTracker, source: LocalSource, late: bool
) -> None:
    """The loop syncs on each step and notes its completions: the restore's span (the previous completion to the
    first completion after it) is restart badput, the jump's is productive, and neither is a step duration. `late`:
    the waiter's first look reads its clock 60 ms late (a loaded machine: 67 ms was seen in the suite), after the
    steps before the restore were handed."""
    f = slow_step(128, 2)
    x = f(jnp.ones((128, 128))).block_until_ready()  # compiled before the tracker starts
    tracker = make_tracker(ops=LateFirstLook(source)) if late else make_tracker()
    numbers = [0, 1, 2, 3, 4, 2, 3, 4, 10, 11]  # restored from step 2, then ten reported as one
    done = []
    for i, n in enumerate(numbers):
        if i == 5:
            time.sleep(0.1)  # the restore: a checkpoint loading, named by no badput() block
        x = f(x)
        jaxmon.step(n, x)
        x.block_until_ready()
        done.append(time.monotonic())
    reading = settled(tracker, len(numbers))
    assert reading.problems == {"back": 1, "jump": 1}
    assert reading.duration_count == len(numbers) - 1 - 2  # no duration across either gap
    restart = done[5] - done[4]
    assert restart > 0.1
    # Each completion as the loop saw it and as the waiter did: a thread switch or two apart, more when loaded (31 ms
    # seen beside two CPU burners and the suite's other worker: the waiter saw step 4 done that late, which moves
    # that much from the restart to step 4's duration). Their sum has no such split: it is the loop's own.
    durations = sum(b - a for a, b in itertools.pairwise(done)) - restart - (done[8] - done[7])
    assert reading.badput_seconds_total["restart"] == pytest.approx(restart, abs=0.05)
    assert reading.duration_sum == pytest.approx(durations, abs=0.05)
    booked = reading.badput_seconds_total["restart"] + reading.duration_sum
    assert booked == pytest.approx(restart + durations, abs=0.025)
    assert reading.step == 11 and reading.steps_total == len(numbers)


def test_without_ready_arrays_a_barrier_on_every_device_marks_the_completion(make_tracker: MakeTracker) -> None:
    f = slow_step()
    x = f(jnp.ones((384, 384))).block_until_ready()  # compiled before the timed steps
    tracker = make_tracker()
    done = []
    for n in range(5):
        x = f(x)
        jaxmon.step(n)
        x.block_until_ready()
        done.append(time.monotonic())
    reading = settled(tracker, 5)
    assert reading.duration_count == 4
    # The waiter sees a completion within a thread switch or two of the loop (more on a loaded machine: a 14 ms
    # lag was seen there with a 10 ms tolerance).
    assert reading.duration_sum == pytest.approx(done[-1] - done[0], abs=0.025)


def test_the_host_stays_as_far_ahead_of_the_device_with_step_as_without(make_tracker: MakeTracker) -> None:
    """step() adds no sync: right after dispatching six slow steps, as few of them are done with it as without."""
    f = slow_step()
    x0 = jnp.ones((384, 384))
    f(x0).block_until_ready()

    def ready_after_dispatch(with_step: bool) -> int:
        outs, x = [], x0
        for n in range(6):
            x = f(x)
            if with_step:
                jaxmon.step(n, x)
            outs.append(x)
        ready = sum(o.is_ready() for o in outs)  # type: ignore[attr-defined]
        x.block_until_ready()
        return ready

    without = ready_after_dispatch(False)
    tracker = make_tracker()
    with_step = ready_after_dispatch(True)
    assert with_step <= without + 1 and with_step <= 2
    settled(tracker, 6)


def test_more_pending_steps_than_allowed_are_dropped_and_counted(make_tracker: MakeTracker) -> None:
    f = slow_step(384, 40)
    x = f(jnp.ones((384, 384))).block_until_ready()  # compiled: the first step runs on the device, not in the call
    tracker = make_tracker(max_pending=2)
    for n in range(5):
        x = f(x)
        jaxmon.step(n, x)  # the device is busy with the first: the third, fourth and fifth find two pending
    x.block_until_ready()
    reading = settled(tracker, 2)
    assert reading.problems.get("dropped") == 3 and reading.steps_total == 2


def test_a_tracked_function_compiles_nothing_more_than_an_untracked_one(make_tracker: MakeTracker) -> None:
    counters = CompileCounters.installed()
    start = jnp.ones((32, 32))

    def run(fn: Callable[..., Any], with_step: bool) -> float:
        before = counters.as_dict()["compilations"]
        x = start
        for n in range(4):
            x = fn(x, x)
            if with_step:
                jaxmon.step(n, x)
        x.block_until_ready()
        return counters.as_dict()["compilations"] - before

    plain = run(jax.jit(lambda a, b: jnp.tanh(a @ b)), False)
    tracker = make_tracker()
    tracked = jaxmon.track(jax.jit(lambda a, b: jnp.tanh(a @ b)))
    counted = run(tracked, True)
    reading = settled(tracker, 4)
    assert any(d.hardware_flops_total for d in reading.devices)  # the cost was read...
    assert counted == plain == 1  # ...from the program the first call compiled


def test_a_trackers_own_barrier_is_no_compilation_of_the_workloads(
    make_tracker: MakeTracker, source: LocalSource
) -> None:
    """A tracker compiles its barrier as it starts, one program per device, where the process's compile counters
    already listen (a stop() and start() in one process): jaxmon's own compilations, not the job's."""
    counters = CompileCounters.installed()
    before = counters.as_dict()["compilations"]
    make_tracker(ops=JaxTraining(source))  # of its own: its barrier a new program, compiled for each of 8 devices
    assert counters.as_dict()["compilations"] == before


def test_a_trackers_barrier_inputs_are_no_arrays_of_the_workloads(
    make_tracker: MakeTracker, source: LocalSource
) -> None:
    """The barrier's inputs, one 4-byte array a device kept from the tracker's start, are jaxmon's: the workload's
    live array bytes leave them out, as they leave out the probe's."""
    gc.collect()  # an earlier test's arrays in garbage cycles, which a collection during this one would free
    before = live_array_bytes(jax)
    make_tracker(ops=JaxTraining(source))  # of its own: its inputs are made as it starts
    assert live_array_bytes(jax) == before


def test_without_start_or_publish_step_track_and_badput_do_nothing_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(training, "_tracker", None)
    monkeypatch.setattr(hand, "_warned", False)
    hand.HAND.disarm()  # as the last tracker's stop() left it
    f = jaxmon.track(jax.jit(lambda v: v + 1))
    with pytest.warns(RuntimeWarning, match=r"jaxmon\.step\(\) does nothing before jaxmon\.start\(\)"):
        jaxmon.step(0, jnp.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise here
        jaxmon.step(1)
        with jaxmon.badput("data"):
            pass
        assert float(f(jnp.ones(2))[0]) == 2.0


@pytest.mark.parametrize(
    ("analysis", "numbers"),
    [
        ({"flops": 12.0, "bytes accessed": 40.0, "utilization0{}": 1.0}, (12.0, 40.0)),  # jax >= 0.4.38
        ([{"flops": 12.0, "bytes accessed": 40.0}], (12.0, 40.0)),  # one dict per computation, before
        ([{"flops": 1.0}, {"flops": 2.0}], (None, None)),  # several computations: no one figure
        (None, (None, None)),  # unsupported
        ({"flops": -1.0, "bytes accessed": 8}, (None, 8.0)),  # older GPU builds: -1 is missing
        ({"flops": True}, (None, None)),
        ("not a mapping", (None, None)),
    ],
)
def test_every_shape_cost_analysis_returns_is_read(analysis: Any, numbers: tuple[float | None, ...]) -> None:
    assert cost_numbers(analysis) == numbers


def test_flops_are_read_in_the_loops_own_mesh_context(make_tracker: MakeTracker) -> None:
    """A step that constrains shardings with bare PartitionSpecs lowers only inside the loop's mesh context: its
    cost is read there, on the training thread, without a compilation of its own."""
    counters = CompileCounters.installed()
    mesh = Mesh(np.array(jax.devices()), ("d",))

    def make() -> Any:
        def step(x: jax.Array) -> Any:
            spec: Any = PartitionSpec("d")  # type: ignore[no-untyped-call]  # bare: the context mesh names the devices
            constrain: Any = jax.lax.with_sharding_constraint
            y = constrain(x * 2, spec)
            return constrain(jnp.tanh(y @ y.T) / 64, spec)

        return jax.jit(step)

    x0 = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, PartitionSpec("d")))  # type: ignore[no-untyped-call]
    # The loop's mesh context: jax.set_mesh since jax 0.7.1, jax.sharding.use_mesh before (the floor, tests/floors.sh).
    set_mesh: Any = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh")  # noqa: B009 - not in new stubs

    def run(fn: Any, with_step: bool) -> tuple[jax.Array, float]:
        before = counters.as_dict()["compilations"]
        x = x0
        with set_mesh(mesh):
            for n in range(4):
                x = fn(x)
                if with_step:
                    jaxmon.step(n, x)
        return x, counters.as_dict()["compilations"] - before

    _, plain = run(make(), False)
    tracker = make_tracker()
    step = make()
    x, compiled = run(jaxmon.track(step), True)
    with set_mesh(mesh):
        truth = step.lower(x).compile().cost_analysis()["flops"]  # in the loop's own context, by the test
    reading = settled(tracker, 4)
    assert "cost" not in reading.problems
    assert compiled == plain == 1  # the loop's own compilation and no other: the cost was read from its program
    local = {(d.platform, d.id) for d in jax.local_devices()}
    flops = {(d.platform, d.id): d.hardware_flops_total for d in reading.devices}
    assert set(flops) == local and all(v == pytest.approx(4 * truth) for v in flops.values()), flops


def test_a_cost_analysis_that_raises_is_counted_once_and_the_calls_go_on(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    not_jitted = jaxmon.track(lambda v: v * 2)  # no .lower(): no cost analysis to read
    x = jnp.ones((4,))
    for n in range(3):
        x = not_jitted(x)
        jaxmon.step(n, x)
    reading = settled(tracker, 3)
    assert reading.problems["cost"] == 1 and float(x[0]) == 8.0
    assert all(d.hardware_flops_total is None for d in reading.devices)
