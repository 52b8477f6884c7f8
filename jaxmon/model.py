"""Plain data that flows from a device source through the snapshot to the collector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from jaxmon.memory import MemoryNumbers


@dataclass(frozen=True)
class DeviceInfo:
    """Identity of one device, as JAX names it."""

    id: int
    platform: str
    device_kind: str
    process_index: int = 0
    coords: str | None = None
    core_on_chip: int | None = None

    @property
    def key(self) -> tuple[str, int]:
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
    busy_seconds_total: float = 0.0
    last_error: str | None = None


@dataclass
class CollectorStatus:
    """node_exporter-style health of one collector."""

    success: bool = False
    duration_seconds: float = 0.0
    last_success_timestamp: float | None = None


@dataclass
class Snapshot:
    """Everything a scrape renders, copied at one instant."""

    devices: list[DeviceInfo] = field(default_factory=list)
    backends: list[BackendStatus] = field(default_factory=list)
    memory: dict[tuple[str, int], MemoryReading] = field(default_factory=dict)
    memory_read_errors: dict[tuple[str, int], int] = field(default_factory=dict)
    probes: dict[tuple[str, int], ProbeStatus] = field(default_factory=dict)
    collectors: dict[str, CollectorStatus] = field(default_factory=dict)
    source: str = "local"
    build: dict[str, str] = field(default_factory=dict)
    # Embedded mode: the name this process's own devices are labelled with, its live arrays and compiles.
    workload: str | None = None
    process_index: int = 0
    live_array_bytes: dict[tuple[str, int], int] = field(default_factory=dict)
    compile: dict[str, float] | None = None
    # Publisher + sidecar: the latest report of every live workload process, and rejected spool files.
    workloads: list[Any] = field(default_factory=list)
    spool_rejected: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view, for `jaxmon snapshot --json`."""
        out: list[dict[str, Any]] = []
        for dev in self.devices:
            reading = self.memory.get(dev.key)
            probe = self.probes.get(dev.key)
            out.append(
                {
                    **dev.identity(),
                    "memory": reading.numbers.as_dict() if reading and reading.numbers else None,
                    "memory_error": reading.error if reading else None,
                    "live_array_bytes": self.live_array_bytes.get(dev.key),
                    "probe": vars(probe).copy() if probe else None,
                }
            )
        return {
            "source": self.source,
            "build": self.build,
            "backends": [vars(b).copy() for b in self.backends],
            "devices": out,
        }
