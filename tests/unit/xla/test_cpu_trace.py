"""Real traces on the 8 CPU devices of this process: a sharded step whose gradient is all-reduced, and one with no
collective, each traced for 2 steps with `jax.profiler.start_trace`/`stop_trace` and read from the `.xplane.pb`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax, shard_map
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmon.xla.classify import Known
from jaxmon.xla.hlo import parse
from jaxmon.xla.profile import Trace, read

CPUS = [("cpu", i) for i in range(8)]


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    assert jax.device_count() >= 8, "run with JAX_NUM_CPU_DEVICES=8"
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def _trace(
    tmp_path: Path, step: Callable[..., Any], *args: Any, collectives: Known | None = None
) -> tuple[Trace, int, int]:
    """Two traced steps (compiled before the trace); the trace, and the steps' start and end in Unix ns."""
    out = step(*args)
    jax.block_until_ready(out)
    jax.profiler.start_trace(str(tmp_path))
    try:
        t0 = time.time_ns()
        for _ in range(2):
            out = step(*args)
        jax.block_until_ready(out)
        t1 = time.time_ns()
    finally:
        jax.profiler.stop_trace()
    [path] = tmp_path.glob("plugins/profile/*/*.xplane.pb")
    return read(path.read_bytes(), collectives), t0, t1


def test_a_data_parallel_step_all_reduces_on_every_device(mesh: Mesh, tmp_path: Path) -> None:
    w = jax.device_put(jnp.ones((256, 256)), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P("data")))

    def grad_step(w: jax.Array, x: jax.Array) -> jax.Array:
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

    trace, t0, t1 = _trace(tmp_path, jax.jit(grad_step), w, x)
    assert "jit_grad_step" in trace.modules
    assert trace.devices == CPUS  # from each op's device_ordinal stat
    lo, hi = trace.extent_ns()
    assert lo == 0 and hi > 0
    window = (trace.trace_ns(t0), trace.trace_ns(t1))
    assert 0 <= window[0] < window[1] <= hi
    for splits in (trace.split(), trace.split(*window)):
        for device, s in splits.items():
            assert s.compute + s.collective + s.copy + s.idle == s.window > 0, device
            assert s.compute > 0, device
            assert s.collective > 0, device
            assert s.collectives.get("all-reduce", 0) >= s.collective, device
            assert set(s.collectives) == {"all-reduce"}, device


def test_a_step_without_collectives_has_no_collective_time(mesh: Mesh, tmp_path: Path) -> None:
    x = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P("data", "model")))

    def local_step(x: jax.Array) -> jax.Array:
        return jnp.tanh(x) * 2.0 + 1.0

    trace, t0, t1 = _trace(tmp_path, jax.jit(local_step), x)
    assert "jit_local_step" in trace.modules
    assert trace.devices == CPUS
    for device, s in trace.split(trace.trace_ns(t0), trace.trace_ns(t1)).items():
        assert s.compute > 0, device
        assert s.collective == 0 and s.collectives == {}, device
        assert s.compute + s.collective + s.copy + s.idle == s.window, device


def _scan_of_psums(mesh: Mesh) -> tuple[Any, jax.Array, jax.Array, Any]:
    """A shard_map psum in a scan over 3 layers, its inputs and its compiled HLO parsed."""
    ws = jax.device_put(jnp.full((3, 256, 256), 0.01), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P("data")))

    def layers(ws: jax.Array, x: jax.Array) -> jax.Array:
        out, _ = lax.scan(lambda c, w: (lax.psum(jnp.tanh(c @ w), "data"), None), x, ws)
        return out

    step = jax.jit(shard_map(layers, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"), check_vma=False))
    text = step.lower(ws, x).compile().as_text()
    assert text is not None
    return step, ws, x, parse(text)


def test_a_psum_inside_a_scan_is_collective_time_not_the_loops(mesh: Mesh, tmp_path: Path) -> None:
    """A shard_map psum in a scan over 3 layers: XLA names the all-reduce after the primitive (`psum.7`), and it
    runs inside the loop's `while` op on the same thread: the innermost op, the psum, owns its instants. The same
    split comes from naming the collectives from the compiled HLO (jaxmon.xla.hlo)."""
    step, ws, x, program = _scan_of_psums(mesh)
    named = {c.name: c.op for c in program.collectives}
    assert named and all(name.startswith("psum") for name in named)  # not "all-reduce": the primitive's name
    for collectives in (None, named):
        trace, t0, t1 = _trace(tmp_path / str(bool(collectives)), step, ws, x, collectives=collectives)
        assert trace.devices == CPUS
        for device, s in trace.split(trace.trace_ns(t0), trace.trace_ns(t1)).items():
            assert s.collective > 0 and set(s.collectives) == {"all-reduce"}, (device, s)
            assert s.compute > 0, device
            assert s.compute + s.collective + s.copy + s.idle == s.window, device


def test_each_collective_event_is_attributed_to_its_instructions_axes_link_and_bytes(
    mesh: Mesh, tmp_path: Path
) -> None:
    """The same scan of psums, its instructions placed by the analysis (jaxmon.training.links): each traced event
    counts under (all-reduce, data, local), its bytes are the events in the window times the instruction's bytes
    (the shapes: a (16 x 256) f32 block per device and layer), and the per-place exposed times are the exposed
    collective time (one program on each device: its collectives never run at once)."""
    from jaxmon.sources.local.training import module_id
    from jaxmon.training.links import DeviceTopology, place
    from jaxmon.training.trace_links import Catalog, PlacedTotals, ProgramPlaces
    from jaxmon.xla.hlo import MeshLayout

    step, ws, x, program = _scan_of_psums(mesh)
    layout = MeshLayout(mesh.axis_names, mesh.devices.shape, tuple(d.id for d in mesh.devices.flat))
    placed = place(program, layout, None, {d.id: DeviceTopology(d.id, "cpu", 0) for d in jax.devices()})
    places = {n: (*placed.places[n], placed.sizes[n]) for n in placed.places}
    assert {p[:3] for p in places.values()} == {("all-reduce", "data", "local")}
    catalog = Catalog([ProgramPlaces(program.name, module_id(step.lower(ws, x).compile()), places)])
    trace, t0, t1 = _trace(tmp_path, step, ws, x, collectives=catalog)
    block = (64 // 4) * 256 * 4
    for device, s in trace.split(trace.trace_ns(t0), trace.trace_ns(t1)).items():
        totals = PlacedTotals()
        totals.add(s, 1e-12)
        table = totals.table()
        assert set(table) == {("all-reduce", "data", "local")}, device
        seconds, exposed, moved = table[("all-reduce", "data", "local")]
        assert moved == 2 * 3 * block, device  # 2 steps x 3 layers, one psum each
        assert exposed == pytest.approx(s.collective * 1e-12), device
        assert seconds >= exposed > 0, device


def test_two_programs_with_the_same_instruction_names_are_told_apart_by_program(tmp_path: Path) -> None:
    """One function under two meshes over the same 8 devices, the second transposed, compiles to two programs named
    alike (`jit_body`) whose instructions are named alike (`psum_invariant.14`, ...) with other groups. With devices
    0-3 and 4-7 described as two processes' (a topology descriptor: plain data), "a" crosses them in the first
    program (network) and not in the second (local), "b" the other way round. Each traced event is attributed to
    its own program's place (the trace's program_id, the HloModule's id); without ids (a TPU's trace names programs
    by a fingerprint of its own) the module name cannot tell them apart: those events count under link "unknown"
    and why, never under the other program's place; a program not analysed adds no bytes."""
    from jaxmon.sources.local.training import module_id
    from jaxmon.training.links import DeviceTopology, place
    from jaxmon.training.trace_links import AMBIGUOUS, Catalog, PlacedTotals, ProgramPlaces
    from jaxmon.xla.hlo import MeshLayout

    devices = jax.devices()[:8]
    meshes = [Mesh(np.array(devices).reshape(2, 4), ("a", "b")), Mesh(np.array(devices).reshape(4, 2).T, ("a", "b"))]
    topology = {d.id: DeviceTopology(d.id, "cpu", 0 if i < 4 else 1) for i, d in enumerate(devices)}

    def body(block: jax.Array) -> jax.Array:
        a = lax.psum(block, "a")
        return lax.psum(jnp.concatenate([a, a], axis=1), "b")[:, :4] + block

    size = {"a": 8 * 4 * 4, "b": 8 * 8 * 4}  # each device's (8 x 4) f32 block; "b" sums it twice as wide
    steps, programs = [], []
    for mesh in meshes:
        x = jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, P("a", "b")))
        step = jax.jit(shard_map(body, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b")))
        compiled = step.lower(x).compile()
        text = compiled.as_text()
        assert text is not None
        program = parse(text)
        layout = MeshLayout(mesh.axis_names, mesh.devices.shape, tuple(d.id for d in mesh.devices.flat))
        placed = place(program, layout, layout.device_ids, topology)
        places = {n: (*placed.places[n], placed.sizes[n]) for n in placed.places}
        programs.append(ProgramPlaces(program.name, module_id(compiled), places))
        steps.append((step, x))
    first, second = programs
    assert first.module == second.module and set(first.places) == set(second.places)  # the names collide
    assert first.program_id is not None and second.program_id is not None and first.program_id != second.program_id
    assert sorted(p[1:3] for p in first.places.values()) == [("a", "network"), ("b", "local")]
    assert sorted(p[1:3] for p in second.places.values()) == [("a", "local"), ("b", "network")]

    def both() -> list[jax.Array]:
        return [step(x) for step, x in steps]

    def table(catalog: Catalog) -> dict[tuple[str, int], PlacedTotals]:
        trace, t0, t1 = _trace(tmp_path / str(len(list(tmp_path.iterdir()))), both, collectives=catalog)
        out = {}
        for device, s in trace.split(trace.trace_ns(t0), trace.trace_ns(t1)).items():
            out[device] = PlacedTotals()
            out[device].add(s, 1e-12)
        return out

    # by program id: 2 steps x each program's psum over each axis, each at its own program's place
    for device, totals in table(Catalog(programs)).items():
        assert totals.bytes == {
            ("all-reduce", "a", "network"): 2 * size["a"],
            ("all-reduce", "b", "local"): 2 * size["b"],
            ("all-reduce", "a", "local"): 2 * size["a"],
            ("all-reduce", "b", "network"): 2 * size["b"],
        }, device
        assert totals.unplaced == {}, device
    # without ids, by module name: the two programs disagree, so no event is placed, and each is counted
    anonymous = [ProgramPlaces(p.module, None, p.places) for p in programs]
    for device, totals in table(Catalog(anonymous)).items():
        assert set(totals.table()) == {("all-reduce", "", "unknown")} and totals.bytes == {}, device
        assert totals.unplaced == {AMBIGUOUS: 2 * 2 * 2}, device
    # only the first analysed: the second's events are no analysed program's (its id is not the first's)
    for device, totals in table(Catalog([first])).items():
        assert totals.bytes == {
            ("all-reduce", "a", "network"): 2 * size["a"],
            ("all-reduce", "b", "local"): 2 * size["b"],
        }, device
        assert ("all-reduce", "", "unknown") in totals.seconds and totals.unplaced == {}, device


def test_a_cross_device_copy_on_cpu_devices_is_no_device_event(tmp_path: Path) -> None:
    """`jax.device_put` of an array from one CPU device to another (what an operation on arrays of two devices would
    need: jax 0.10.2 refuses `x + y` of committed arrays of two devices, and moves an uncommitted one): the trace
    holds host events only (`BatchedCopyToDeviceWithSharding`, `CopyToMemorySpace`), without a device or bytes, so
    no device's copy part and no direction is claimed for it (seen on jax 0.10.2; a GPU's memcpy events carry
    both: tests/unit/xla/test_split_fakes.py)."""
    from jaxmon.training.trace_links import PlacedTotals

    devices = jax.devices()[:2]
    y = jax.device_put(jnp.ones((256, 256)), devices[0])

    def hop(y: jax.Array) -> jax.Array:
        return jax.device_put(jax.device_put(y, devices[1]), devices[0])

    trace, t0, t1 = _trace(tmp_path, hop, y)
    for device, s in trace.split(trace.trace_ns(t0), trace.trace_ns(t1)).items():
        totals = PlacedTotals()
        totals.add(s, 1e-12)
        assert s.copy == 0 and totals.copies() == {}, device


def test_a_window_edge_inside_a_run_moves_to_the_devices_own_end_of_the_step(mesh: Mesh, tmp_path: Path) -> None:
    """Steps handed back to back and each waited for. The window edges are laid inside the runs, as completions dated
    off the device's own: a little into the next step's run (a waiter that woke late: the optimizer job's windows held
    the next step's all-reduce, issue 49's CI failure) or a little before a run's end (an inferred date, or the
    host's clock a little behind the trace's: a window then held the step before whole). Each device's edges move to
    its own end of a program run: every window holds exactly its step's all-reduce and no run is cut by an edge."""
    w = jax.device_put(jnp.ones((512, 512)), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((256, 512)), NamedSharding(mesh, P("data")))

    def grad_step(w: jax.Array, x: jax.Array) -> jax.Array:
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) @ w.T))(w)

    step = jax.jit(grad_step)
    jax.block_until_ready(step(w, x))
    jax.profiler.start_trace(str(tmp_path))
    try:
        for _ in range(6):
            w = step(w, x)
            jax.block_until_ready(w)
    finally:
        jax.profiler.stop_trace()
    [path] = tmp_path.glob("plugins/profile/*/*.xplane.pb")
    trace = read(path.read_bytes())
    runs = {device: sorted(trace.runs[device]) for device in CPUS}
    assert {len(r) for r in runs.values()} == {6}, runs  # one run of the step program a step, on every device

    # Step k completes (as the host sees it) when its last device's run ends. Steps 1-4's completions are dated a
    # twentieth of that run early (inside the slowest devices' own runs) or late (inside the next runs of the devices
    # that began them first), alternately. (The 8 devices' runs of a step start milliseconds apart on 2 cores: an
    # edge far inside one device's run can be near another's start.)
    def dated(k: int) -> int:
        start, end = max((r[k] for r in runs.values()), key=lambda run: run[1])
        return (end - (end - start) // 20 if k % 2 == 0 else end + (end - start) // 20) // 1000

    windows = list(itertools.pairwise(dated(k) for k in range(1, 5)))
    moved = trace.step_windows(windows)  # steps 2, 3 and 4
    assert sorted(moved) == CPUS
    cuts = sum(r[0] < e * 1000 < r[1] for w in windows for e in w for rs in runs.values() for r in rs)
    assert cuts >= 2, cuts  # the early edges cut a run at least
    for device, device_windows in moved.items():
        edges = sorted({e for window in device_windows for e in window})
        assert all(a < b for a, b in itertools.pairwise(edges)), device
        cut = [(e, r) for e in edges for r in trace.runs[device] if r[0] < e < r[1]]
        assert not cut, (device, cut)
        for a, b in device_windows:
            s = trace.split_ps(device, a, b)
            assert s.events == {"all-reduce": 1}, (device, s.events)  # the step's all-reduce, whole, and no other
