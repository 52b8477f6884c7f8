"""The collector contract: updates on the scheduler return typed state; families are rendered from that state.

A collector module defines its options (the `--collector.<name>` section), its state type and a `Collector`
subclass decorated with `@register`. The registry (`jaxmon.collectors`) turns it into flags, the runtime schedules
its jobs, guards every update and records `jaxmon_collector_success` / `_duration_seconds` /
`_last_success_timestamp_seconds` for it in one place, and the exposition renders its families from the latest
snapshot. Scrapes never call `update()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, Literal, TypeVar

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from pydantic import BaseModel, ConfigDict, Field

from jaxmon.model import DeviceInfo
from jaxmon.snapshot import Snapshot

if TYPE_CHECKING:
    from jaxmon.settings import Settings
    from jaxmon.sources import DeviceSource, InProcess

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)

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


@dataclass
class Context:
    """What collectors are built from: the settings, the device source and its devices, the workload process."""

    settings: Settings
    source: DeviceSource
    devices: list[DeviceInfo]
    workload: str | None = None
    in_process: InProcess | None = None
    # The runtime's latest snapshot, for collectors that act on another collector's readings (set by Runtime).
    snapshot: Callable[[], Snapshot] | None = None


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
