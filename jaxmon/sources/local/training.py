"""The JAX side of the training telemetry: what a step's readiness is, a barrier, a jitted function's cost, events.

Everything the tracker (jaxmon/training) asks of JAX goes through `JaxTraining`, so the tracker itself stays plain
Python. Facts relied on (jax 0.10.2, DESIGN.md section 8): `block_until_ready()` releases the GIL and raises on a
deleted or donated buffer; programs on one device run in dispatch order (so a tiny program dispatched after a
step completes after it); `fn.lower(avals).compile()` after the first call is a cache hit (no compilation) when
the avals keep each argument's committedness, and a deleted array still has its shape, dtype and sharding.

What must never happen here is a crash on an array the user deleted, donated or reused (jaxlib's C++ on a user's
`jax.Array`, jaxlib/py_array.cc): `x.delete()` empties the array object (its IFRT array pointer becomes null) and
`x.is_ready()` then dereferences null (SIGSEGV); `x.block_until_ready()` reads that pointer *after* releasing the
GIL, so a `delete()` on the training thread meanwhile frees what it waits on; and the per-device views of
`x._arrays` are deleted (emptied) with `x`. So the waiter never touches the user's array objects: on the training
thread, in `step()` (where nothing deletes the user's arrays meanwhile: that thread is busy in `step()`), `hold()`
takes a handle of jaxmon's own, `x.clone()`: a new array object sharing the same device buffers (no copy, under a
microsecond). Nobody else has that object, so its pointer is never emptied; a delete or donation of the buffers
themselves is checked by PJRT under its own lock, and every call on the handle then raises (`BlockHostUntilReady()
called on deleted or donated buffer`, `DeviceArray has been deleted`), never crashes. `is_ready()` is called on
nothing.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

import jaxmon.sources.local.private as private
from jaxmon.device_readings import DeviceInfo
from jaxmon.logsetup import ErrorLog
from jaxmon.sources.local.devices import LocalSource
from jaxmon.sources.local.probe import _OWN_LOCK, _own
from jaxmon.sources.local.profiler import JaxProfiler
from jaxmon.threads import on_jaxmon_thread
from jaxmon.training import links
from jaxmon.training.communication import Communication, Compiled
from jaxmon.xla import hlo
from jaxmon.xla.wire import fields, signed

# Shardings whose addressability is kept (a loop has a few: emptied when full).
MAX_SHARDINGS = 64


@dataclass(frozen=True)
class Cost:
    """XLA's cost analysis of one compiled program: per device (post-SPMD), and the local devices it runs on."""

    flops: float | None
    bytes_accessed: float | None
    devices: tuple[tuple[str, int], ...]


def cost_numbers(analysis: Any) -> tuple[float | None, float | None]:
    """(flops, bytes accessed) from whatever `cost_analysis()` returned: a dict (jax >= 0.4.38), a one-element list
    of dicts (before), None (unsupported), or -1 entries (older GPU builds); None where a number is missing."""
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if len(analysis) == 1 else None
    if not isinstance(analysis, Mapping):
        return None, None

    def number(key: str) -> float | None:
        value = analysis.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None

    return number("flops"), number("bytes accessed")


class JaxTraining:
    """The tracker's view of this process's JAX."""

    def __init__(self, source: LocalSource) -> None:
        self._jax = source._jax
        jax = self._jax
        self._array = jax.Array
        # The concrete array types seen: a type's identity is read in ~50 ns, jax.Array's isinstance (its metaclass's
        # check) in ~1 us, tens of microseconds cold (after a long step's wait).
        self._array_types: set[type] = set()
        self._addressable: dict[Any, bool] = {}  # a sharding: whether its arrays are all this process's
        self._process = int(jax.process_index())
        self._local = [d for d in jax.local_devices()]
        # One cached input per device for the barrier: a program that depends on nothing but runs in order.
        self._barrier_inputs: list[Any] | None = None
        self._barrier_fn = jax.jit(lambda x: x + 1)
        # jaxlib's batched wait, which jax.block_until_ready() calls for two arrays or more, without its tree walk:
        # one C++ call that takes every array's pointer under the GIL, then waits for all with the GIL released.
        self._batched: Callable[[list[Any]], Any] = jax.block_until_ready
        try:
            from jaxlib import xla_client  # jax has no public name for it

            self._batched = xla_client.batched_block_until_ready
        except (ImportError, AttributeError):
            pass
        self._lock = threading.Lock()
        # Every device of the job as the link classification sees it (read at the first analysis); the GPUs of
        # this host pairwise, where NVML's topology was read (None: not read, their links are unknown).
        self._topology: dict[int, links.DeviceTopology] | None = None
        self._host = socket.gethostname()
        self.gpu_pairs: links.GpuPairs | None = None
        # An array step() could not take a handle on for another reason than its deletion (its step counts as
        # unready): said once an hour with what failed, so that it is not read as the user deleting arrays.
        self._hold_errors = ErrorLog(structlog.get_logger("jaxmon.training"), 3600.0)

    def devices(self) -> list[DeviceInfo]:
        """This process's devices (those a step runs on)."""
        return [
            DeviceInfo(
                id=int(d.id),
                platform=str(d.platform),
                device_kind=str(d.device_kind),
                process_index=int(d.process_index),
                num_cores=_num_cores(d),
            )
            for d in self._local
        ]

    def device_count(self) -> int:
        """Devices of the whole job (model FLOPs are split over them)."""
        return int(self._jax.device_count())

    def process_count(self) -> int:
        """Processes of the whole job (examples and tokens are split over them)."""
        return int(self._jax.process_count())

    def arrays(self, tree: Any) -> list[Any]:
        """The JAX arrays among `tree`'s leaves, as given (Python and NumPy numbers are no device's work)."""
        if type(tree) is tuple and len(tree) == 1 and self.is_array(tree[0]):
            return [tree[0]]  # step(n, loss): the usual call, without a tree walk (a few microseconds)
        return [leaf for leaf in self._jax.tree_util.tree_leaves(tree) if self.is_array(leaf)]

    def is_array(self, value: Any) -> bool:
        """Whether `value` is a JAX array (a figure or step number the waiter reads once it is computed)."""
        if type(value) in self._array_types:
            return True
        if isinstance(value, self._array):
            self._array_types.add(type(value))
            return True
        return False

    def hold(self, array: Any) -> Any | None:
        """jaxmon's own handle on `array`'s buffers, or None when it is deleted or donated already. Called on the
        training thread (step()), so nothing deletes the array between the check and the clone: `clone()` of an
        array that `delete()` emptied would crash, of a donated one returns a handle that reads as deleted."""
        try:
            if array.is_deleted():
                return None
            sharding = array.sharding
            addressable = self._addressable.get(sharding)  # (a Python property: the step's sharding's, kept)
            if addressable is None:
                if len(self._addressable) >= MAX_SHARDINGS:
                    self._addressable.clear()
                addressable = self._addressable[sharding] = bool(array.is_fully_addressable)
            if addressable:
                return array.clone()
            # A multi-process array (jax.distributed): its clone() copies to every device of its sharding and
            # fails on each process but the one holding the first device ("Cannot copy array to non-addressable
            # device"). The same array made of clones of this process's shards instead: waiting on it waits for
            # this process's part (as block_until_ready on the user's array does), and it reads as the user's would.
            shards = [shard.data.clone() for shard in array.addressable_shards]
            return self._jax.make_array_from_single_device_arrays(array.shape, array.sharding, shards)
        except Exception as exc:  # not a concrete array (a tracer), or one jaxmon cannot hold: nothing to wait for
            self._hold_errors.error(
                "hold",
                "jaxmon could not take its own handle on an array given to step() (not deleted): its step counts as "
                "unready",
                f"{type(exc).__name__}: {str(exc)[:200]}",
                array=type(array).__name__,
            )
            return None

    def barrier(self) -> list[Any]:
        """A tiny program dispatched to every local device: it completes once the work dispatched before it did."""
        with self._lock:
            if self._barrier_inputs is None:
                with _OWN_LOCK:  # jaxmon's, not the workload's live arrays (as the probe's)
                    self._barrier_inputs = [self._jax.device_put(np.int32(0), d) for d in self._local]
                    _own(*self._barrier_inputs)
            inputs = self._barrier_inputs
        return [self._barrier_fn(x) for x in inputs]

    def wait(self, handles: list[Any]) -> None:
        """Block until every one of `handles` (jaxmon's own: hold() or barrier()) is computed, in one call that
        releases the GIL once (jaxlib's batched wait); raises when one was deleted or donated, or failed."""
        if len(handles) == 1:
            handles[0].block_until_ready()  # what jax.block_until_ready does for one array, without its tree walk
        elif handles:
            self._batched(handles)

    def ready(self, handles: list[Any]) -> bool:
        """Whether every one of `handles` (jaxmon's own) is computed; raises when one was deleted or donated (PJRT
        checks, under its lock: jaxmon's handles are never emptied by a delete(), so this never crashes)."""
        return all(handle.is_ready() for handle in handles)

    def deleted(self, handle: Any) -> bool:
        """Whether the buffers of `handle` (jaxmon's own) were deleted or donated: PJRT says, under its lock."""
        return bool(handle.is_deleted())

    def value(self, handle: Any) -> Any:
        """The host value of `handle` (jaxmon's own), a NumPy array; waits for it; raises when it was deleted or
        donated (checked by PJRT, not only by the Python check in front of it)."""
        return np.asarray(handle)

    def signature(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Hashable:
        """What selects a jitted function's compiled program: the tree and each leaf's type, shape, dtype, sharding."""
        leaves, treedef = self._jax.tree_util.tree_flatten((args, dict(kwargs)))
        array, name = self._jax.Array, private.COMMITTED
        # An uncommitted array's sharding does not select the program; where committedness is not known (the
        # private name is gone: private.committed), the sharding is kept (a finer key, never a wrong one). Only
        # what lacks the name pays for the call (per step, per leaf).
        return treedef, tuple(
            (type(x), getattr(x, "shape", None), getattr(x, "dtype", None), getattr(x, "weak_type", None),
             getattr(x, "sharding", None)
             if (c := getattr(x, name, None)) or (c is None and private.committed(x, array) is None) else None)
            if hasattr(x, "shape") else x
            for x in leaves
        )  # fmt: skip

    def avals(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Abstract values of the arguments (donated ones too), committed where the argument was."""
        jax = self._jax

        def aval(x: Any) -> Any:
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                return x
            committed = private.committed(x, jax.Array)
            if committed is None:  # lowering it as uncommitted would compile anew, on the training thread
                raise private.PrivateApiMissing(f"jax.Array.{private.COMMITTED} is missing in this JAX")
            sharding = getattr(x, "sharding", None) if committed else None
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=getattr(x, "weak_type", False))

        return jax.tree.map(aval, tuple(args)), jax.tree.map(aval, dict(kwargs))

    def compiled(self, fn: Any, avals: tuple[tuple[Any, ...], dict[str, Any]]) -> Compiled:
        """The program `fn`'s call at `avals` ran (a cache hit), its cost, and what the analysis off this thread
        needs (`communication()`): the compiled object, the mesh and the program's device order. Only cheap calls
        here, on the calling thread: the lowering, the cost analysis, the shardings; never the HLO text."""
        args, kwargs = avals
        compiled = fn.lower(*args, **kwargs).compile()
        flops, nbytes = cost_numbers(compiled.cost_analysis())
        shardings = self._jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings))
        devices = sorted(
            {
                (str(d.platform), int(d.id))
                for s in shardings
                for d in getattr(s, "device_set", ())
                if int(d.process_index) == self._process
            }
        )
        mesh, assignment = self._placement(compiled, shardings)
        return Compiled(Cost(flops, nbytes, tuple(devices)), compiled, mesh, assignment)

    def _placement(self, compiled: Any, shardings: list[Any]) -> tuple[hlo.MeshLayout | None, tuple[int, ...] | None]:
        """The user's mesh the program was compiled against and the program's device assignment (ids in the order
        its HLO's flattened ids index), None where not known.

        The mesh: that of a `NamedSharding` among the program's shardings (what it was compiled against, whatever
        context it was called in), else the concrete mesh of `jax.set_mesh()` in this thread's context. The
        assignment: a NamedSharding's mesh in its own order (a program compiled with it has that assignment: checked
        with a mesh of permuted devices), else a sharding's `_device_assignment` (jax has no public name for it),
        else the executable's `local_devices()` (the assignment in a single-process job)."""
        jax = self._jax
        named = [s for s in shardings if isinstance(s, jax.sharding.NamedSharding)]
        mesh = next((s.mesh for s in named if hasattr(s.mesh, "devices")), None)
        assignment: tuple[int, ...] | None = None
        if mesh is not None:
            assignment = tuple(int(d.id) for d in mesh.devices.flat)
        else:
            context = jax.sharding.get_mesh()
            mesh = None if getattr(context, "empty", True) else context
            for s in shardings:
                devices = private.device_assignment(s, jax.sharding.Sharding)
                if devices:
                    assignment = tuple(int(d.id) for d in devices)
                    break
            else:
                try:
                    assignment = tuple(int(d.id) for d in compiled.runtime_executable().local_devices())
                except Exception:
                    assignment = None
        if mesh is None:
            return None, assignment
        layout = hlo.MeshLayout(
            tuple(str(a) for a in mesh.axis_names),
            tuple(int(n) for n in mesh.devices.shape),
            tuple(int(d.id) for d in mesh.devices.flat),
        )
        if assignment is not None and set(assignment) != set(layout.device_ids):
            return None, assignment  # a mesh of other devices than the program's: its axes say nothing of it
        return layout, assignment

    def communication(self, program: Compiled) -> Communication:
        """The collectives' bytes per execution by (op, axes) and the predicted peak memory of a program
        `compiled()` returned. The heavy part (the HLO text is megabytes for a large program, its parse linear in
        it): called on jaxmon's analysis thread, never the training thread."""
        parsed = hlo.parse(program.compiled.as_text())
        if self._topology is None:  # once, here: jax.devices() of a large job is thousands of objects
            self._topology = {int(d.id): links.describe(d, self._host, self._process) for d in self._jax.devices()}
            self.gpu_pairs = _gpu_pairs(self.devices())
        placed = links.place(parsed, program.mesh, program.assignment, self._topology, self.gpu_pairs)
        peak: int | None = None
        try:
            value = program.compiled.memory_analysis().peak_memory_in_bytes
            peak = int(value) if isinstance(value, int) and value >= 0 else None
        except Exception:  # a backend without memory analysis: bytes but no peak
            peak = None
        names = {c.name: c.op for c in parsed.collectives}
        platforms = {platform for platform, _ in program.cost.devices}
        return Communication(
            placed.collective_bytes,
            peak,
            program.cost.devices,
            names,
            placed.places,
            placed.sizes,
            placed.unknown,
            module=parsed.name,
            # CPU and GPU traces name a program by its HloModule's unique id; a TPU's by a fingerprint of its own.
            program_id=module_id(program.compiled) if platforms and platforms <= {"cpu", "gpu"} else None,
        )

    def cache_size(self, fn: Any) -> int | None:
        """How many programs `fn` holds compiled (None where the jitted function does not say)."""
        size = getattr(fn, "_cache_size", None)
        try:
            return int(size()) if callable(size) else None
        except Exception:
            return None

    def on_event_duration(self, callback: Callable[[str, float], None]) -> Callable[[], None]:
        """`callback(event, seconds)` for every jax.monitoring duration event of the workload's threads (jaxmon's
        own, the probe's compilations and the analysis', are not the workload's); returns what unregisters it."""

        def listener(event: str, duration_secs: float, **_: Any) -> None:
            if not on_jaxmon_thread():
                callback(event, float(duration_secs))

        return self._listen("event_duration_secs_listener", "event_duration_listener", listener)

    def on_event_span(self, callback: Callable[[str, float, float], None]) -> Callable[[], None]:
        """`callback(event, start, end)` (Unix seconds) for every jax.monitoring time span of the workload's threads
        (XLA's compilations: jax's dispatch records each as a span); returns what unregisters it."""

        def listener(event: str, start_time: float, end_time: float, **_: Any) -> None:
            if not on_jaxmon_thread():
                callback(event, float(start_time), float(end_time))

        return self._listen("event_time_span_listener", "event_time_span_listener", listener)

    def on_event(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """`callback(event)` for every jax.monitoring event of the workload's threads (Orbax's starts); returns what
        unregisters it."""

        def listener(event: str, **_: Any) -> None:
            if not on_jaxmon_thread():
                callback(event)

        return self._listen("event_listener", "event_listener", listener)

    def _listen(self, register: str, unregister: str, listener: Callable[..., None]) -> Callable[[], None]:
        monitoring = self._jax.monitoring
        getattr(monitoring, f"register_{register}")(listener)

        def stop() -> None:
            undo = getattr(monitoring, f"unregister_{unregister}", None)
            if undo is not None:
                undo(listener)

        return stop

    def profiler(self) -> JaxProfiler:
        """jaxmon's trace sessions (sampled traces, /debug/trace), which give way to the user's own."""
        return JaxProfiler(self._jax)


def module_id(compiled: Any) -> int | None:
    """The unique id of a compiled program's HLO module (`HloModuleProto.id`, field 5; absent: 0), what a CPU or GPU
    trace's op events carry as `program_id` (seen on CPU devices, jax 0.10.2: two programs named `jit_body`, ids 0
    and 2 in the proto and in the trace); None where jaxlib does not give the module (one module expected)."""
    try:
        modules = compiled.runtime_executable().hlo_modules()
        if len(modules) != 1:
            return None
        proto = modules[0].as_serialized_hlo_module_proto()
        found = 0
        for number, wire, value, _ in fields(proto, 0, len(proto), "HloModuleProto"):
            if number == 5 and wire == 0:
                found = signed(value)
        return found
    except Exception:
        return None


def _num_cores(device: Any) -> int | None:
    cores = getattr(device, "num_cores", None)
    return int(cores) if isinstance(cores, int) and not isinstance(cores, bool) else None


def _gpu_pairs(devices: list[DeviceInfo]) -> links.GpuPairs | None:
    """The links between this process's GPUs from NVML (jaxmon.sources.nvml.topology), read once on the analysis
    thread; None without NVML or a certain match of its GPUs to the JAX devices (their links are then unknown)."""
    if not any(d.platform == "gpu" for d in devices):
        return None
    from jaxmon.sources.nvml.topology import read_gpu_pairs

    pairs = read_gpu_pairs(devices, os.environ)
    return None if pairs is None else lambda a, b: pairs.get(frozenset((a, b)))
