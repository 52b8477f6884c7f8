"""jaxmon's cached text renderer writes exactly what prometheus_client's generate_latest writes."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from jaxmon.allocator import memory_numbers
from jaxmon.exposition import TextFormat
from jaxmon.model import DeviceInfo, MemoryReading, ProbeStatus
from jaxmon.snapshot import Snapshot
from jaxmon.sources.replay import ReplaySource
from tests.helpers import FIXTURES
from tests.snapshots import make_snapshot, render_families


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
