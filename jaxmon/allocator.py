"""Pure step from one `Device.memory_stats()` dict to the numbers jaxmon exports (DESIGN.md section 2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class MemoryNumbers:
    """What one device's allocator says, in exported units; None means the series is absent."""

    supported: bool
    bytes_in_use: int | None = None
    peak_bytes_in_use: int | None = None
    limit_bytes: int | None = None
    pool_bytes: int | None = None
    free_bytes: int | None = None
    largest_free_block_bytes: int | None = None
    fragmentation_ratio: float | None = None
    largest_allocatable_bytes: int | None = None
    largest_alloc_bytes: int | None = None
    allocations_total: int | None = None
    # XLA's "stack" (TPU): programs' temporaries, taken from the other end of HBM; absent where none is kept.
    reserved_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    reservable_limit_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of every field, for JSON output."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


UNSUPPORTED = MemoryNumbers(supported=False)


def _field(stats: Mapping[str, Any], key: str) -> int | None:
    """One raw field: an int >= 0, else missing (PJRT C API plugins report unset fields as -1)."""
    value = stats.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value < 0:  # NaN or -1 (unset through the PJRT C API)
        return None
    return int(value)


def memory_numbers(stats: Mapping[str, Any] | None) -> MemoryNumbers:
    """Turn a `memory_stats()` result into exported numbers; `None` means the backend has no allocator stats."""
    if stats is None:
        return UNSUPPORTED
    in_use = _field(stats, "bytes_in_use")
    limit = _field(stats, "bytes_limit")
    pool = _field(stats, "pool_bytes")
    largest_free = _field(stats, "largest_free_block_bytes")
    reservable_limit = _field(stats, "bytes_reservable_limit")
    reported_reserved = _field(stats, "bytes_reserved")
    # What programs hold on the stack is not free for a new array (TPU; GPU BFC reports 0, so nothing moves there).
    reserved = reported_reserved or 0

    free = max(limit - in_use - reserved, 0) if limit is not None and in_use is not None else None

    # Denominator of the pool-aware fragmentation: what is free inside the memory actually obtained.
    # XLA's BFCAllocator::GetFragmentation uses the same idea; the seed's (limit - in_use) reads ~1.0 on a
    # GPU that does not preallocate (DESIGN.md section 2).
    denominator: int | None = None
    # Reservations are subtracted too: a chip whose arrays and stack fill it is full, not fragmented.
    if in_use is not None:
        if pool is not None:
            denominator = pool - in_use - reserved
        elif limit is not None:
            denominator = limit - in_use - reserved

    # An allocator that does not track free blocks (cuda_async) reports 0 while memory is free.
    if largest_free == 0 and denominator is not None and denominator > 0:
        largest_free = None

    fragmentation: float | None = None
    if largest_free is not None and denominator is not None:
        if denominator <= 0:
            fragmentation = 0.0  # nothing free, nothing fragmented
        else:
            fragmentation = min(max(1.0 - largest_free / denominator, 0.0), 1.0)

    allocatable: int | None = None
    if largest_free is not None:
        allocatable = largest_free
        if pool is not None and limit is not None:
            allocatable = max(largest_free, limit - pool - reserved)

    return MemoryNumbers(
        supported=True,
        bytes_in_use=in_use,
        peak_bytes_in_use=_field(stats, "peak_bytes_in_use"),
        limit_bytes=limit,
        pool_bytes=pool,
        free_bytes=free,
        largest_free_block_bytes=largest_free,
        fragmentation_ratio=fragmentation,
        largest_allocatable_bytes=allocatable,
        largest_alloc_bytes=_field(stats, "largest_alloc_size"),
        allocations_total=_field(stats, "num_allocs"),
        **_stack(reported_reserved, _field(stats, "peak_bytes_reserved"), reservable_limit),
    )


def _stack(reserved: int | None, peak: int | None, reservable_limit: int | None) -> dict[str, int | None]:
    """The reservation fields, exported only from an allocator that keeps a stack: one reporting a reservable limit
    (TPU) or a reservation. GPU BFC dicts carry `bytes_reserved` 0 and no reservable limit: nothing is exported."""
    if reservable_limit is None and not reserved and not peak:
        return {}
    return {"reserved_bytes": reserved, "peak_reserved_bytes": peak, "reservable_limit_bytes": reservable_limit}
