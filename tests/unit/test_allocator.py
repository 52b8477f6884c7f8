"""The pure stats -> numbers step, on one recorded dict per allocator shape (tests/fixtures/README.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jaxmon.allocator import MemoryNumbers, memory_numbers
from tests.helpers import FIXTURES

GiB = 1 << 30
MiB = 1 << 20
SHAPES = {(d["platform"], d["id"]): d for d in json.loads((FIXTURES / "shapes.json").read_text())["devices"]}


def stats(platform: str, device: int) -> Any:
    return SHAPES[(platform, device)]["memory_stats"]


def test_bfc_preallocated_uses_the_pool_as_denominator() -> None:
    n = memory_numbers(stats("gpu", 0))
    assert n == MemoryNumbers(
        supported=True,
        bytes_in_use=20 * GiB,
        peak_bytes_in_use=25 * GiB,
        limit_bytes=60 * GiB,
        pool_bytes=60 * GiB,
        free_bytes=60 * GiB - 20 * GiB,
        largest_free_block_bytes=30 * GiB,
        fragmentation_ratio=1 - 30 / (60 - 20),  # 0.25
        largest_allocatable_bytes=30 * GiB,  # the pool is the whole limit: only the free block counts
        largest_alloc_bytes=4 * GiB,
        allocations_total=1500,
    )


def test_bfc_growing_pool_is_not_reported_as_fully_fragmented() -> None:
    n = memory_numbers(stats("gpu", 1))
    # Free inside the obtained pool: 2 GiB - 1.5 GiB = 512 MiB, of which one 256 MiB block: half fragmented.
    assert n.fragmentation_ratio == pytest.approx(1 - 256 / 512)
    # The seed's formula, 1 - 256 MiB / (60 GiB - 1.5 GiB), would read 0.9957: a fresh process looks ruined.
    assert n.fragmentation_ratio is not None and n.fragmentation_ratio < 0.9
    assert n.free_bytes == 60 * GiB - 1536 * MiB
    # The allocator can still grow the pool by limit - pool = 58 GiB, more than the 256 MiB free block.
    assert n.largest_allocatable_bytes == 58 * GiB
    assert n.pool_bytes == 2 * GiB


def test_cuda_async_has_no_fragmentation_or_headroom() -> None:
    n = memory_numbers(stats("gpu", 2))
    assert n.largest_free_block_bytes is None  # reported as 0 while 50 GiB are free: not tracked
    assert n.fragmentation_ratio is None
    assert n.largest_allocatable_bytes is None
    assert n.pool_bytes is None
    assert n.free_bytes == 50 * GiB
    assert n.bytes_in_use == 10 * GiB


def test_tpu_without_pool_uses_the_limit_as_denominator() -> None:
    n = memory_numbers(stats("tpu", 3))
    assert n.limit_bytes == 16 * GiB
    assert n.pool_bytes is None
    assert n.free_bytes == 12 * GiB
    assert n.fragmentation_ratio == pytest.approx(1 - 9 / 12)
    assert n.largest_allocatable_bytes == 9 * GiB


def test_minus_one_fields_from_a_pjrt_plugin_are_missing_not_zero() -> None:
    n = memory_numbers(stats("gpu", 4))
    assert n == MemoryNumbers(
        supported=True,
        bytes_in_use=1 * GiB,
        peak_bytes_in_use=2 * GiB,
        allocations_total=10,
    )


def test_none_means_unsupported_with_no_numbers() -> None:
    n = memory_numbers(stats("cpu", 5))
    assert n == MemoryNumbers(supported=False)
    assert all(v is None for k, v in n.as_dict().items() if k != "supported")


def test_full_pool_is_zero_free_zero_fragmented_zero_allocatable() -> None:
    n = memory_numbers(stats("gpu", 7))
    assert n.free_bytes == 0
    assert n.fragmentation_ratio == 0.0
    assert n.largest_allocatable_bytes == 0
    assert n.largest_free_block_bytes == 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"bytes_in_use": 5, "bytes_limit": 10, "largest_free_block_bytes": 9},
            0.0,
        ),  # more than free: clamp to 0
        ({"bytes_in_use": 5, "bytes_limit": 10, "largest_free_block_bytes": 1}, 0.8),
        (
            {"bytes_in_use": 12, "bytes_limit": 10, "largest_free_block_bytes": 0},
            0.0,
        ),  # over the limit: d < 0
    ],
)
def test_fragmentation_is_clamped_to_the_unit_interval(raw: dict[str, int], expected: float) -> None:
    assert memory_numbers(raw).fragmentation_ratio == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["12", True, None, float("nan"), -5, [1]])
def test_values_that_are_not_counts_are_missing(bad: object) -> None:
    n = memory_numbers({"bytes_in_use": bad, "bytes_limit": 100})
    assert n.bytes_in_use is None
    assert n.free_bytes is None
    assert n.limit_bytes == 100


def test_missing_largest_free_block_leaves_fragmentation_absent() -> None:
    n = memory_numbers({"bytes_in_use": 1, "bytes_limit": 10, "pool_bytes": 5})
    assert n.fragmentation_ratio is None
    assert n.largest_allocatable_bytes is None
    assert n.free_bytes == 9


# --------------------------------------------------------------------------------------------------------------
# Reserved HBM (TPU): tests/fixtures/tpu_reserved.json, real v5e dicts and worked shapes with reservations
# --------------------------------------------------------------------------------------------------------------

RESERVED = {(d["platform"], d["id"]): d for d in json.loads((FIXTURES / "tpu_reserved.json").read_text())["devices"]}


def reserved_stats(device: int) -> Any:
    return RESERVED[("tpu", device)]["memory_stats"]


def test_real_v5e_free_memory_leaves_the_reservation_out() -> None:
    """The v5e chip after steps of a program with 335,802,368 B of temporaries: XLA reserved 335,675,392 B on the
    stack. What a new array can get is the limit less the arrays and the reservation."""
    raw = reserved_stats(0)
    n = memory_numbers(raw)
    assert n.free_bytes == 16_909_336_064 - 209_443_328 - 335_675_392 == 16_364_217_344
    # The dict's own truth: one free block between the arrays' end and the stack's, the reservable limit's span.
    assert raw["largest_free_block_bytes"] == raw["bytes_reservable_limit"] - raw["bytes_reserved"]
    assert n.largest_free_block_bytes == 16_338_099_712
    # Not fragmented: the one block is all but 26 MB (the arrays' end is 235,560,960 B high, in use 209,443,328).
    assert n.fragmentation_ratio == pytest.approx(1 - 16_338_099_712 / 16_364_217_344)
    assert n.fragmentation_ratio is not None and n.fragmentation_ratio < 0.002
    assert (n.reserved_bytes, n.peak_reserved_bytes, n.reservable_limit_bytes) == (
        335_675_392,
        335_675_392,
        16_673_775_104,
    )
    assert n.largest_allocatable_bytes == 16_338_099_712  # no pool: the largest free block


def test_real_v5e_with_holes_reads_the_holes_against_free_memory() -> None:
    """The same chip after eight 64 MiB arrays were made and every other one freed: four holes below the arrays'
    end that the largest block (between the ends) does not include."""
    n = memory_numbers(reserved_stats(1))
    free = 16_909_336_064 - 508_051_456 - 335_675_392
    assert n.free_bytes == free
    assert n.fragmentation_ratio == pytest.approx(1 - 15_786_548_736 / free)  # 0.0174
    holes = free - 15_786_548_736
    assert holes == 279_060_480  # the four freed 64 MiB arrays (268,435,456 B) and the arrays' slack


def test_a_large_reservation_is_not_free_and_not_fragmentation() -> None:
    """The published run: 27.25 GiB reserved of a 31.25 GiB limit, 2.65 GiB in use, 1.35 GiB free in one block.
    The seed read 28.6 GiB free and 0.95 fragmented."""
    n = memory_numbers(reserved_stats(2))
    assert n.free_bytes == (31996 - 2712 - 27905) * MiB == n.largest_free_block_bytes  # 1.35 GiB
    assert n.fragmentation_ratio == 0.0
    assert n.reserved_bytes == 27905 * MiB
    seed_free = (31996 - 2712) * MiB
    assert 1 - 1379 / (seed_free / MiB) == pytest.approx(0.953, abs=1e-3)  # what the seed's formula read


def test_a_full_chip_is_full_not_fragmented() -> None:
    """16 GB limit, 13 GB in use, 2.5 GB reserved, 0.5 GB free in one block (the seed: 3 GB free, 0.83)."""
    n = memory_numbers(reserved_stats(3))
    assert n.free_bytes == 500_000_000
    assert n.fragmentation_ratio == 0.0
    assert n.largest_allocatable_bytes == 500_000_000


def test_a_fragmented_chip_with_reservations_is_fragmented() -> None:
    """16 GB limit, 13 GB in use, 1.5 GB reserved: 1.5 GB free, its largest block 0.3 GB."""
    n = memory_numbers(reserved_stats(4))
    assert n.free_bytes == 1_500_000_000
    assert n.fragmentation_ratio == pytest.approx(1 - 0.3 / 1.5)  # 0.8


def test_an_idle_tpu_reports_a_zero_reservation() -> None:
    n = memory_numbers(stats("tpu", 3))
    assert (n.reserved_bytes, n.peak_reserved_bytes, n.reservable_limit_bytes) == (0, 0, 16 * GiB)
    assert n.free_bytes == 12 * GiB  # as before: nothing reserved


@pytest.mark.parametrize("device", [0, 1, 2, 7])
def test_gpu_bfc_dicts_export_no_reservation_and_keep_their_numbers(device: int) -> None:
    """GPU BFC dicts carry bytes_reserved 0 and no reservable limit: no reserved series, free as limit - in use."""
    raw = stats("gpu", device)
    n = memory_numbers(raw)
    assert raw["bytes_reserved"] == 0 and "bytes_reservable_limit" not in raw
    assert (n.reserved_bytes, n.peak_reserved_bytes, n.reservable_limit_bytes) == (None, None, None)
    assert n.free_bytes == max(raw["bytes_limit"] - raw["bytes_in_use"], 0)


def test_a_reservation_without_a_reservable_limit_still_counts() -> None:
    n = memory_numbers({"bytes_in_use": 10, "bytes_limit": 100, "bytes_reserved": 30, "largest_free_block_bytes": 60})
    assert n.free_bytes == 60
    assert n.fragmentation_ratio == 0.0
    assert (n.reserved_bytes, n.reservable_limit_bytes) == (30, None)
