"""The allocator families: rendered for this process's devices (memory collector) and for spooled workloads'."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from jaxmon.allocator import MemoryNumbers
from jaxmon.catalog import metrics
from jaxmon.catalog.metrics import Family
from jaxmon.device_readings import MemoryReading
from jaxmon.families import add, sample_name


@dataclass(frozen=True)
class MemoryMetric:
    """One exported memory series: its family, and the MemoryNumbers field it reads."""

    family: Family
    field: str


MEMORY_METRICS = (
    MemoryMetric(metrics.MEMORY_BYTES_IN_USE, "bytes_in_use"),
    MemoryMetric(metrics.MEMORY_PEAK_BYTES_IN_USE, "peak_bytes_in_use"),
    MemoryMetric(metrics.MEMORY_LIMIT_BYTES, "limit_bytes"),
    MemoryMetric(metrics.MEMORY_POOL_BYTES, "pool_bytes"),
    MemoryMetric(metrics.MEMORY_FREE_BYTES, "free_bytes"),
    MemoryMetric(metrics.MEMORY_LARGEST_FREE_BLOCK_BYTES, "largest_free_block_bytes"),
    MemoryMetric(metrics.MEMORY_FRAGMENTATION_RATIO, "fragmentation_ratio"),
    MemoryMetric(metrics.MEMORY_LARGEST_ALLOCATABLE_BYTES, "largest_allocatable_bytes"),
    MemoryMetric(metrics.MEMORY_LARGEST_ALLOC_BYTES, "largest_alloc_bytes"),
    MemoryMetric(metrics.MEMORY_ALLOCATIONS, "allocations_total"),
    MemoryMetric(metrics.MEMORY_RESERVED_BYTES, "reserved_bytes"),
    MemoryMetric(metrics.MEMORY_PEAK_RESERVED_BYTES, "peak_reserved_bytes"),
    MemoryMetric(metrics.MEMORY_RESERVABLE_LIMIT_BYTES, "reservable_limit_bytes"),
)


@dataclass(frozen=True)
class MemoryRow:
    """One device's memory to render: labels, last reading, and what else is known of it."""

    labels: dict[str, str]
    reading: MemoryReading | None
    read_errors: int | None = None
    live_array_bytes: int | None = None
    replicated_array_bytes: int | None = None
    host_array_bytes: Mapping[str, int] | None = None  # bytes per host memory kind


def memory_families(rows: list[MemoryRow]) -> Iterator[Metric]:
    """The memory families of `rows`; a missing number is an absent series, never 0 or NaN."""
    supported = metrics.MEMORY_STATS_SUPPORTED.new()
    read_ok = metrics.MEMORY_READ_SUCCESS.new()
    read_errors = metrics.MEMORY_READ_ERRORS.new()
    live = metrics.MEMORY_LIVE_ARRAY_BYTES.new()
    replicated = metrics.MEMORY_REPLICATED_ARRAY_BYTES.new()
    host = metrics.MEMORY_HOST_ARRAY_BYTES.new()
    families = {m.family.name: m.family.new() for m in MEMORY_METRICS}
    # The hot loop (every number of every device): bind each family's sample list and sample name once.
    targets = [
        (m.field, families[m.family.name].samples.append, sample_name(families[m.family.name])) for m in MEMORY_METRICS
    ]
    for r in rows:
        if r.read_errors is not None:
            add(read_errors, r.labels, float(r.read_errors))
        if r.live_array_bytes is not None:
            add(live, r.labels, float(r.live_array_bytes))
        if r.replicated_array_bytes is not None:
            add(replicated, r.labels, float(r.replicated_array_bytes))
        for kind, nbytes in (r.host_array_bytes or {}).items():
            add(host, {**r.labels, "memory_kind": kind}, float(nbytes))
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
    yield replicated
    yield host
    yield from families.values()
