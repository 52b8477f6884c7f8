"""The allocator families: rendered for this process's devices (memory collector) and for spooled workloads'."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from jaxmon.allocator import MemoryNumbers
from jaxmon.device_readings import MemoryReading
from jaxmon.families import Spec, add, sample_name


@dataclass(frozen=True)
class MemoryMetric:
    """One exported memory series: its family, and the MemoryNumbers field it reads."""

    spec: Spec
    field: str


MEMORY_METRICS = (
    MemoryMetric(Spec("jaxmon_memory_bytes_in_use", "Bytes allocated on the device (bytes_in_use)."), "bytes_in_use"),
    MemoryMetric(
        Spec(
            "jaxmon_memory_peak_bytes_in_use",
            "Highest bytes_in_use since the allocator started (peak_bytes_in_use; never resets).",
        ),
        "peak_bytes_in_use",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_limit_bytes",
            "Bytes the allocator may use (bytes_limit: total memory x memory fraction, not free memory).",
        ),
        "limit_bytes",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_pool_bytes",
            "Bytes the allocator actually obtained from the driver (pool_bytes; BFC allocator only).",
        ),
        "pool_bytes",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_free_bytes",
            "What a new array can get: bytes_limit - bytes_in_use - bytes_reserved (the reservation is 0 or absent "
            "on GPU).",
        ),
        "free_bytes",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_largest_free_block_bytes",
            "Largest contiguous free block in the obtained pool (largest_free_block_bytes); absent where the "
            "allocator does not track free blocks.",
        ),
        "largest_free_block_bytes",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_fragmentation_ratio",
            "1 - largest_free_block / free memory in the pool (pool_bytes - bytes_in_use, or bytes_limit - "
            "bytes_in_use - bytes_reserved without a pool), in [0, 1]; 0 when nothing is free.",
        ),
        "fragmentation_ratio",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_largest_allocatable_bytes",
            "Estimated largest single allocation that can still succeed: max(largest_free_block, bytes_limit - "
            "pool_bytes - bytes_reserved) when the pool is known, else largest_free_block.",
        ),
        "largest_allocatable_bytes",
    ),
    MemoryMetric(
        Spec("jaxmon_memory_largest_alloc_bytes", "Largest single allocation seen so far (largest_alloc_size)."),
        "largest_alloc_bytes",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_allocations",
            "Allocations made since the allocator started (num_allocs).",
            counter=True,
        ),
        "allocations_total",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_reserved_bytes",
            "Bytes reserved for programs' temporaries on the allocator's stack, at the other end of memory from the "
            "arrays (bytes_reserved; TPU). Not free for new arrays. Absent where the allocator keeps no stack (GPU).",
        ),
        "reserved_bytes",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_peak_reserved_bytes",
            "Highest bytes_reserved since the allocator started (peak_bytes_reserved; never resets; TPU).",
        ),
        "peak_reserved_bytes",
    ),
    MemoryMetric(
        Spec(
            "jaxmon_memory_reservable_limit_bytes",
            "Upper limit of the stack's reservations (bytes_reservable_limit; TPU): bytes_limit less what the arrays' "
            "end of memory holds.",
        ),
        "reservable_limit_bytes",
    ),
)
STATS_SUPPORTED = Spec(
    "jaxmon_memory_stats_supported",
    "1 when the device's allocator reports memory_stats(), 0 when it returns None (e.g. CPU).",
)
READ_SUCCESS = Spec("jaxmon_memory_read_success", "1 when the last memory_stats() call succeeded, 0 when it raised.")
READ_ERRORS = Spec("jaxmon_memory_read_errors", "memory_stats() calls that raised.", counter=True)
LIVE_ARRAY_BYTES = Spec(
    "jaxmon_memory_live_array_bytes",
    "Bytes of live jax.Array shards in the device's memory in the workload process, where memory_stats() reports "
    "nothing (each array's shard counted once; host memory kinds are in jaxmon_memory_host_array_bytes).",
)
REPLICATED_ARRAY_BYTES = Spec(
    "jaxmon_memory_replicated_array_bytes",
    "Bytes of live jax.Array shards in the device's memory that belong to arrays fully replicated over more than "
    "one device, in the workload process: what a sharded layout would save.",
)
HOST_ARRAY_BYTES = Spec(
    "jaxmon_memory_host_array_bytes",
    "Bytes of live jax.Array shards in a host memory kind (pinned_host, unpinned_host) attached to the device "
    "in the workload process: offloaded state that memory_stats() does not see.",
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
    supported = STATS_SUPPORTED.new()
    read_ok = READ_SUCCESS.new()
    read_errors = READ_ERRORS.new()
    live = LIVE_ARRAY_BYTES.new()
    replicated = REPLICATED_ARRAY_BYTES.new()
    host = HOST_ARRAY_BYTES.new()
    families = {m.spec.name: m.spec.new() for m in MEMORY_METRICS}
    # The hot loop (every number of every device): bind each family's sample list and sample name once.
    targets = [
        (m.field, families[m.spec.name].samples.append, sample_name(families[m.spec.name])) for m in MEMORY_METRICS
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
