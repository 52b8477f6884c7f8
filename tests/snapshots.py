"""Hand-built snapshots for unit tests of the exposition, rendered by the real collectors, and the devices and
allocator stats they are built from."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.allocator import memory_numbers
from jaxmon.collectors.base import AnyCollector, standalone_context
from jaxmon.collectors.memory import MemoryCollector, MemoryOptions, MemoryState
from jaxmon.collectors.probe import ProbeCollector, ProbeOptions, ProbeState
from jaxmon.device_readings import BackendStatus, DeviceInfo, MemoryReading, ProbeStatus
from jaxmon.exposition import snapshot_families
from jaxmon.snapshot import CollectorStatus, Snapshot
from jaxmon.sources.replay import ReplaySource

FIXTURES = Path(__file__).parent / "fixtures"
Key = tuple[str, int]


def collectors() -> list[AnyCollector]:
    """The memory and probe collectors, built without devices of their own (no probe threads)."""
    ctx = standalone_context(ReplaySource(FIXTURES / "shapes.json"))
    return [MemoryCollector(MemoryOptions(), ctx), ProbeCollector(ProbeOptions(), ctx)]


def make_snapshot(
    devices: Sequence[DeviceInfo] = (),
    backends: Sequence[BackendStatus] = (),
    memory: Mapping[Key, MemoryReading] | None = None,
    read_errors: Mapping[Key, int] | None = None,
    live_array_bytes: Mapping[Key, int] | None = None,
    probes: Mapping[Key, ProbeStatus] | None = None,
    statuses: Mapping[str, CollectorStatus] | None = None,
    source: str = "local",
    build: Mapping[str, str] | None = None,
    workload: str | None = None,
) -> Snapshot:
    """A snapshot with the memory state (when `memory` or `read_errors` is given) and probe state (`probes`)."""
    states: dict[str, object] = {}
    if memory is not None or read_errors is not None:
        states["memory"] = MemoryState(memory or {}, read_errors or {}, live_array_bytes or {})
    if probes is not None:
        states["probe"] = ProbeState(probes)
    return Snapshot(
        devices=tuple(devices),
        backends=tuple(backends),
        source=source,
        build=build or {},
        workload=workload,
        states=states,
        statuses=statuses or {},
    )


def render_families(snap: Snapshot) -> list[Metric]:
    """Every non-empty family of `snap`, as a scrape renders it."""
    return snapshot_families(snap, collectors(), None)


class SnapshotCollector(PromCollector):
    """A prometheus_client collector over whatever `get` returns (for `registry.get_sample_value`)."""

    def __init__(self, get: Callable[[], Snapshot]) -> None:
        self._get = get

    def collect(self) -> Iterator[Metric]:
        return iter(render_families(self._get()))


def registry_for(holder: list[Snapshot]) -> CollectorRegistry:
    """A fresh registry whose collector renders whatever snapshot `holder[0]` is at collect time."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: holder[0]))
    return registry


# Devices and a memory snapshot shared by the memory collector's, the probe collector's and the exposition's tests.

GPU0 = DeviceInfo(id=0, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
GPU1 = DeviceInfo(id=1, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
TPU2 = DeviceInfo(id=2, platform="tpu", device_kind="TPU v5 lite", process_index=1, coords="1,0,0", core_on_chip=0)
CPU0 = DeviceInfo(id=0, platform="cpu", device_kind="cpu")

# A BFC allocator with a grown pool; every derived number is worked out by hand in tests/unit/collectors/test_memory.py.
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
