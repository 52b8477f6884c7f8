"""The snapshot: everything a scrape renders, replaced as a whole whenever a collector records an update."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from jaxmon.device_readings import BackendStatus, DeviceInfo

T = TypeVar("T")
S_co = TypeVar("S_co", covariant=True)


@dataclass(frozen=True)
class Update(Generic[S_co]):
    """What one run of a collector's job produced: its new state, and whether it got all its data."""

    state: S_co
    success: bool = True
    # The duration to report; None records the wall time of the run (the probe reports device time instead).
    duration_seconds: float | None = None


@dataclass(frozen=True)
class CollectorStatus:
    """node_exporter-style health of one collector."""

    success: bool = False
    duration_seconds: float = 0.0
    last_success_timestamp: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape renders, at one instant; replaced as a whole on every update (never mutated)."""

    devices: tuple[DeviceInfo, ...] = ()
    backends: tuple[BackendStatus, ...] = ()
    source: str = "local"
    build: Mapping[str, str] = field(default_factory=dict)
    # Embedded mode: the workload this process's own devices are labelled with, and its metrics.WORKLOAD_INFO labels.
    workload: str | None = None
    workload_info: Mapping[str, str] = field(default_factory=dict)
    states: Mapping[str, object] = field(default_factory=dict)
    statuses: Mapping[str, CollectorStatus] = field(default_factory=dict)
    version: int = 0

    def state(self, name: str, kind: type[T]) -> T | None:
        """The latest state of collector `name` if it is a `kind`; None before its first update or when it is not
        running."""
        value = self.states.get(name)
        return value if isinstance(value, kind) else None

    def device_labels(self, device: DeviceInfo) -> dict[str, str]:
        """The labels of one of this process's own devices (with the workload in embedded mode)."""
        labels = {"device": str(device.id), "platform": device.platform}
        if self.workload is not None:
            labels["workload"] = self.workload
        return labels

    def with_update(self, name: str, update: Update[object], duration: float, now: float | None = None) -> Snapshot:
        """A new snapshot with `update` recorded for the collector `name`."""
        previous = self.statuses.get(name)
        now = time.time() if now is None else now
        status = CollectorStatus(
            success=update.success,
            duration_seconds=duration if update.duration_seconds is None else update.duration_seconds,
            last_success_timestamp=now if update.success else (previous.last_success_timestamp if previous else None),
        )
        return Snapshot(
            devices=self.devices,
            backends=self.backends,
            source=self.source,
            build=self.build,
            workload=self.workload,
            workload_info=self.workload_info,
            states={**self.states, name: update.state},
            statuses={**self.statuses, name: status},
            version=self.version + 1,
        )
