"""The memory collector: `memory_stats()` of this process's devices every poll, as allocator numbers.

Where the allocator reports nothing (CPU) and jaxmon runs inside the workload (embedded), live arrays are the
memory truth and are exported instead. The family table and `memory_families` also render spooled workloads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import structlog
from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, CollectorOptions, Context, Update, add, family, sample_name
from jaxmon.logsetup import ErrorLog
from jaxmon.memory import MemoryNumbers, memory_numbers
from jaxmon.model import MemoryReading
from jaxmon.snapshot import Snapshot

log = structlog.get_logger("jaxmon.collectors.memory")

DeviceKey = tuple[str, int]


@dataclass(frozen=True)
class MemoryMetric:
    """One exported memory series: its name, type, help, and the MemoryNumbers field it reads."""

    name: str
    field: str
    help: str
    counter: bool = False


MEMORY_METRICS = (
    MemoryMetric("jaxmon_memory_bytes_in_use", "bytes_in_use", "Bytes allocated on the device (bytes_in_use)."),
    MemoryMetric(
        "jaxmon_memory_peak_bytes_in_use",
        "peak_bytes_in_use",
        "Highest bytes_in_use since the allocator started (peak_bytes_in_use; never resets).",
    ),
    MemoryMetric(
        "jaxmon_memory_limit_bytes",
        "limit_bytes",
        "Bytes the allocator may use (bytes_limit: total memory x memory fraction, not free memory).",
    ),
    MemoryMetric(
        "jaxmon_memory_pool_bytes",
        "pool_bytes",
        "Bytes the allocator actually obtained from the driver (pool_bytes; BFC allocator only).",
    ),
    MemoryMetric("jaxmon_memory_free_bytes", "free_bytes", "bytes_limit - bytes_in_use."),
    MemoryMetric(
        "jaxmon_memory_largest_free_block_bytes",
        "largest_free_block_bytes",
        "Largest contiguous free block in the obtained pool (largest_free_block_bytes); absent where the "
        "allocator does not track free blocks.",
    ),
    MemoryMetric(
        "jaxmon_memory_fragmentation_ratio",
        "fragmentation_ratio",
        "1 - largest_free_block / free memory in the pool (pool_bytes - bytes_in_use, or bytes_limit - "
        "bytes_in_use without a pool), in [0, 1]; 0 when nothing is free.",
    ),
    MemoryMetric(
        "jaxmon_memory_largest_allocatable_bytes",
        "largest_allocatable_bytes",
        "Estimated largest single allocation that can still succeed: max(largest_free_block, bytes_limit - "
        "pool_bytes) when the pool is known, else largest_free_block.",
    ),
    MemoryMetric(
        "jaxmon_memory_largest_alloc_bytes",
        "largest_alloc_bytes",
        "Largest single allocation seen so far (largest_alloc_size).",
    ),
    MemoryMetric(
        "jaxmon_memory_allocations",
        "allocations_total",
        "Allocations made since the allocator started (num_allocs).",
        counter=True,
    ),
)


@dataclass(frozen=True)
class MemoryRow:
    """One device's memory to render: labels, last reading, and what else is known of it."""

    labels: dict[str, str]
    reading: MemoryReading | None
    read_errors: int | None = None
    live_array_bytes: int | None = None


def memory_families(rows: list[MemoryRow]) -> Iterator[Metric]:
    """The memory families of `rows`; a missing number is an absent series, never 0 or NaN."""
    supported = family(
        "jaxmon_memory_stats_supported",
        "1 when the device's allocator reports memory_stats(), 0 when it returns None (e.g. CPU).",
    )
    read_ok = family("jaxmon_memory_read_success", "1 when the last memory_stats() call succeeded, 0 when it raised.")
    read_errors = family("jaxmon_memory_read_errors", "memory_stats() calls that raised.", counter=True)
    live = family(
        "jaxmon_memory_live_array_bytes",
        "Bytes of live jax.Array shards on the device in the workload process, where memory_stats() reports "
        "nothing (each buffer counted once).",
    )
    families = {m.name: family(m.name, m.help, m.counter) for m in MEMORY_METRICS}
    # The hot loop (every number of every device): bind each family's sample list and sample name once.
    targets = [(m.field, families[m.name].samples.append, sample_name(families[m.name])) for m in MEMORY_METRICS]
    for r in rows:
        if r.read_errors is not None:
            add(read_errors, r.labels, float(r.read_errors))
        if r.live_array_bytes is not None:
            add(live, r.labels, float(r.live_array_bytes))
        if r.reading is None:
            continue
        add(read_ok, r.labels, 1.0 if r.reading.ok else 0.0)
        numbers: MemoryNumbers | None = r.reading.numbers
        if numbers is None:
            continue
        add(supported, r.labels, 1.0 if numbers.supported else 0.0)
        for name, append, sname in targets:
            value = getattr(numbers, name)
            if value is not None:
                append(Sample(sname, r.labels, float(value)))
    yield supported
    yield read_ok
    yield read_errors
    yield live
    yield from families.values()


@dataclass(frozen=True)
class MemoryState:
    """The last poll of every device: readings, cumulative read errors, live-array bytes (embedded only)."""

    readings: Mapping[DeviceKey, MemoryReading] = field(default_factory=dict)
    read_errors: Mapping[DeviceKey, int] = field(default_factory=dict)
    live_array_bytes: Mapping[DeviceKey, int] = field(default_factory=dict)


@register
class MemoryCollector(Collector[MemoryState]):
    """memory_stats() of every device of the source."""

    name = "memory"
    description = "memory_stats() of every device: allocator numbers, fragmentation, OOM headroom."
    order = 10

    def __init__(self, ctx: Context, options: CollectorOptions) -> None:
        super().__init__(ctx, options)
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
        in_process = self.ctx.in_process
        # Where the allocator reports nothing, live arrays are the only memory truth in this process.
        unsupported = [k for k, r in readings.items() if r.numbers is not None and not r.numbers.supported]
        if in_process is not None and unsupported:
            arrays = in_process.live_array_bytes()
            live = {key: arrays.get(key, 0) for key in unsupported}  # no arrays on a device is 0 bytes, not unknown
        state = MemoryState(readings=readings, read_errors=dict(self._read_errors), live_array_bytes=live)
        return Update(state, success=all(r.ok for r in readings.values()))

    def families(self, snap: Snapshot, state: MemoryState) -> Iterator[Metric]:
        """The memory families of this process's devices."""
        rows = [
            MemoryRow(
                labels=snap.device_labels(d),
                reading=state.readings.get(d.key),
                read_errors=state.read_errors.get(d.key, 0),
                live_array_bytes=state.live_array_bytes.get(d.key),
            )
            for d in snap.devices
        ]
        return memory_families(rows)
