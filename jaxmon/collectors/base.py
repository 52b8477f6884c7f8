"""The collector contract: updates on the scheduler return typed state; families are rendered from that state.

A collector module defines its options (a `CollectorOptions` subclass: the `--collector.<name>.*` section), its
state type and a `Collector` subclass decorated with `@register`. The composition root builds it with its options
and a `Context` (devices, source, the exchange of other collectors' readings, a publish function); nothing is set
on it afterwards. The runtime schedules its jobs, guards every update and records its health (metrics.COLLECTOR_SUCCESS,
its duration and last success) in one place, and the exposition renders its
families from the latest snapshot. Scrapes never call `update()`; a source that must be read at each scrape gives
its families with `scrape_families()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from prometheus_client.core import Metric

from jaxmon.device_readings import DeviceInfo
from jaxmon.exchange import Channel, Exchange
from jaxmon.settings.schema import CollectorOptions
from jaxmon.snapshot import Snapshot, Update
from jaxmon.sources import DeviceSource, InProcess

O = TypeVar("O", bound=CollectorOptions)  # noqa: E741 - the options, as S is the state
S = TypeVar("S")


@dataclass(frozen=True)
class PollJob:
    """A function the scheduler runs every `interval` seconds, first after `first_delay`.

    It returns the collector's new state (recorded by the runtime), or None when there is nothing to record.
    """

    id: str
    interval: float
    run: Callable[[], Update[object] | None]
    first_delay: float = 0.0


# channel -> function of a collector's state giving what it offers there (None: nothing now)
Offers = Mapping[Channel[Any], Callable[[Any], Any]]


def _ignore(update: Update[object]) -> None:
    """A publish function that records nothing (a collector built outside a runtime)."""


@dataclass(frozen=True)
class Context:
    """What a collector is built from, besides its options (compose.py makes one per collector)."""

    source: DeviceSource
    devices: tuple[DeviceInfo, ...]
    # Other collectors' readings (DUTY_CYCLES, WORKLOAD_PIDS, ...), from the runtime's latest snapshot.
    exchange: Exchange
    # Records an update produced outside a job (a probe that finished after its timeout) under this collector.
    publish: Callable[[Update[object]], None] = _ignore
    poll_interval: float = 5.0
    # Inside a workload process (embedded): its name and its view of itself.
    workload: str | None = None
    in_process: InProcess | None = None
    # The host's procfs and sysfs (--path.procfs, --path.sysfs): processes' cgroups, the cgroup tree.
    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")

    def not_in_workload(self) -> str | None:
        """Why a collector of the workload process's own doings cannot run here (None: it can)."""
        return None if self.in_process is not None and self.workload is not None else "not inside a workload process"


def standalone_context(
    source: DeviceSource,
    devices: Sequence[DeviceInfo] = (),
    *,
    workload: str | None = None,
    in_process: InProcess | None = None,
    poll_interval: float = 5.0,
    snapshot: Callable[[], Snapshot] = Snapshot,
) -> Context:
    """A context outside any runtime: an exchange over `snapshot` (empty by default), publishing nowhere."""
    return Context(
        source=source,
        devices=tuple(devices),
        exchange=Exchange(snapshot),
        poll_interval=poll_interval,
        workload=workload,
        in_process=in_process,
    )


class Collector(ABC, Generic[O, S]):
    """One collector over options `O` and state `S`; subclasses set `name`, `description`, `options` (the class
    of `O`) and are `@register`ed."""

    name: ClassVar[str]
    description: ClassVar[str]
    options: ClassVar[type[CollectorOptions]] = CollectorOptions
    # What this collector's state offers other collectors: channel -> function of the state (exchange.py).
    offers: ClassVar[Offers] = {}
    # Whether /healthz and /readyz wait on this collector's updates (the probe's own health is metrics.DEVICE_UP).
    heartbeat: ClassVar[bool] = True
    # Whether it reads this process's own JAX devices: where none that does runs, JAX is never imported (node mode).
    needs_jax: ClassVar[bool] = False
    # Family order in the exposition: collectors render in ascending `order`.
    order: ClassVar[int] = 100
    # Whether the exposition reads `scrape_families()` at each scrape; where one does, scrapes render off the
    # event loop (they may wait for it).
    scrapes: ClassVar[bool] = False

    def __init__(self, opts: O, ctx: Context) -> None:
        self.opts = opts
        self.ctx = ctx

    @classmethod
    def unavailable(cls, opts: O, ctx: Context) -> str | None:
        """Why this collector cannot run here (for `auto`: then it is silently off), or None when it can."""
        return None

    @property
    def interval(self) -> float:
        """Seconds between updates: the poll interval unless the collector says otherwise."""
        return self.ctx.poll_interval

    def jobs(self) -> list[PollJob]:
        """What the scheduler runs: by default `update()` every `interval`, first at once."""
        return [PollJob(self.name, self.interval, self.update)]

    @abstractmethod
    def update(self) -> Update[S]:
        """Read the source and return the new state (runs on the scheduler; may block, never on a scrape)."""

    @abstractmethod
    def families(self, snap: Snapshot, state: S) -> Iterator[Metric]:
        """Fresh families for `state` (`snap` is the snapshot being rendered); empty families are dropped."""

    def unheld(self, state: S) -> S:
        """`state` as a reader that is not Prometheus sees it (`jaxmon top`, curl): the new counter series
        jaxmon.births holds at 0 for Prometheus, at their values. `state` itself where the collector holds none."""
        return state

    def scrape_families(self) -> list[Metric]:
        """Families read at each scrape rather than from the snapshot, served as they are, empty ones included: a
        source outside jaxmon's polls (prometheus_client's default registry), with `scrapes` set. None by default.
        It is called off the event loop, but a scrape waits for it: it answers within a deadline of its own, and
        never raises."""
        return []

    def stop(self) -> None:
        """Release threads and handles; called once when the runtime stops."""


AnyCollector = Collector[Any, Any]

__all__ = [
    "AnyCollector",
    "Collector",
    "CollectorOptions",
    "Context",
    "Offers",
    "PollJob",
    "Update",
    "standalone_context",
]
