"""Each tracked program's collectives and predicted peak memory (issue 34): read on real JAX CPU devices under a mesh of
permuted devices, analysed on jaxmon's own thread (never the training thread, and no step waits for it), counted
per step and device, the window's largest peak, and carried through the spool as the sidecar renders them."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxmon
from jaxmon.families.training import training_families
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.sources.spool_codec import spool_training, training_reading
from jaxmon.sources.spool_document import SpoolDocument
from jaxmon.training.communication import THREAD_NAME, Communication, Compiled, WindowMax
from jaxmon.training.sampler import Sampler
from jaxmon.training_readings import DeviceProfile, DeviceTraining, ProfileReading, TrainingReading
from tests.helpers import wait_until
from tests.spool_files import GOOD
from tests.unit.training.conftest import MakeTracker, booked

PERMUTED = [3, 1, 0, 2, 7, 5, 6, 4]


def P(*axes: Any) -> PartitionSpec:
    return PartitionSpec(*axes)  # type: ignore[no-untyped-call]


D, B = 256, 32


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    return Mesh(np.array(jax.devices())[PERMUTED].reshape(4, 2), ("data", "model"))


def sgd(w: jax.Array, x: jax.Array) -> jax.Array:
    """A replicated weight's gradient over a batch sharded on `data`: one all-reduce of w's bytes over `data`."""
    out: jax.Array = w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
    return out


class Watched:
    """A compiled program whose heavy calls note the thread they ran on (and may be held until released)."""

    def __init__(self, compiled: Any, calls: list[tuple[str, str]], gate: threading.Event, fail: bool) -> None:
        self._compiled, self._calls, self._gate, self._fail = compiled, calls, gate, fail

    def as_text(self) -> str:
        self._calls.append(("as_text", threading.current_thread().name))
        self._gate.wait(30)
        if self._fail:
            raise RuntimeError("no HLO text here")
        return str(self._compiled.as_text())

    def memory_analysis(self) -> Any:
        self._calls.append(("memory_analysis", threading.current_thread().name))
        return self._compiled.memory_analysis()


class WatchedTraining(JaxTraining):
    """The real JAX side, with each compiled program watched."""

    def __init__(self, source: LocalSource, fail: bool = False) -> None:
        super().__init__(source)
        self.calls: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.fail = fail

    def compiled(self, fn: Any, avals: tuple[tuple[Any, ...], dict[str, Any]]) -> Compiled:
        c = super().compiled(fn, avals)
        return Compiled(c.cost, Watched(c.compiled, self.calls, self.gate, self.fail), c.mesh, c.assignment)


def test_a_permuted_meshs_groups_map_to_its_axes_and_its_devices(source: LocalSource, mesh: Mesh) -> None:
    ops = JaxTraining(source)
    w = jax.device_put(jnp.ones((D, D)), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P("data")))
    xm = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P(None, "model")))

    def psum(a: jax.Array) -> jax.Array:
        out: jax.Array = jax.lax.psum(a, "model")  # type: ignore[no-untyped-call]
        return out

    psum_model = jax.jit(jax.shard_map(psum, mesh=mesh, in_specs=P(None, "model"), out_specs=P()))
    # nccl-tests' convention, per device: an all-reduce moves its buffer (w; a block of xm).
    cases = [
        (jax.jit(sgd), (w, x), {("all-reduce", "data", "local"): D * D * 4}),
        (psum_model, (xm,), {("all-reduce", "model", "local"): B * (D // 2) * 4}),
    ]
    for fn, args, expected in cases:
        fn(*args)
        c = ops.compiled(fn, ops.avals(args, {}))
        # The program's device order is the mesh's own, permuted, as jax's private device assignment says too.
        private = jax.tree_util.tree_leaves(c.compiled.input_shardings)[0]._device_assignment
        assert c.assignment == tuple(PERMUTED) == tuple(d.id for d in private)
        assert c.mesh is not None and c.mesh.axis_names == ("data", "model") and c.mesh.device_ids == tuple(PERMUTED)
        comm = ops.communication(c)
        assert dict(comm.collective_bytes) == expected
        assert comm.peak_memory == c.compiled.memory_analysis().peak_memory_in_bytes
        assert sorted(comm.devices) == [("cpu", i) for i in range(8)]
    # Without a mesh (a single-device program): no axes to name, and no collectives.
    single = jax.jit(lambda a: a * 2)
    a = jnp.ones(8)
    single(a)
    c = ops.compiled(single, ops.avals((a,), {}))
    assert c.mesh is None and dict(ops.communication(c).collective_bytes) == {}


def test_an_allgather_over_both_axes_names_both(source: LocalSource, mesh: Mesh) -> None:
    ops = JaxTraining(source)
    both = ("data", "model")
    x = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P(both)))
    gather = jax.jit(
        jax.shard_map(
            lambda a: jax.lax.all_gather(a, both, tiled=True),
            mesh=mesh,
            in_specs=P(both),
            out_specs=P(),
            check_vma=False,
        )
    )
    gather(x)
    comm = ops.communication(ops.compiled(gather, ops.avals((x,), {})))
    assert dict(comm.collective_bytes) == {("all-gather", "data,model", "local"): B * D * 4}  # the gathered output


def test_the_analysis_runs_off_the_training_thread_and_the_calls_before_it_count_once_it_is_done(
    source: LocalSource, mesh: Mesh, make_tracker: MakeTracker
) -> None:
    ops = WatchedTraining(source)
    tracker = make_tracker(ops=ops, window=3)
    w = jax.device_put(jnp.ones((D, D)), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P("data")))
    step = jaxmon.track(jax.jit(sgd))
    for n in range(3):  # the analysis is held: these steps complete, and add no bytes and no peak yet
        w = step(w, x)
        jaxmon.step(n, w)
    held = booked(tracker, 3)
    assert all(d.collective_bytes_total == {} and d.program_peak_memory_bytes is None for d in held.devices)
    # The waiter kicks the analysis as it books the first step that called the program: it starts soon after.
    wait_until(lambda: bool(ops.calls), what="the analysis started")
    assert ops.calls == [("as_text", THREAD_NAME)]  # the analysis thread is in it, not the training thread
    ops.gate.set()
    wait_until(lambda: tracker._analyzer.idle(), what="the analysis done")
    for n in range(3, 8):
        w = step(w, x)
        jaxmon.step(n, w)
    reading = booked(tracker, 8)
    analysis = jax.jit(sgd).lower(w, x).compile().memory_analysis()
    assert analysis is not None
    peak = analysis.peak_memory_in_bytes
    for d in reading.devices:
        # every call counts: the 3 made while the analysis was held too (one process of CPU devices: local)
        assert d.collective_bytes_total == {("all-reduce", "data", "local"): 8 * D * D * 4}, d
        assert d.program_peak_memory_bytes == peak
    assert {thread for _, thread in ops.calls} == {THREAD_NAME}
    assert [name for name, _ in ops.calls] == ["as_text", "memory_analysis"]
    assert threading.current_thread().name != THREAD_NAME


def test_the_sampled_traces_learn_each_analysed_programs_collective_instructions(
    source: LocalSource, mesh: Mesh, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker(window=3)
    sampler = tracker.sampler
    assert isinstance(sampler, Sampler)
    assert tracker._collective_names.programs() == []
    w = jax.device_put(jnp.ones((D, D)), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P("data")))
    both = ("data", "model")
    gather = jax.shard_map(
        lambda a: jax.lax.all_gather(a, both, tiled=True), mesh=mesh, in_specs=P(both), out_specs=P(), check_vma=False
    )
    xs = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P(both)))
    step, gathered = jaxmon.track(jax.jit(sgd)), jaxmon.track(jax.jit(gather))
    for n in range(2):
        w = step(w, x)
        jaxmon.step(n, (w, gathered(xs)))
    booked(tracker, 2)
    wait_until(lambda: tracker._analyzer.idle(), what="the analysis done")
    # The truth: each program's optimized HLO text, read here with a pattern of its own (name = shape opcode(...).
    expected: dict[str, str] = {}
    modules: list[str] = []
    for fn, args in ((sgd, (w, x)), (gather, (xs,))):
        text = jax.jit(fn).lower(*args).compile().as_text()
        assert text is not None
        modules += re.findall(r"^HloModule ([^\s,]+)", text, re.M)
        for name, op in re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = .*? (all-reduce|all-gather)(?:-start)?\(", text, re.M):
            expected[name] = op
    assert sorted(set(expected.values())) == ["all-gather", "all-reduce"]
    programs = tracker._collective_names.programs()
    # each program by its module's name, with the id its trace events carry (CPU: the HloModule's unique id)
    assert sorted(p.module for p in programs) == sorted(modules) and len(modules) == 2, (programs, modules)
    ids = [p.program_id for p in programs]
    assert None not in ids and len(set(ids)) == 2, ids
    places = {name: place for p in programs for name, place in p.places.items()}
    assert set(places) == set(expected)
    # each placed: its op, the mesh axes its groups span and the link (one process's CPU devices: local)
    assert set(places) == set(expected)
    assert {p[:3] for p in places.values()} == {("all-reduce", "data", "local"), ("all-gather", "data,model", "local")}
    assert {n: p[3] for n, p in places.items() if p[0] == "all-gather"} == {
        n: B * D * 4 for n, op in expected.items() if op == "all-gather"
    }


def test_a_tracker_started_again_in_the_process_knows_the_programs_analysed_before(
    source: LocalSource, mesh: Mesh, make_tracker: MakeTracker
) -> None:
    """An in-process stop() and start(): the tracked function keeps its program, analysed for the first tracker and
    never again. Its collective instructions are placed for the second tracker's sampled traces too (they read
    ("", "unknown") for every collective after a restart)."""
    w = jax.device_put(jnp.ones((D, D)), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P("data")))
    step = jaxmon.track(jax.jit(sgd))
    places: list[set[tuple[str, ...]]] = []
    for _ in range(2):
        tracker = make_tracker(window=3)
        for n in range(2):
            w = step(w, x)
            jaxmon.step(n, w)
        booked(tracker, 2)
        wait_until(lambda: tracker._analyzer.idle(), what="the analysis done")  # noqa: B023
        places.append({p[:3] for program in tracker._collective_names.programs() for p in program.places.values()})
        tracker.stop(10)
    assert places[0] == places[1] == {("all-reduce", "data", "local")}, places


def test_a_program_that_cannot_be_analysed_is_counted_and_adds_nothing(
    source: LocalSource, mesh: Mesh, make_tracker: MakeTracker
) -> None:
    ops = WatchedTraining(source, fail=True)
    ops.gate.set()
    tracker = make_tracker(ops=ops, window=3)
    w = jax.device_put(jnp.ones((D, D)), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((B, D)), NamedSharding(mesh, P("data")))
    step = jaxmon.track(jax.jit(sgd))
    w = step(w, x)
    jaxmon.step(0, w)
    wait_until(lambda: tracker._analyzer.idle(), what="the analysis done")
    for n in range(1, 4):
        w = step(w, x)
        jaxmon.step(n, w)
    reading = booked(tracker, 4)
    assert reading.problems.get("communication") == 1
    assert all(d.collective_bytes_total == {} and d.program_peak_memory_bytes is None for d in reading.devices)
    assert reading.devices[0].hardware_flops_total  # the cost, read on the calling thread, is still there


def test_the_peak_is_the_largest_of_the_windows_steps() -> None:
    peaks = WindowMax(3)
    a, b = ("cpu", 0), ("cpu", 1)
    assert peaks.maxima() == {}
    for values, expected in [
        ({a: 5.0}, {a: 5.0}),
        ({a: 9.0, b: 1.0}, {a: 9.0, b: 1.0}),
        ({a: 2.0}, {a: 9.0, b: 1.0}),
        ({a: 3.0}, {a: 9.0, b: 1.0}),  # the window holds 9, 2, 3
        ({}, {a: 3.0}),  # 9 left (and b's only value): 2, 3, nothing
        ({a: 1.0}, {a: 3.0}),
        ({}, {a: 1.0}),
        ({}, {a: 1.0}),  # the window holds 1 and two steps without
        ({}, {}),
    ]:
        peaks.step(values)
        assert peaks.maxima() == expected, (values, expected)


def _reading() -> TrainingReading:
    device = DeviceTraining(
        platform="cpu",
        id=3,
        hardware_flops_total=1e9,
        collective_bytes_total={("all-reduce", "data", "ici"): 4194304.0, ("all-gather", "", "unknown"): 12.0},
        program_peak_memory_bytes=2129920.0,
        link_bandwidth={"ici": 200e9, "dcn": 3.125e9},
    )
    profile = ProfileReading(
        results={"taken": 1},
        devices=(
            DeviceProfile(
                "cpu",
                3,
                1.0,
                {"compute": 0.5, "collective": 0.25, "copy": 0.0, "idle": 0.25},
                {"all-reduce": 0.3},
                {("all-reduce", "data", "network"): (0.3, 0.25, 8192.0)},
            ),
        ),
    )
    return TrainingReading(
        steps_total=4,
        step=3,
        start_time_seconds=1000.0,
        devices=(device, DeviceTraining("cpu", 4)),
        profile=profile,
    )


def test_the_spool_carries_collective_bytes_and_peak_memory_to_the_sidecar() -> None:
    reading = _reading()
    document = {**GOOD, "schema": "jaxmon.spool/3", "training": spool_training(reading, 1010.0).model_dump()}
    parsed = SpoolDocument.model_validate(json.loads(json.dumps(document)))  # as the sidecar reads the file
    assert parsed.training is not None
    back = training_reading(parsed.training, 1010.0)
    assert back.devices == reading.devices
    assert back.profile == reading.profile  # the sampled collectives by place too
    # The sidecar renders what the trainer would.
    here = [(m.name, s.labels, s.value) for m in training_families([({"w": "x"}, reading)]) for s in m.samples]
    there = [(m.name, s.labels, s.value) for m in training_families([({"w": "x"}, back)]) for s in m.samples]
    assert here == there
    bytes_samples = {
        (s.labels["device"], s.labels["op"], s.labels["axes"], s.labels["link"]): s.value
        for m in training_families([({"w": "x"}, back)])
        for s in m.samples
        if s.name == "jaxmon_training_collective_bytes_total"
    }
    assert bytes_samples == {("3", "all-reduce", "data", "ici"): 4194304.0, ("3", "all-gather", "", "unknown"): 12.0}
    # A document of schema 2 (no such fields) still reads, with none.
    older = {
        **GOOD,
        "schema": "jaxmon.spool/2",
        "training": {"steps_total": 1, "devices": [{"platform": "cpu", "id": 0}]},
    }
    old = SpoolDocument.model_validate(older)
    assert old.training is not None
    assert training_reading(old.training, 1.0).devices == (DeviceTraining("cpu", 0),)


def test_the_spool_refuses_a_collective_that_is_no_op_name() -> None:
    device = {"platform": "cpu", "id": 0, "collective_bytes_total": [{"op": "x\n# HELP", "axes": "", "bytes": 1.0}]}
    with pytest.raises(ValueError, match="op"):
        SpoolDocument.model_validate({**GOOD, "schema": "jaxmon.spool/3", "training": {"devices": [device]}})


def test_collective_bytes_add_per_call_and_device() -> None:
    from jaxmon.training.communication import book

    class Prog:
        def __init__(self, comm: Communication | None) -> None:
            self.communication = comm

    two = Communication({("all-reduce", "data", "ici"): 100.0}, 50, (("cpu", 0), ("cpu", 1)))
    one = Communication({("all-gather", "model", "dcn"): 7.0}, 80, (("cpu", 1),))
    totals: dict[tuple[str, int], dict[tuple[str, str, str], float]] = {}
    peaks = book([(Prog(two), 3), (Prog(one), 2), (Prog(None), 5)], totals)
    assert totals == {("cpu", 0): {("all-reduce", "data", "ici"): 300.0}, ("cpu", 1): {("all-reduce", "data", "ici"):
                      300.0, ("all-gather", "model", "dcn"): 14.0}}  # fmt: skip
    assert peaks == {("cpu", 0): 50.0, ("cpu", 1): 80.0}


def test_calls_before_the_analysis_wait_and_are_added_once_it_is_done() -> None:
    from jaxmon.training.communication import NOTHING, book

    class Prog:
        cost = object()  # a program with a cost was submitted for its analysis
        communication: Communication | None = None

    rare, failed = Prog(), Prog()
    totals: dict[tuple[str, int], dict[tuple[str, str, str], float]] = {}
    waiting: dict[int, tuple[object, int]] = {}
    book([(rare, 2), (failed, 1)], totals, waiting)  # step 1: neither is analysed; their calls wait
    book([(rare, 1)], totals, waiting)
    assert totals == {} and waiting == {id(rare): (rare, 3), id(failed): (failed, 1)}
    rare.communication = Communication({("all-reduce", "data", "local"): 10.0}, 5, (("cpu", 0),))
    failed.communication = NOTHING
    peaks = book([], totals, waiting)  # a step that calls neither: the waiting calls are booked all the same
    assert totals == {("cpu", 0): {("all-reduce", "data", "local"): 30.0}} and waiting == {} and peaks == {}
    book([(rare, 1)], totals, waiting)
    assert totals == {("cpu", 0): {("all-reduce", "data", "local"): 40.0}}
    # a program without a cost was never submitted: its calls do not wait for an analysis that never comes
    nocost = Prog()
    nocost.cost = None
    book([(nocost, 1)], totals, waiting)
    assert waiting == {}


def test_the_pairs_per_device_are_bounded() -> None:
    from jaxmon.training.communication import MAX_PAIRS, book

    class Prog:
        communication = Communication(
            {("all-reduce", f"axis{i}", "local"): 1.0 for i in range(MAX_PAIRS + 5)}, None, (("cpu", 0),)
        )

    totals: dict[tuple[str, int], dict[tuple[str, str, str], float]] = {}
    book([(Prog(), 1)], totals)
    book([(Prog(), 1)], totals)
    assert len(totals[("cpu", 0)]) == MAX_PAIRS and set(totals[("cpu", 0)].values()) == {2.0}
