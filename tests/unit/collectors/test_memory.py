"""The memory collector's families on hand-built snapshots, read back through a fresh prometheus_client registry.

The probe collector's families are in tests/unit/collectors/test_probe.py, the identity, backend, build and
collector families every scrape carries in tests/unit/test_exposition.py.
"""

from __future__ import annotations

from dataclasses import replace

from jaxmon.allocator import memory_numbers
from jaxmon.device_readings import MemoryReading
from tests.snapshots import CPU0, GPU0, GPU1, labels, make_snapshot, memory_snapshot, registry_for


def test_memory_numbers_are_exported_with_hand_computed_values() -> None:
    """Every memory series of a readable device carries the value worked out from the raw stats."""
    reg = registry_for([memory_snapshot()])
    g0 = labels(GPU0)
    expected = {
        "jaxmon_memory_bytes_in_use": 300,
        "jaxmon_memory_peak_bytes_in_use": 500,
        "jaxmon_memory_limit_bytes": 1000,
        "jaxmon_memory_pool_bytes": 600,
        "jaxmon_memory_free_bytes": 1000 - 300,
        "jaxmon_memory_largest_free_block_bytes": 150,
        "jaxmon_memory_fragmentation_ratio": 1 - 150 / (600 - 300),  # 0.5: free space inside the pool
        "jaxmon_memory_largest_allocatable_bytes": max(150, 1000 - 600),  # 400: the pool can still grow
        "jaxmon_memory_largest_alloc_bytes": 128,
        "jaxmon_memory_allocations_total": 12,
        "jaxmon_memory_stats_supported": 1,
        "jaxmon_memory_read_success": 1,
        "jaxmon_memory_read_errors_total": 0,
    }
    for name, value in expected.items():
        assert reg.get_sample_value(name, g0) == value, name


def test_a_device_without_allocator_stats_reports_unsupported_and_no_numbers() -> None:
    """memory_stats() returning None gives supported 0, a successful read, and no memory numbers at all."""
    reg = registry_for([memory_snapshot()])
    c0 = labels(CPU0)
    assert reg.get_sample_value("jaxmon_memory_stats_supported", c0) == 0
    assert reg.get_sample_value("jaxmon_memory_read_success", c0) == 1
    for name in ("bytes_in_use", "limit_bytes", "free_bytes", "fragmentation_ratio", "allocations_total"):
        assert reg.get_sample_value(f"jaxmon_memory_{name}", c0) is None, name


def test_a_raising_device_reports_a_failed_read_its_error_count_and_no_numbers() -> None:
    """A read that raised gives read_success 0, the error counter, and neither supported nor numbers."""
    reg = registry_for([memory_snapshot()])
    g1 = labels(GPU1)
    assert reg.get_sample_value("jaxmon_memory_read_success", g1) == 0
    assert reg.get_sample_value("jaxmon_memory_read_errors_total", g1) == 3
    assert reg.get_sample_value("jaxmon_memory_stats_supported", g1) is None
    assert reg.get_sample_value("jaxmon_memory_bytes_in_use", g1) is None


def test_fields_the_allocator_leaves_unset_are_absent_series_not_zero() -> None:
    """A stats dict with only bytes_in_use (and -1 for unset fields) exports only what it knows."""
    stats = {"bytes_in_use": 64, "bytes_limit": -1, "largest_free_block_bytes": -1, "num_allocs": -1}
    snap = make_snapshot(devices=[GPU0], memory={GPU0.key: MemoryReading(numbers=memory_numbers(stats))})
    reg = registry_for([snap])
    g0 = labels(GPU0)
    assert reg.get_sample_value("jaxmon_memory_bytes_in_use", g0) == 64
    for name in (
        "jaxmon_memory_limit_bytes",
        "jaxmon_memory_pool_bytes",
        "jaxmon_memory_free_bytes",
        "jaxmon_memory_largest_free_block_bytes",
        "jaxmon_memory_fragmentation_ratio",
        "jaxmon_memory_largest_allocatable_bytes",
        "jaxmon_memory_allocations_total",
    ):
        assert reg.get_sample_value(name, g0) is None, name


def test_a_device_not_polled_yet_has_an_error_count_of_zero_and_nothing_else() -> None:
    """Before the first poll a device has no reading: only its identity and a zero error counter."""
    reg = registry_for([make_snapshot(devices=[GPU0], memory={})])
    g0 = labels(GPU0)
    assert reg.get_sample_value("jaxmon_memory_read_errors_total", g0) == 0
    assert reg.get_sample_value("jaxmon_memory_read_success", g0) is None
    assert reg.get_sample_value("jaxmon_memory_stats_supported", g0) is None


def test_counters_carry_the_total_suffix() -> None:
    """Counters are exposed as `<name>_total`; the bare name has no sample."""
    reg = registry_for([memory_snapshot()])
    g0 = labels(GPU0)
    assert reg.get_sample_value("jaxmon_memory_allocations_total", g0) == 12
    assert reg.get_sample_value("jaxmon_memory_allocations", g0) is None
    assert reg.get_sample_value("jaxmon_memory_read_errors_total", labels(GPU1)) == 3
    assert reg.get_sample_value("jaxmon_memory_read_errors", labels(GPU1)) is None


def test_a_device_that_disappears_from_the_snapshot_disappears_from_the_output() -> None:
    """Families are rebuilt per collect: a device gone from the snapshot has no series, even with a stale reading."""
    holder = [memory_snapshot()]
    reg = registry_for(holder)
    g1 = labels(GPU1)
    assert reg.get_sample_value("jaxmon_memory_read_errors_total", g1) == 3
    # GPU 1 left; its old reading and error count are still in the state
    holder[0] = replace(memory_snapshot(), devices=(GPU0, CPU0))
    assert reg.get_sample_value("jaxmon_memory_read_errors_total", g1) is None
    assert reg.get_sample_value("jaxmon_memory_read_success", g1) is None
    info = {**g1, "device_kind": GPU1.device_kind, "process_index": "0", "coords": "", "core_on_chip": ""}
    assert reg.get_sample_value("jaxmon_device_info", {**info, "source": "replay"}) is None
    # The devices that stayed are still there.
    assert reg.get_sample_value("jaxmon_memory_bytes_in_use", labels(GPU0)) == 300
