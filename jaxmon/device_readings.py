"""Plain data that flows from a device source through the snapshot to the collector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from jaxmon.allocator import MemoryNumbers

# A device on its host: (platform, JAX id); ids repeat across platforms (a host with both GPU and CPU devices).
DeviceKey = tuple[str, int]


@dataclass(frozen=True)
class DeviceInfo:
    """Identity of one device, as JAX names it."""

    id: int
    platform: str
    device_kind: str
    process_index: int = 0
    coords: str | None = None
    core_on_chip: int | None = None
    # TensorCores this device is (TPU: 2 for a megacore v4/v5p device, 1 for a v3 or 7x one); None elsewhere.
    num_cores: int | None = None

    @property
    def key(self) -> DeviceKey:
        """Unique per host: JAX ids can repeat across platforms (a host with both GPU and CPU devices)."""
        return (self.platform, self.id)

    def identity(self) -> dict[str, Any]:
        """The identity fields as a JSON-friendly dict (snapshot output, spool files)."""
        return {
            "id": self.id,
            "platform": self.platform,
            "device_kind": self.device_kind,
            "process_index": self.process_index,
            "coords": self.coords,
            "core_on_chip": self.core_on_chip,
        }

    def identity_labels(self) -> dict[str, str]:
        """The labels of its metrics.DEVICE_INFO series besides device, platform, workload and source."""
        return {
            "device_kind": self.device_kind,
            "process_index": str(self.process_index),
            "coords": self.coords or "",
            "core_on_chip": "" if self.core_on_chip is None else str(self.core_on_chip),
        }

    @property
    def name(self) -> str:
        """Short human name, e.g. `cpu:3`."""
        return f"{self.platform}:{self.id}"


@dataclass(frozen=True)
class BackendStatus:
    """Whether a JAX backend initialised, and why not."""

    name: str
    up: bool
    error: str | None = None


HOST_MEMORY_KINDS = ("pinned_host", "unpinned_host")
"""The memory kinds that are host memory (DESIGN.md section 13): arrays offloaded there are not in `memory_stats()`."""


@dataclass(frozen=True)
class ArrayBytes:
    """One pass over `jax.live_arrays()`: bytes per device by where the arrays live and how they are laid out.

    `live`: shards in device memory (every memory kind but the host ones). `replicated`: the part of `live` that
    belongs to arrays fully replicated over more than one device, what a sharded layout would save. `host`: shards in
    host memory kinds, per (device the shard is attached to, memory kind).
    """

    live: dict[DeviceKey, int] = field(default_factory=dict)
    replicated: dict[DeviceKey, int] = field(default_factory=dict)
    host: dict[tuple[DeviceKey, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryReading:
    """One poll of one device: numbers, or the error that reading raised."""

    numbers: MemoryNumbers | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the read did not raise."""
        return self.error is None


class ProbeKernel(Protocol):
    """A compiled probe placed on one device."""

    flops_per_step: float
    footprint_bytes: int

    def run(self, steps: int) -> None:
        """Run `steps` iterations on the device and block until they are done."""


@dataclass
class ProbeStatus:
    """What the probe of one device last saw; copied out under the runtime lock."""

    calibrated: bool = False
    # calibrated (taken now, device idle), restored (--probe.baseline-file), provisional (taken while busy)
    baseline_origin: str | None = None
    up: bool | None = None
    steps: int = 0
    last_duration_seconds: float | None = None
    baseline_seconds: float | None = None
    utilization_ratio: float | None = None
    flops_per_second: float | None = None
    footprint_bytes: int | None = None
    runs_total: int = 0
    failures_total: int = 0
    timeouts_total: int = 0
    skipped_total: int = 0
    # Scheduled runs not dispatched because this process's job was training on the device (docs/probe.md).
    deferred_total: int = 0
    busy_seconds_total: float = 0.0
    last_error: str | None = None
