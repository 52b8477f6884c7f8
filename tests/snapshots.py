"""Hand-built snapshots for unit tests of the exposition, rendered by the real collectors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.collectors.base import AnyCollector, standalone_context
from jaxmon.collectors.memory import MemoryCollector, MemoryOptions, MemoryState
from jaxmon.collectors.probe import ProbeCollector, ProbeOptions, ProbeState
from jaxmon.exposition import snapshot_families
from jaxmon.model import BackendStatus, DeviceInfo, MemoryReading, ProbeStatus
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
