"""The memory collector: `memory_stats()` of this process's devices every poll, as allocator numbers.

Where the allocator reports nothing (CPU) and jaxmon runs inside the workload (embedded), live arrays are the
memory truth and are exported instead. Embedded, the same pass over the live arrays gives every device's replicated
bytes and its host-memory bytes, which no allocator reports. The families are rendered by `jaxmon.families.memory`,
which renders spooled workloads' devices too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import structlog
from prometheus_client.core import Metric
from pydantic import Field

from jaxmon.allocator import memory_numbers
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Update
from jaxmon.device_readings import HOST_MEMORY_KINDS, DeviceKey, MemoryReading
from jaxmon.families.memory import MemoryRow, memory_families
from jaxmon.logsetup import ErrorLog
from jaxmon.settings import CollectorOptions, Enabled
from jaxmon.snapshot import Snapshot

log = structlog.get_logger("jaxmon.collectors.memory")


@dataclass(frozen=True)
class MemoryState:
    """The last poll of every device: readings, cumulative read errors, live-array bytes (embedded only: in device
    memory where the allocator reports nothing, replicated, and per host memory kind)."""

    readings: Mapping[DeviceKey, MemoryReading] = field(default_factory=dict)
    read_errors: Mapping[DeviceKey, int] = field(default_factory=dict)
    live_array_bytes: Mapping[DeviceKey, int] = field(default_factory=dict)
    replicated_array_bytes: Mapping[DeviceKey, int] = field(default_factory=dict)
    host_array_bytes: Mapping[DeviceKey, Mapping[str, int]] = field(default_factory=dict)


class MemoryOptions(CollectorOptions):
    """`--collector.memory`: on by default (it needs JAX, so a node that runs without JAX turns it off)."""

    enabled: Enabled = Field(
        default=True, description="true, false, or auto: memory_stats() of this process's devices every poll."
    )


@register
class MemoryCollector(Collector[MemoryOptions, MemoryState]):
    """memory_stats() of every device of the source."""

    name = "memory"
    description = "memory_stats() of every device: allocator numbers, fragmentation, OOM headroom."
    options = MemoryOptions
    order = 10
    needs_jax = True

    def __init__(self, opts: MemoryOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        self._errors = ErrorLog(log)  # a lost device: once a minute, not every poll
        self._read_errors: dict[DeviceKey, int] = {}

    def update(self) -> Update[MemoryState]:
        """Read every device; a raising device is recorded and the others go on."""
        readings: dict[DeviceKey, MemoryReading] = {}
        for dev in self.ctx.devices:
            try:
                stats = self.ctx.source.read_memory(dev)
                readings[dev.key] = MemoryReading(numbers=memory_numbers(stats))
                self._errors.ok(f"memory/{dev.name}", "device memory readable again", device=dev.name)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                readings[dev.key] = MemoryReading(numbers=None, error=message)
                self._read_errors[dev.key] = self._read_errors.get(dev.key, 0) + 1
                self._errors.error(f"memory/{dev.name}", "memory_stats failed", message, device=dev.name)
        live: dict[DeviceKey, int] = {}
        replicated: dict[DeviceKey, int] = {}
        host: dict[DeviceKey, dict[str, int]] = {}
        in_process = self.ctx.in_process
        if in_process is not None:
            # One pass over the live arrays, on this (the collector's) thread: no arrays on a device is 0 bytes.
            arrays = in_process.array_bytes()
            replicated = {key: arrays.replicated.get(key, 0) for key in readings}
            host = {key: {kind: arrays.host.get((key, kind), 0) for kind in HOST_MEMORY_KINDS} for key in readings}
            # Where the allocator reports nothing, live arrays are the only device memory truth in this process.
            unsupported = [k for k, r in readings.items() if r.numbers is not None and not r.numbers.supported]
            live = {key: arrays.live.get(key, 0) for key in unsupported}
        state = MemoryState(
            readings=readings,
            read_errors=dict(self._read_errors),
            live_array_bytes=live,
            replicated_array_bytes=replicated,
            host_array_bytes=host,
        )
        return Update(state, success=all(r.ok for r in readings.values()))

    def families(self, snap: Snapshot, state: MemoryState) -> Iterator[Metric]:
        """The memory families of this process's devices."""
        rows = [
            MemoryRow(
                labels=snap.device_labels(d),
                reading=state.readings.get(d.key),
                read_errors=state.read_errors.get(d.key, 0),
                live_array_bytes=state.live_array_bytes.get(d.key),
                replicated_array_bytes=state.replicated_array_bytes.get(d.key),
                host_array_bytes=state.host_array_bytes.get(d.key),
            )
            for d in snap.devices
        ]
        return memory_families(rows)
