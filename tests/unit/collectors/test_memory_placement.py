"""Placement in memory (issue 34), in-process on the 8 real JAX CPU devices: the memory collector's one pass over
`jax.live_arrays()` gives each device's bytes of fully replicated arrays and of host memory kinds, rendered as
`jaxmon_memory_replicated_array_bytes` and `jaxmon_memory_host_array_bytes`; the truth is the test's own arrays'
shapes and dtypes. A real training loop's figures are tests/e2e/test_memory_placement.py, with the stress test of
arrays deleted and donated while the pass runs."""

from __future__ import annotations

from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.memory import MemoryCollector, MemoryOptions, MemoryState
from jaxmon.device_readings import DeviceInfo
from jaxmon.snapshot import Snapshot
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.workload import InProcessWorkload
from tests.conftest import Samples, parse_samples

F32 = 4
KINDS = ("pinned_host", "unpinned_host")
Figures = dict[str, dict[str, float]]  # family (and memory kind) -> device label -> bytes


class _Families(PromCollector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class Embedded:
    """The memory collector as jaxmon.start() builds it inside a training process."""

    def __init__(self) -> None:
        self.source = LocalSource(sidecar_defaults=False)
        devices, _ = self.source.discover()
        self.devices: list[DeviceInfo] = [d for d in devices if d.platform == "cpu"]
        ctx = standalone_context(
            self.source, self.devices, workload="trainer", in_process=InProcessWorkload(self.source)
        )
        self.collector = MemoryCollector(MemoryOptions(), ctx)

    def figures(self) -> Figures:
        """One poll, rendered and read back: per device, live, replicated and each host kind's bytes."""
        state = self.collector.update().state
        assert isinstance(state, MemoryState)
        snap = Snapshot(devices=tuple(self.devices), workload="trainer")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(list(self.collector.families(snap, state))))
        samples: Samples = parse_samples(generate_latest(registry).decode())
        out: Figures = {}
        for (name, labels), value in samples.items():
            lab = dict(labels)
            if name == "jaxmon_memory_host_array_bytes":
                name = lab["memory_kind"]
            elif name not in ("jaxmon_memory_live_array_bytes", "jaxmon_memory_replicated_array_bytes"):
                continue
            out.setdefault(name.removeprefix("jaxmon_memory_"), {})[lab["device"]] = value
        return out


def spec() -> Any:
    """jax.sharding.PartitionSpec, which mypy sees untyped."""
    from jax.sharding import PartitionSpec

    return PartitionSpec


def delta(after: Figures, before: Figures) -> Figures:
    return {k: {d: v - before.get(k, {}).get(d, 0.0) for d, v in per.items()} for k, per in after.items()}


def every(value: int, n: int = 8) -> dict[str, float]:
    return {str(d): float(value) for d in range(n)}


def test_a_fully_replicated_array_counts_its_size_on_every_device_and_nothing_else_does() -> None:
    import jax
    from jax.sharding import Mesh, NamedSharding

    P = spec()

    embedded = Embedded()
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("d",))
    before = embedded.figures()
    assert set(before["replicated_array_bytes"]) == {str(d) for d in range(8)}  # 0 before, never absent
    replicated = jax.device_put(np.ones(256, np.float32), NamedSharding(mesh, P()))  # 1 KiB on each
    sharded = jax.device_put(np.ones(8 * 1024, np.float32), NamedSharding(mesh, P("d")))  # 4 KiB each
    single = jax.device_put(np.ones(1000, np.float32), devices[3])  # fully replicated over one device: not counted
    pair = Mesh(np.array(devices[6:8]), ("p",))
    on_two = jax.device_put(np.ones((10, 10), np.float32), NamedSharding(pair, P()))  # 400 B on 6 and 7
    # The per-shard arrays that reading the shards makes are cached on their arrays, live arrays too: counted once.
    assert len([*replicated.addressable_shards, *sharded.addressable_shards]) == 16
    d = delta(embedded.figures(), before)
    expected_replicated = every(256 * F32)
    expected_replicated["6"] += 100 * F32
    expected_replicated["7"] += 100 * F32
    assert d["replicated_array_bytes"] == expected_replicated
    expected_live = every(256 * F32 + 1024 * F32)
    expected_live["3"] += 1000 * F32
    expected_live["6"] += 100 * F32
    expected_live["7"] += 100 * F32
    assert d["live_array_bytes"] == expected_live
    assert d["pinned_host"] == every(0) and d["unpinned_host"] == every(0)
    sharded.delete()
    replicated.delete()  # deleted: gone from every figure at the next poll
    d = delta(embedded.figures(), before)
    assert d["replicated_array_bytes"] == {**every(0), "6": 100.0 * F32, "7": 100.0 * F32}
    del single, on_two


def test_arrays_in_host_memory_kinds_count_by_kind_on_their_devices_and_not_in_device_memory() -> None:
    import jax
    from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

    P = spec()

    embedded = Embedded()
    devices = jax.devices()
    mesh = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    before = embedded.figures()
    assert set(before["pinned_host"]) == set(before["unpinned_host"]) == {str(d) for d in range(8)}
    one = jax.device_put(np.ones(1000, np.float32), SingleDeviceSharding(devices[2], memory_kind="pinned_host"))
    everywhere = jax.device_put(np.ones((64, 8), np.float32), NamedSharding(mesh, P(), memory_kind="pinned_host"))
    split = jax.device_put(  # 1/4 of it on each device: sharded over data, replicated over model
        np.ones((64, 8), np.float32), NamedSharding(mesh, P("data"), memory_kind="unpinned_host")
    )
    d = delta(embedded.figures(), before)
    expected_pinned = every(64 * 8 * F32)
    expected_pinned["2"] += 1000 * F32
    assert d["pinned_host"] == expected_pinned
    assert d["unpinned_host"] == every(64 * 8 * F32 // 4)
    # Host memory is not the device's: before issue 34 these 2 KiB+ per device were counted as live device bytes.
    assert d["live_array_bytes"] == every(0)
    assert d["replicated_array_bytes"] == every(0)  # replicated in host memory: not device memory to save
    del one, everywhere, split
