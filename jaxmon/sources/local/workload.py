"""A workload process's view of itself (embedded, publisher): its live arrays, compilations and device memory."""

from __future__ import annotations

import dataclasses
import gzip
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jaxmon.births import with_zeros
from jaxmon.checkpoints import CheckpointReading
from jaxmon.device_readings import HOST_MEMORY_KINDS, ArrayBytes, DeviceKey
from jaxmon.sources import TraceDemand
from jaxmon.sources.local.devices import LocalSource
from jaxmon.sources.local.orbax_saves import listen as listen_to_checkpoints
from jaxmon.sources.local.probe import _OWN, _OWN_LOCK
from jaxmon.threads import on_jaxmon_thread
from jaxmon.training import release as release_tracker
from jaxmon.training.handed import COMPILE_EVENT
from jaxmon.training.tracker import Tracker
from jaxmon.training_readings import DeviceProfile, TrainingReading


class InProcessWorkload:
    """A workload process's view of itself: live arrays, compile counters, the training tracker."""

    def __init__(self, source: LocalSource, tracker: Tracker | None = None, badput_kinds: Iterable[str] = ()) -> None:
        self._jax = source._jax
        self._kinds = tuple(badput_kinds)  # the user's declared badput kinds (collector.training.badput_kinds)
        self.process_index = int(self._jax.process_index())
        self.process_count = int(self._jax.process_count())
        self._counters = CompileCounters.installed()
        self._checkpoints = listen_to_checkpoints()
        self._tracker = tracker
        self._devices: frozenset[tuple[str, int]] | None = None  # the tracker's devices, read on first use

    def training(self) -> TrainingReading | None:
        """The training tracker's reading with its sampled traces' (jaxmon.training.sampler), None without one.
        From start() or publish() on, before the first step too: every counter that can happen before it does is
        there at 0 (jaxmon.births.with_zeros), the declared badput kinds included, and each other kind from its
        first open."""
        tracker = self._tracker
        if tracker is None:
            return None
        reading = tracker.reading()
        if reading is None:  # no step yet: its start time, and the counters at 0
            reading = TrainingReading(start_time_seconds=tracker.start_time)
        profile = tracker.sampler.reading()
        if profile is not None:  # every device's parts at 0 before its first sample
            traced = {(p.platform, p.id) for p in profile.devices}
            unseen = sorted(self._own_devices(tracker) - traced)
            profile = dataclasses.replace(
                profile, devices=(*profile.devices, *(DeviceProfile(platform=k, id=i) for k, i in unseen))
            )
        # A kind not declared is born at 0 at its first open; its seconds count once its interval was booked.
        return with_zeros(dataclasses.replace(reading, profile=profile), (*self._kinds, *tracker.kinds()))

    def _own_devices(self, tracker: Tracker) -> frozenset[tuple[str, int]]:
        if self._devices is None:
            self._devices = frozenset(d.key for d in tracker.ops.devices())
        return self._devices

    @property
    def trace_demand(self) -> TraceDemand | None:
        """The tracker's traces on demand (jaxmon.training.sampler), None without a tracker."""
        return None if self._tracker is None else self._tracker.sampler.demand

    def settle(self, timeout: float) -> None:
        """Every step handed by now booked (the tracker's, waiting `timeout` at most): before a last document."""
        if self._tracker is not None:
            self._tracker.flush(timeout)

    def release(self) -> None:
        """The holder of this view stopped: its share of the tracker goes (jaxmon.training.release)."""
        if self._tracker is not None:
            release_tracker(self._tracker)

    def training_devices(self, within: float) -> frozenset[tuple[str, int]]:
        """This process's devices (those its steps run on: the tracker's) when a step ended within the last
        `within` seconds, else none; none without a tracker."""
        tracker = self._tracker
        if tracker is None:
            return frozenset()
        seen = tracker.last_step_seen()
        if seen is None or tracker.now() - seen >= within:
            return frozenset()
        return self._own_devices(tracker)

    def live_array_bytes(self) -> dict[tuple[str, int], int]:
        """Bytes of live arrays in device memory per device in this process."""
        return live_array_bytes(self._jax)

    def array_bytes(self) -> ArrayBytes:
        """Bytes of live arrays per device by placement (device, replicated, host memory), in one pass."""
        return array_bytes(self._jax)

    def compile_counts(self) -> dict[str, float]:
        """Compile counters since the listeners were installed."""
        return self._counters.as_dict()

    def checkpoints(self) -> CheckpointReading:
        """The process's last checkpoint (jaxmon.checkpoints)."""
        return self._checkpoints.reading()

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


def live_array_bytes(jax: Any) -> dict[DeviceKey, int]:
    """Bytes of live arrays in device memory per device in this process (`array_bytes(jax).live`)."""
    return array_bytes(jax).live


def array_bytes(jax: Any) -> ArrayBytes:
    """Bytes of live arrays per device in this process, by placement, in one pass (DESIGN.md sections 2, 13).

    Reads only metadata that stays valid on an array the training thread deletes or donates meanwhile: shape,
    dtype, sharding, `is_deleted()`. Never a buffer: `is_ready()` on a deleted array segfaults (jaxlib 0.10.2),
    `unsafe_buffer_pointer()` waits for a pending one holding the GIL, and `addressable_shards` makes a new array
    per shard. Each addressable device's shard counts on its own device (`arr.nbytes` is the global size). The
    per-shard arrays of a multi-device array (made when someone read its `addressable_shards`, cached on it) share
    its buffers: they are live arrays too, and count once, with their parent. Distinct arrays that share a buffer
    otherwise (`jax.device_put` of an array onto an equivalent sharding, both still held) count twice.
    """
    live: dict[DeviceKey, int] = {}
    replicated: dict[DeviceKey, int] = {}
    host: dict[tuple[DeviceKey, str], int] = {}
    # Bounded: a dispatch stuck on a hung device must not stop the memory poll (then a probe array may count).
    locked = _OWN_LOCK.acquire(timeout=1.0)
    try:
        arrays = jax.live_arrays()
        own = dict(_OWN)
    finally:
        if locked:
            _OWN_LOCK.release()
    # The per-shard arrays cached on their parents: plain Python attributes of the parent, no JAX call.
    children: set[int] = set()
    for arr in arrays:
        shards = getattr(arr, "__dict__", {}).get("addressable_shards")
        if shards:
            children.update(id(getattr(s, "_data", None)) for s in shards)
    plans: dict[tuple[Any, Any, Any], _Plan] = {}  # arrays share a few shardings: work each one out once
    for arr in arrays:
        if id(arr) in children:
            continue
        ref = own.get(id(arr))
        if ref is not None and ref() is arr:
            continue  # the probe's own (metrics.PROBE_MEMORY_BYTES), not the workload's
        try:
            if arr.is_deleted():
                continue  # deleted or donated: its buffers are gone
            key = (arr.sharding, arr.shape, arr.dtype)
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = _plan(*key)
        except Exception:  # an array of a kind without the metadata: not counted, never fatal
            continue
        if plan.kind is not None:
            for dev, nbytes in plan.shards:
                host[(dev, plan.kind)] = host.get((dev, plan.kind), 0) + nbytes
            continue
        for dev, nbytes in plan.shards:
            live[dev] = live.get(dev, 0) + nbytes
        if plan.replicated:
            for dev, nbytes in plan.shards:
                replicated[dev] = replicated.get(dev, 0) + nbytes
    return ArrayBytes(live=live, replicated=replicated, host=host)


@dataclass(frozen=True)
class _Plan:
    """Where the shards of arrays of one (sharding, shape, dtype) lie: (device, bytes) per addressable shard."""

    shards: tuple[tuple[DeviceKey, int], ...]
    replicated: bool  # fully replicated over more than one device
    kind: str | None  # the host memory kind, None in device memory


def _plan(sharding: Any, shape: tuple[int, ...], dtype: Any) -> _Plan:
    itemsize = int(dtype.itemsize)
    shards = []
    for dev, index in sharding.addressable_devices_indices_map(shape).items():
        shards.append(((str(dev.platform), int(dev.id)), _elements(index, shape) * itemsize))
    kind = sharding.memory_kind
    return _Plan(
        shards=tuple(shards),
        replicated=bool(sharding.is_fully_replicated) and len(sharding.device_set) > 1,
        kind=kind if kind in HOST_MEMORY_KINDS else None,
    )


def _elements(index: tuple[slice, ...] | None, shape: tuple[int, ...]) -> int:
    """The element count of the shard at `index` (a slice per leading dimension; the rest whole)."""
    slices = index or ()
    size = 1
    for dim, n in enumerate(shape):
        size *= len(range(*slices[dim].indices(n))) if dim < len(slices) else n
    return size


class CompileCounters:
    """JIT compilations, compile time and persistent-cache hits/misses, from `jax.monitoring` events.

    A miss is a compilation that looked in the persistent cache and found nothing: JAX records
    `compile_requests_use_cache` for every compilation that consults the cache and `cache_hits` for those it finds,
    so misses are the difference (requests - hits). Each is booked when its compilation ends (the
    `backend_compile_duration` event, on the same thread, after the request and the hit if any): a lookup still in
    progress is never counted as a miss, and the counter never goes down. JAX's own `cache_misses` event fires only
    when an entry is written, after the `jax_persistent_cache_min_compile_time_secs` (1 s by default) and
    `..._min_entry_size_bytes` thresholds: most misses of a small program write nothing, and counting that event
    undercounts them (jax/_src/compiler.py, compile_or_get_cached; jax/_src/compilation_cache.py,
    put_executable_and_time).

    Listeners are process-wide in JAX and cannot be scoped, so one instance is installed per process. Event
    names are looked up in the installed JAX; a version that emits fewer simply leaves those counters at 0.
    """

    COMPILE_EVENT = COMPILE_EVENT  # one name for JAX's event: the tracker's (its compile badput)
    CACHE_REQUEST_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
    CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

    _instance: CompileCounters | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.compilations = 0
        self.compile_seconds = 0.0
        self.cache_hits = 0
        self.cache_misses = 0
        self._looking = threading.local()  # this thread's compilation consulted the cache and found nothing yet

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
        if on_jaxmon_thread():
            return  # jaxmon's own cache traffic (the probe's, the analysis') is not the workload's
        if event == self.CACHE_HIT_EVENT:
            self._looking.request = False
            with self._lock:
                self.cache_hits += 1
        elif event == self.CACHE_REQUEST_EVENT:
            self._missed()  # a request whose compilation recorded no end (defensive: JAX records it on errors too)
            self._looking.request = True

    def _missed(self) -> None:
        """Book this thread's pending request, if one, as a miss."""
        if getattr(self._looking, "request", False):
            self._looking.request = False
            with self._lock:
                self.cache_misses += 1

    def _on_duration(self, event: str, duration_secs: float, **_: str | int) -> None:
        if event == self.COMPILE_EVENT:
            # The event fires on the compiling thread: jaxmon's (the probe's workers, the analysis thread) are not
            # counted.
            if on_jaxmon_thread():
                return
            self._missed()
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
