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
