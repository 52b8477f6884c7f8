"""The exposition: jaxmon's cached text renderer writes exactly what prometheus_client's generate_latest writes, and
the families every scrape carries whatever the collectors (device identity, backends, build, collector status)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from jaxmon.allocator import memory_numbers
from jaxmon.device_readings import DeviceInfo, MemoryReading, ProbeStatus
from jaxmon.snapshot import CollectorStatus, Snapshot
from jaxmon.sources.replay import ReplaySource
from jaxmon.text_format import TextFormat
from tests.helpers import FIXTURES
from tests.snapshots import BUILD, GPU0, TPU2, labels, make_snapshot, memory_snapshot, registry_for, render_families


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _reference(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


def _replay_snapshot() -> Snapshot:
    source = ReplaySource(FIXTURES / "shapes.json")
    devices, backends = source.discover()
    memory = {}
    for d in devices:
        try:
            memory[d.key] = MemoryReading(memory_numbers(source.read_memory(d)))
        except Exception as exc:
            memory[d.key] = MemoryReading(None, error=str(exc))
    return make_snapshot(devices=devices, backends=backends, memory=memory, source="replay", build={"version": "1"})


def test_the_replay_exposition_is_byte_for_byte_generate_latest() -> None:
    fmt = TextFormat()
    snap = _replay_snapshot()
    for _ in range(3):  # the second and third renders come from the caches
        families = render_families(snap)
        assert fmt.render(families) == _reference(families)


def test_awkward_labels_and_values_are_escaped_and_formatted_alike() -> None:
    device = DeviceInfo(id=0, platform="gpu", device_kind='Kind "quoted" \\ back\nslash', coords="1,2")
    status = ProbeStatus(
        calibrated=True,
        up=True,
        steps=3,
        last_duration_seconds=1e-7,
        baseline_seconds=0.0,
        utilization_ratio=1.0,
        flops_per_second=math.inf,
        footprint_bytes=0,
        runs_total=10**18,
    )
    snap = make_snapshot(
        devices=[device],
        memory={device.key: MemoryReading(memory_numbers({"bytes_in_use": 2**53 + 1, "bytes_limit": 3}))},
        probes={device.key: status},
        workload="wörk",
        build={"version": "ü"},
    )
    fmt = TextFormat()
    for _ in range(2):
        families = render_families(snap)
        assert fmt.render(families) == _reference(families)


def test_changing_values_do_not_leave_stale_text_behind() -> None:
    fmt = TextFormat()
    snap = _replay_snapshot()
    key = snap.devices[0].key
    for in_use in (1, 2, 1, 0, -0.0, 3):
        reading = MemoryReading(memory_numbers({"bytes_in_use": in_use, "bytes_limit": 10}))
        snap = make_snapshot(devices=snap.devices, memory={key: reading}, source="replay")
        families = render_families(snap)
        assert fmt.render(families) == _reference(families)


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
