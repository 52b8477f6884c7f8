"""SnapshotCollector on hand-built snapshots, read back through a fresh prometheus_client registry."""

from __future__ import annotations

from dataclasses import replace

from jaxmon.allocator import memory_numbers
from jaxmon.model import BackendStatus, DeviceInfo, MemoryReading, ProbeStatus
from jaxmon.snapshot import CollectorStatus, Snapshot
from tests.snapshots import make_snapshot, registry_for

GPU0 = DeviceInfo(id=0, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
GPU1 = DeviceInfo(id=1, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
TPU2 = DeviceInfo(id=2, platform="tpu", device_kind="TPU v5 lite", process_index=1, coords="1,0,0", core_on_chip=0)
CPU0 = DeviceInfo(id=0, platform="cpu", device_kind="cpu")

# A BFC allocator with a grown pool; every derived number is worked out by hand below.
BFC_STATS = {
    "num_allocs": 12,
    "bytes_in_use": 300,
    "peak_bytes_in_use": 500,
    "largest_alloc_size": 128,
    "bytes_reserved": 0,
    "peak_bytes_reserved": 0,
    "largest_free_block_bytes": 150,
    "bytes_limit": 1000,
    "pool_bytes": 600,
    "peak_pool_bytes": 600,
}
BUILD = {"version": "1.2.3", "jax_version": "0.9.0", "jaxlib_version": "0.9.1", "python_version": "3.12.1"}


def labels(dev: DeviceInfo) -> dict[str, str]:
    """The device labels every per-device series carries."""
    return {"device": str(dev.id), "platform": dev.platform}


def memory_snapshot() -> Snapshot:
    """GPU 0 readable, GPU 1 raising, CPU 0 without allocator stats."""
    return make_snapshot(
        devices=[GPU0, GPU1, CPU0],
        backends=[BackendStatus("gpu", True), BackendStatus("tpu", False, "no libtpu")],
        memory={
            GPU0.key: MemoryReading(numbers=memory_numbers(BFC_STATS)),
            GPU1.key: MemoryReading(numbers=None, error="XlaRuntimeError: INTERNAL: device lost"),
            CPU0.key: MemoryReading(numbers=memory_numbers(None)),
        },
        read_errors={GPU1.key: 3},
        source="replay",
        build=BUILD,
    )


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


def test_device_info_carries_identity_labels_with_empty_strings_for_unknowns() -> None:
    """jaxmon_device_info is 1 with kind, process, coords, core and source; None becomes ""."""
    reg = registry_for([make_snapshot(devices=[GPU0, TPU2], source="local")])
    gpu = {**labels(GPU0), "device_kind": "NVIDIA H100 80GB HBM3", "process_index": "0"}
    assert reg.get_sample_value("jaxmon_device_info", {**gpu, "coords": "", "core_on_chip": "", "source": "local"}) == 1
    tpu = {**labels(TPU2), "device_kind": "TPU v5 lite", "process_index": "1", "coords": "1,0,0", "core_on_chip": "0"}
    assert reg.get_sample_value("jaxmon_device_info", {**tpu, "source": "local"}) == 1


def test_backend_up_is_one_for_started_backends_and_zero_for_failed_ones() -> None:
    """Each backend tried gets jaxmon_backend_up 1 or 0."""
    reg = registry_for([memory_snapshot()])
    assert reg.get_sample_value("jaxmon_backend_up", {"backend": "gpu"}) == 1
    assert reg.get_sample_value("jaxmon_backend_up", {"backend": "tpu"}) == 0
    assert reg.get_sample_value("jaxmon_backend_up", {"backend": "cpu"}) is None


def test_build_info_is_one_with_every_version_label() -> None:
    """jaxmon_build_info carries the four versions as labels; a missing one is an empty string."""
    reg = registry_for([memory_snapshot()])
    assert reg.get_sample_value("jaxmon_build_info", BUILD) == 1
    partial = registry_for([make_snapshot(build={"version": "0.1.0"})])
    empty = {"version": "0.1.0", "jax_version": "", "jaxlib_version": "", "python_version": ""}
    assert partial.get_sample_value("jaxmon_build_info", empty) == 1


def probed_snapshot(status: ProbeStatus) -> Snapshot:
    """One GPU device whose probe has `status`."""
    return make_snapshot(devices=[GPU0], probes={GPU0.key: status})


UP_STATUS = ProbeStatus(
    calibrated=True,
    up=True,
    steps=40,
    last_duration_seconds=0.004,
    baseline_seconds=0.003,
    utilization_ratio=0.25,
    flops_per_second=2.5e12,
    footprint_bytes=786432,
    runs_total=9,
    failures_total=2,
    timeouts_total=1,
    skipped_total=4,
    busy_seconds_total=0.75,
)


def test_probe_series_carry_the_status_values() -> None:
    """A calibrated, answering probe exports every gauge and counter from its status."""
    reg = registry_for([probed_snapshot(UP_STATUS)])
    g0 = labels(GPU0)
    expected = {
        "jaxmon_device_up": 1,
        "jaxmon_device_utilization_ratio": 0.25,
        "jaxmon_probe_duration_seconds": 0.004,
        "jaxmon_probe_baseline_seconds": 0.003,
        "jaxmon_probe_flops_per_second": 2.5e12,
        "jaxmon_probe_memory_bytes": 786432,
        "jaxmon_probe_steps": 40,
        "jaxmon_probe_runs_total": 9,
        "jaxmon_probe_failures_total": 2,
        "jaxmon_probe_timeouts_total": 1,
        "jaxmon_probe_skipped_total": 4,
        "jaxmon_probe_busy_seconds_total": 0.75,
    }
    for name, value in expected.items():
        assert reg.get_sample_value(name, g0) == value, name


def test_utilization_is_absent_while_the_device_is_down() -> None:
    """A probe that failed exports up 0 and no utilization estimate, though the status still holds one."""
    down = replace(UP_STATUS, up=False, last_error="probe did not finish within 5s")
    reg = registry_for([probed_snapshot(down)])
    g0 = labels(GPU0)
    assert reg.get_sample_value("jaxmon_device_up", g0) == 0
    assert reg.get_sample_value("jaxmon_device_utilization_ratio", g0) is None
    assert reg.get_sample_value("jaxmon_probe_duration_seconds", g0) == 0.004


def test_a_probe_that_never_ran_exports_only_its_counters() -> None:
    """Before calibration: no up, utilization, steps or latency series, and counters at 0."""
    reg = registry_for([probed_snapshot(ProbeStatus())])
    g0 = labels(GPU0)
    for name in (
        "jaxmon_device_up",
        "jaxmon_device_utilization_ratio",
        "jaxmon_probe_duration_seconds",
        "jaxmon_probe_baseline_seconds",
        "jaxmon_probe_flops_per_second",
        "jaxmon_probe_memory_bytes",
        "jaxmon_probe_steps",
    ):
        assert reg.get_sample_value(name, g0) is None, name
    assert reg.get_sample_value("jaxmon_probe_runs_total", g0) == 0
    assert reg.get_sample_value("jaxmon_probe_busy_seconds_total", g0) == 0


def test_a_snapshot_without_probes_has_no_probe_series() -> None:
    """A source that runs no probes (replay) exports no probe family at all."""
    reg = registry_for([memory_snapshot()])
    names = {s.name for family in reg.collect() for s in family.samples}
    assert not any(n.startswith("jaxmon_probe_") or n.startswith("jaxmon_device_up") for n in names)
    assert "jaxmon_memory_bytes_in_use" in names


def test_collector_series_report_success_duration_and_last_success() -> None:
    """jaxmon_collector_* per collector; no last-success timestamp for one that never succeeded."""
    snap = make_snapshot(
        statuses={
            "memory": CollectorStatus(success=True, duration_seconds=0.125, last_success_timestamp=1700000000.5),
            "probe": CollectorStatus(success=False, duration_seconds=0.5, last_success_timestamp=None),
        }
    )
    reg = registry_for([snap])
    memory, probe = {"collector": "memory"}, {"collector": "probe"}
    assert reg.get_sample_value("jaxmon_collector_success", memory) == 1
    assert reg.get_sample_value("jaxmon_collector_duration_seconds", memory) == 0.125
    assert reg.get_sample_value("jaxmon_collector_last_success_timestamp_seconds", memory) == 1700000000.5
    assert reg.get_sample_value("jaxmon_collector_success", probe) == 0
    assert reg.get_sample_value("jaxmon_collector_duration_seconds", probe) == 0.5
    assert reg.get_sample_value("jaxmon_collector_last_success_timestamp_seconds", probe) is None
