"""The JAX side of the training telemetry: what a step's readiness is, a barrier, a jitted function's cost, events.

Everything the tracker (jaxmon/training) asks of JAX goes through `JaxTraining`, so the tracker itself stays plain
Python. Facts relied on (jax 0.10.2, DESIGN.md section 8): `block_until_ready()` releases the GIL and raises on a
deleted or donated buffer; programs on one device run in dispatch order (so a tiny program dispatched after a
step completes after it); `fn.lower(avals).compile()` after the first call is a cache hit (no compilation) when
the avals keep each argument's committedness, and a deleted array still has its shape, dtype and sharding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxmon.model import DeviceInfo
from jaxmon.probe.engine import PROBE_THREAD_PREFIX
from jaxmon.sources.local.devices import LocalSource
from jaxmon.sources.local.profiler import JaxProfiler


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
        self._process = int(jax.process_index())
        self._local = [d for d in jax.local_devices()]
        # One cached input per device for the barrier: a program that depends on nothing but runs in order.
        self._barrier_inputs: list[Any] | None = None
        self._barrier_fn = jax.jit(lambda x: x + 1)
        self._lock = threading.Lock()

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

    def leaves(self, tree: Any) -> list[Any]:
        """The JAX arrays among `tree`'s leaves (Python numbers and the like are ready by definition)."""
        return [leaf for leaf in self._jax.tree_util.tree_leaves(tree) if hasattr(leaf, "block_until_ready")]

    def barrier(self) -> list[Any]:
        """A tiny program dispatched to every local device: it completes once the work dispatched before it did."""
        with self._lock:
            if self._barrier_inputs is None:
                self._barrier_inputs = [self._jax.device_put(np.int32(0), d) for d in self._local]
            inputs = self._barrier_inputs
        return [self._barrier_fn(x) for x in inputs]

    def wait(self, array: Any) -> None:
        """Block until `array` is computed (raises when it was deleted or donated)."""
        array.block_until_ready()

    def is_ready(self, array: Any) -> bool:
        """Whether `array` is computed, without blocking (False where it cannot say: a deleted buffer, which
        `wait` then reports)."""
        try:
            return bool(array.is_ready())
        except Exception:
            return False

    def signature(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Hashable:
        """What selects a jitted function's compiled program: the tree and each leaf's type, shape, dtype, sharding."""
        leaves, treedef = self._jax.tree_util.tree_flatten((args, dict(kwargs)))
        return treedef, tuple(
            (type(x), getattr(x, "shape", None), getattr(x, "dtype", None), getattr(x, "weak_type", None),
             getattr(x, "sharding", None) if getattr(x, "_committed", False) else None)
            if hasattr(x, "shape") else x
            for x in leaves
        )  # fmt: skip

    def avals(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Abstract values of the arguments (donated ones too), committed where the argument was."""
        jax = self._jax

        def aval(x: Any) -> Any:
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                return x
            committed = getattr(x, "_committed", False)
            sharding = getattr(x, "sharding", None) if committed else None
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=getattr(x, "weak_type", False))

        return jax.tree.map(aval, tuple(args)), jax.tree.map(aval, dict(kwargs))

    def cost(self, fn: Any, avals: tuple[tuple[Any, ...], dict[str, Any]]) -> Cost:
        """The per-device cost of `fn` at `avals` (the program its first call compiled: a cache hit here). Called on
        the thread that called `fn`, so it lowers in that thread's contexts (mesh, sharding rules)."""
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
        return Cost(flops, nbytes, tuple(devices))

    def cache_size(self, fn: Any) -> int | None:
        """How many programs `fn` holds compiled (None where the jitted function does not say)."""
        size = getattr(fn, "_cache_size", None)
        try:
            return int(size()) if callable(size) else None
        except Exception:
            return None

    def on_event_duration(self, callback: Callable[[str, float], None]) -> Callable[[], None]:
        """`callback(event, seconds)` for every jax.monitoring duration event of this process's own threads (the
        probe's compilations are jaxmon's, not the workload's); returns what unregisters it."""
        monitoring = self._jax.monitoring

        def listener(event: str, duration_secs: float, **_: Any) -> None:
            if not threading.current_thread().name.startswith(PROBE_THREAD_PREFIX):
                callback(event, float(duration_secs))

        monitoring.register_event_duration_secs_listener(listener)

        def unregister() -> None:
            unregister_listener = getattr(monitoring, "unregister_event_duration_listener", None)
            if unregister_listener is not None:
                unregister_listener(listener)

        return unregister

    def profiler(self) -> JaxProfiler:
        """jaxmon's trace sessions (sampled traces, /debug/trace), which give way to the user's own."""
        return JaxProfiler(self._jax)


def _num_cores(device: Any) -> int | None:
    cores = getattr(device, "num_cores", None)
    return int(cores) if isinstance(cores, int) and not isinstance(cores, bool) else None
