"""The collector contract: updates on the scheduler return typed state; families are rendered from that state.

A collector module defines its options (the `--collector.<name>` section), its state type and a `Collector`
subclass decorated with `@register`. The registry (`jaxmon.collectors`) turns it into flags, the runtime schedules
its jobs, guards every update and records `jaxmon_collector_success` / `_duration_seconds` /
`_last_success_timestamp_seconds` for it in one place, and the exposition renders its families from the latest
snapshot. Scrapes never call `update()`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Generic, Literal, TypeVar

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from pydantic import BaseModel, ConfigDict, Field

from jaxmon.model import BackendStatus, DeviceInfo

if TYPE_CHECKING:
    from jaxmon.settings import Settings
    from jaxmon.sources import DeviceSource, InProcess

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)
T = TypeVar("T")

Enabled = bool | Literal["auto"]


class CollectorOptions(BaseModel):
    """The settings section of one collector: `--collector.<name>` / `--no-collector.<name>` set `enabled`."""

    model_config = ConfigDict(extra="forbid")

    enabled: Enabled = Field(default=True, description="true, false, or auto (on where its source is present).")


@dataclass(frozen=True)
class Update(Generic[S_co]):
    """What one run of a collector's job produced: its new state, and whether it got all its data."""

    state: S_co
    success: bool = True
    # The duration to report; None records the wall time of the run (the probe reports device time instead).
    duration_seconds: float | None = None


@dataclass(frozen=True)
class Job:
    """A function the scheduler runs every `interval` seconds, first after `first_delay`.

    It returns the collector's new state (recorded by the runtime), or None when there is nothing to record.
    """

    id: str
    interval: float
    run: Callable[[], Update[object] | None]
    first_delay: float = 0.0


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
    # Embedded mode: the workload this process's own devices are labelled with.
    workload: str | None = None
    states: Mapping[str, object] = field(default_factory=dict)
    statuses: Mapping[str, CollectorStatus] = field(default_factory=dict)
    version: int = 0

    def state(self, collector: type[Collector[T]]) -> T | None:
        """The latest state of `collector`, None before its first update (or when it is not running)."""
        value = self.states.get(collector.name)
        return value  # type: ignore[return-value]  # stored under the collector's name by `with_update` only

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
            states={**self.states, name: update.state},
            statuses={**self.statuses, name: status},
            version=self.version + 1,
        )


@dataclass
class Context:
    """What collectors are built from: the settings, the device source and its devices, the workload process."""

    settings: Settings
    source: DeviceSource
    devices: list[DeviceInfo]
    workload: str | None = None
    in_process: InProcess | None = None


class Collector(ABC, Generic[S]):
    """One collector. Subclasses set `name`, `description` and (optionally) `options`, and are `@register`ed."""

    name: ClassVar[str]
    description: ClassVar[str]
    options: ClassVar[type[CollectorOptions]] = CollectorOptions
    # Whether /healthz and /readyz wait on this collector's updates (the probe's own health is jaxmon_device_up).
    heartbeat: ClassVar[bool] = True

    # Family order in the exposition: collectors render in ascending `order`.
    order: ClassVar[int] = 100

    def __init__(self, ctx: Context, options: CollectorOptions) -> None:
        self.ctx = ctx
        self.opts = options
        # Set by the runtime: records an update produced outside a job (a probe that finished after its timeout).
        self.publish: Callable[[Update[object]], None] = _ignore

    @classmethod
    def unavailable(cls, ctx: Context) -> str | None:
        """Why this collector cannot run here (for `auto`: then it is silently off), or None when it can."""
        return None

    @property
    def interval(self) -> float:
        """Seconds between updates: the poll interval unless the collector says otherwise."""
        return self.ctx.settings.poll.interval

    def jobs(self) -> list[Job]:
        """What the scheduler runs: by default `update()` every `interval`, first at once."""
        return [Job(self.name, self.interval, self.update)]

    @abstractmethod
    def update(self) -> Update[S]:
        """Read the source and return the new state (runs on the scheduler; may block, never on a scrape)."""

    @abstractmethod
    def families(self, snap: Snapshot, state: S) -> Iterator[Metric]:
        """Fresh families for `state` (other collectors' states are in `snap`); empty families are dropped."""

    def stop(self) -> None:
        """Release threads and handles; called once when the runtime stops."""


def _ignore(update: Update[object]) -> None:
    """The default `publish` before a runtime binds the collector."""


# -- small helpers every collector uses ----------------------------------------------------------------------


def family(name: str, help_text: str, counter: bool = False) -> Metric:
    """An empty gauge or counter family (`name` without `_total`)."""
    return Metric(name, help_text, "counter" if counter else "gauge")


def sample_name(fam: Metric) -> str:
    """The name samples of `fam` carry (`_total` for counters)."""
    return fam.name + ("_total" if fam.type == "counter" else "")


def add(fam: Metric, labels: dict[str, str], value: float) -> None:
    """Append one sample."""
    fam.samples.append(Sample(sample_name(fam), labels, float(value)))
