"""The one module that imports JAX: local device discovery, `memory_stats()` reads and the probe kernel."""

from __future__ import annotations

import gzip
import os
import re
import threading
import weakref
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np
import structlog

from jaxmon.model import BackendStatus, DeviceInfo
from jaxmon.probe.engine import PROBE_THREAD_PREFIX

log = structlog.get_logger("jaxmon.sources.local")

# DESIGN.md section 3: a second JAX process preallocates 75 % of the GPU unless told otherwise.
PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"
FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def apply_gpu_env_defaults(environ: MutableMapping[str, str], memory_fraction: float) -> dict[str, str]:
    """Set the sidecar's non-preallocating defaults unless the user set them; returns what was set."""
    applied: dict[str, str] = {}
    if PREALLOCATE_VAR not in environ:
        environ[PREALLOCATE_VAR] = applied[PREALLOCATE_VAR] = "false"
    # Setting both names raises inside JAX, so only ever set the current one, and only if neither is set.
    if not any(name in environ for name in FRACTION_VARS):
        environ[FRACTION_VARS[0]] = applied[FRACTION_VARS[0]] = f"{memory_fraction:g}"
    return applied


# JAX registers a TPU factory even where libtpu is not installed; that is absence, not a failure.
_NOT_INSTALLED = re.compile(r"cannot open shared object file|No such file or directory|Unknown backend")
_FAILED_BACKEND = re.compile(r"Unable to initialize backend '([^']+)'")
_GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def _coords(device: Any) -> str | None:
    coords = getattr(device, "coords", None)
    if coords is None:
        return None
    try:
        return ",".join(str(int(c)) for c in coords)
    except (TypeError, ValueError):
        return None


class LocalSource:
    """Every local device of every backend JAX can start in this process."""

    name = "local"
    runs_probes = True

    def __init__(
        self,
        gpu_memory_fraction: float = 0.02,
        environ: MutableMapping[str, str] | None = None,
        sidecar_defaults: bool = True,
    ) -> None:
        env = os.environ if environ is None else environ
        # A sidecar must not preallocate the GPU; inside a workload (embedded, publisher) the trainer's own
        # settings stand and jaxmon changes nothing.
        self.applied_env = apply_gpu_env_defaults(env, gpu_memory_fraction) if sidecar_defaults else {}
        import jax  # imported here so the environment above is in place first

        self._jax = jax
        self._devices: dict[tuple[str, int], Any] = {}

    def _backends(self) -> tuple[dict[str, Any], dict[str, str]]:
        from jax._src import xla_bridge  # no public API lists backends together with their errors

        loud_error: dict[str, str] = {}
        try:
            backends = dict(xla_bridge.backends())
        except RuntimeError as exc:
            # A plugin that fails loudly aborts JAX's loop; the backends started before it stay usable.
            match = _FAILED_BACKEND.search(str(exc))
            loud_error[match.group(1) if match else "unknown"] = str(exc)
            try:
                backends = dict(xla_bridge.backends())
            except Exception as again:  # nothing at all started
                loud_error.setdefault("unknown", str(again))
                backends = {}
        errors = dict(getattr(xla_bridge, "_backend_errors", {}))
        errors.update(loud_error)
        return backends, errors

    def discover(self) -> tuple[list[DeviceInfo], list[BackendStatus]]:
        """Start every backend that can start; report the ones that cannot, and why."""
        backends, errors = self._backends()
        requested = {p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
        statuses: list[BackendStatus] = []
        devices: list[DeviceInfo] = []
        for name, backend in sorted(backends.items()):
            statuses.append(BackendStatus(name=name, up=True))
            for dev in backend.local_devices():
                info = DeviceInfo(
                    id=int(dev.id),
                    platform=str(dev.platform),
                    device_kind=str(dev.device_kind),
                    process_index=int(dev.process_index),
                    coords=_coords(dev),
                    core_on_chip=getattr(dev, "core_on_chip", None),
                )
                if info.key not in self._devices:
                    self._devices[info.key] = dev
                    devices.append(info)
        for name, message in sorted(errors.items()):
            if name in backends:
                continue
            if name not in requested and _NOT_INSTALLED.search(message):
                continue
            statuses.append(BackendStatus(name=name, up=False, error=message))
        devices.sort(key=lambda d: (d.platform, d.id))
        if self.applied_env:
            # Worth a line only where a GPU backend started: on a CPU-only host the defaults change nothing.
            gpu = any(d.platform in _GPU_PLATFORMS for d in devices)
            (log.info if gpu else log.debug)("sidecar GPU defaults set before importing JAX", **self.applied_env)
        return devices, statuses

    def read_memory(self, device: DeviceInfo) -> Mapping[str, Any] | None:
        """`memory_stats()` of one device: None when unsupported; raises what JAX raises."""
        stats: Mapping[str, Any] | None = self._devices[device.key].memory_stats()
        return stats

    def make_probe(self, device: DeviceInfo, size: int) -> JaxProbeKernel:
        """Place and compile the probe on `device` (call from the probe's own thread: it may hang)."""
        return JaxProbeKernel(self._jax, self._devices[device.key], size)


class InProcessWorkload:
    """Embedded mode's view of its own process: live arrays and compile counters."""

    def __init__(self, source: LocalSource) -> None:
        self._jax = source._jax
        self.process_index = int(self._jax.process_index())
        self._counters = CompileCounters.installed()

    def live_array_bytes(self) -> dict[tuple[str, int], int]:
        """Bytes of live arrays per device in this process."""
        return live_array_bytes(self._jax)

    def compile_counts(self) -> dict[str, float]:
        """Compile counters since the listeners were installed."""
        return self._counters.as_dict()

    @property
    def jax_version(self) -> str:
        """The running JAX's version."""
        return str(self._jax.__version__)

    def device_memory_profile(self) -> bytes:
        """The process's live device buffers as a gzipped pprof profile (`jax.profiler.device_memory_profile`)."""
        return gzipped(bytes(self._jax.profiler.device_memory_profile()))


def gzipped(profile: bytes) -> bytes:
    """`profile` gzipped, unless it already is (pprof files are gzipped; XLA's heap profile may not be)."""
    return profile if profile[:2] == b"\x1f\x8b" else gzip.compress(profile, compresslevel=6)


# The probe's own arrays, so live-array accounting leaves them out: id -> weak reference (the identity check makes
# a reused id harmless). An array is registered under _OWN_LOCK in the same step that creates it, and the
# accounting lists live arrays under the same lock, so it never sees a probe array that is not registered yet.
_OWN_LOCK = threading.Lock()
_OWN: dict[int, weakref.ref[Any]] = {}


def _own(*arrays: Any) -> None:
    """Register `arrays` as the probe's (call with _OWN_LOCK held); forget the ones gone since."""
    for key in [key for key, ref in _OWN.items() if ref() is None]:
        del _OWN[key]
    for arr in arrays:
        _OWN[id(arr)] = weakref.ref(arr)


class JaxProbeKernel:
    """A matmul chain `x = tanh(x @ w)` run `steps` times in one compiled while loop on one device."""

    def __init__(self, jax: Any, device: Any, size: int) -> None:
        jnp = jax.numpy
        lax = jax.lax
        self._jax = jax
        self._device = device
        # Inputs are made on the host and placed explicitly on this device (never computed on the implicit
        # default device, DESIGN.md section 5), so the probe adds exactly one compilation per device.
        # w ~ N(0, 1/n) keeps tanh(x @ w) away from saturation and denormals over many steps.
        rng = np.random.default_rng(0)
        x = rng.standard_normal((size, size), dtype=np.float32)
        w = (rng.standard_normal((size, size), dtype=np.float32) / np.float32(np.sqrt(size))).astype(np.float32)
        with _OWN_LOCK:
            self._x = jax.device_put(x, device)
            self._w = jax.device_put(w, device)
            _own(self._x, self._w)
        self._steps_cache: dict[int, Any] = {}

        def chain(x: Any, w: Any, steps: Any) -> Any:
            return lax.fori_loop(0, steps, lambda _, c: jnp.tanh(c @ w), x)

        with _OWN_LOCK:  # used only to lower the program, but alive meanwhile: the probe's too
            steps0 = jax.device_put(np.int32(1), device)
            _own(steps0)
        self._compiled = jax.jit(chain).lower(self._x, self._w, steps0).compile()
        cost = self._compiled.cost_analysis()
        if isinstance(cost, list):  # older jaxlib returns one dict per computation
            cost = cost[0] if cost else {}
        flops = float(cost.get("flops", 0.0)) if cost else 0.0
        # The while loop's cost analysis counts the body once: that is the FLOPs of one step.
        self.flops_per_step = flops if flops > 0 else 2.0 * size**3
        mem = self._compiled.memory_analysis()
        if mem is not None:
            self.footprint_bytes = int(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes)
        else:
            self.footprint_bytes = int(3 * size * size * 4)

    def run(self, steps: int) -> None:
        """Run the chain `steps` times and wait for the device to finish."""
        arg = self._steps_cache.get(steps)
        if arg is None:
            with _OWN_LOCK:
                arg = self._jax.device_put(np.int32(steps), self._device)
                _own(arg)
            self._steps_cache = {steps: arg}  # keep one: steps changes only at calibration
        with _OWN_LOCK:  # dispatch is asynchronous: the lock is not held while the device computes
            out = self._compiled(self._x, self._w, arg)
            _own(out)
        out.block_until_ready()
        del out  # the result is the probe's own too: never left for live_arrays() to find


def live_array_bytes(jax: Any) -> dict[tuple[str, int], int]:
    """Bytes of live arrays per device in this process (DESIGN.md section 2).

    `arr.nbytes` is the global size, so count each addressable shard on its own device, and each buffer once:
    arrays can share buffers (a replicated array's shard, views), so dedupe by (device, buffer pointer).
    """
    totals: dict[tuple[str, int], int] = {}
    seen: set[tuple[tuple[str, int], int]] = set()
    # Bounded: a dispatch stuck on a hung device must not stop the memory poll (then a probe array may count).
    locked = _OWN_LOCK.acquire(timeout=1.0)
    try:
        arrays = jax.live_arrays()
        own = dict(_OWN)
    finally:
        if locked:
            _OWN_LOCK.release()
    for arr in arrays:
        ref = own.get(id(arr))
        if ref is not None and ref() is arr:
            continue  # the probe's own (jaxmon_probe_memory_bytes), not the workload's
        try:
            shards = arr.addressable_shards
        except Exception:  # deleted between listing and reading
            continue
        for shard in shards:
            dev = shard.device
            key = (str(dev.platform), int(dev.id))
            try:
                data = shard.data
                pointer = int(data.unsafe_buffer_pointer())
                nbytes = int(data.nbytes)
            except Exception:  # deleted or donated meanwhile
                continue
            if (key, pointer) in seen:
                continue
            seen.add((key, pointer))
            totals[key] = totals.get(key, 0) + nbytes
    return totals


class CompileCounters:
    """JIT compilations, compile time and persistent-cache hits/misses, from `jax.monitoring` events.

    Listeners are process-wide in JAX and cannot be scoped, so one instance is installed per process. Event
    names are looked up in the installed JAX; a version that emits fewer simply leaves those counters at 0.
    """

    COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
    CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
    CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"

    _instance: CompileCounters | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.compilations = 0
        self.compile_seconds = 0.0
        self.cache_hits = 0
        self.cache_misses = 0

    @classmethod
    def installed(cls) -> CompileCounters:
        """The process's counters, registering the JAX listeners on first use."""
        with cls._instance_lock:
            if cls._instance is None:
                from jax import monitoring

                counters = cls()
                monitoring.register_event_listener(counters._on_event)
                monitoring.register_event_duration_secs_listener(counters._on_duration)
                cls._instance = counters
            return cls._instance

    def _on_event(self, event: str, **_: str | int) -> None:
        if threading.current_thread().name.startswith(PROBE_THREAD_PREFIX):
            return  # the probe's own cache traffic is not the workload's
        if event == self.CACHE_HIT_EVENT:
            with self._lock:
                self.cache_hits += 1
        elif event == self.CACHE_MISS_EVENT:
            with self._lock:
                self.cache_misses += 1

    def _on_duration(self, event: str, duration_secs: float, **_: str | int) -> None:
        if event == self.COMPILE_EVENT:
            # The event fires on the compiling thread: the probe compiles on its own workers, and is not counted.
            if threading.current_thread().name.startswith(PROBE_THREAD_PREFIX):
                return
            with self._lock:
                self.compilations += 1
                self.compile_seconds += float(duration_secs)

    def as_dict(self) -> dict[str, float]:
        """A consistent copy."""
        with self._lock:
            return {
                "compilations": self.compilations,
                "compile_seconds": self.compile_seconds,
                "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses,
            }
