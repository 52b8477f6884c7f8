"""The default_registry collector: prometheus_client's default registry (`prometheus_client.REGISTRY`), served by
the embedded exporter beside jaxmon's own families, as an in-process prometheus_client exporter would.

What the training process registers there (the user's own Counters and Histograms, grain's
`grain_python_dataset_*` families) is read at each scrape (`scrape_families`), never on a poll: values are as fresh
as prometheus_client's own `start_http_server` serves them, and families without a sample yet (a labelled
Histogram with no child) are served as `generate_latest` serves them, HELP and TYPE. The exposition leaves out a
family whose name jaxmon already serves (jaxmon's wins: the default registry's process_* and python_* collectors
are the same numbers jaxmon serves itself).

The registry's collectors are the user's code: one may raise, be slow or hang. They are read on a thread of this
collector's, each on its own, and a scrape waits for them at most `--collector.default-registry.timeout`: one that
raises, or has not answered by then, is left out of that scrape (absent, never last-good: a hung collector's old
values would pass for fresh), is named in a log line, and this collector's next update says so
(metrics.COLLECTOR_SUCCESS 0 for `collector="default_registry"`). A collect() still running is never called again until
it returns: the next scrape's reading skips it, so a hung collector holds one thread however many scrapes come,
and the others stay served (those after it in the reading it held up wait for that next scrape).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated

import structlog
from prometheus_client import REGISTRY
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry
from pydantic import BeforeValidator, Field

from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Update
from jaxmon.logsetup import ErrorLog
from jaxmon.settings import CollectorOptions, Enabled, parse_duration
from jaxmon.settings.durations import bounded, format_duration
from jaxmon.snapshot import Snapshot

_errors = ErrorLog(structlog.get_logger("jaxmon.default_registry"), 600.0)


@dataclass(frozen=True)
class RegistryState:
    """The last scrape's reading of the registry: the collectors of it that raised or did not answer in time."""

    failed: tuple[str, ...] = ()


class DefaultRegistryOptions(CollectorOptions):
    """`--collector.default_registry`: on inside a workload process (embedded), off in a daemon."""

    enabled: Enabled = Field(
        default="auto",
        description="true, false, or auto (on inside a workload process: jaxmon.start()): also serve "
        "prometheus_client's default registry (the process's own metrics, grain's) at each scrape.",
    )
    timeout: Annotated[float, BeforeValidator(parse_duration), bounded(0.0, 60.0)] = Field(
        default=2.0,
        description="How long a scrape waits for the registry's collectors (the process's own code, read off the "
        "event loop); one that has not answered by then is left out of the scrape and logged, the rest are served.",
    )


@dataclass
class _Reading:
    """One reading of the registry's collectors, in turn, on a thread of its own."""

    done: threading.Event = field(default_factory=threading.Event)
    families: list[Metric] = field(default_factory=list)  # of the collectors read so far
    failed: list[str] = field(default_factory=list)
    current: str = ""  # the collector being read now
    late: bool = False  # a scrape stopped waiting for it: the next scrape reads anew


def _describe(collector: PromCollector, names: list[str]) -> str:
    """A collector as a log line names it: its class and the families it registered."""
    kind = type(collector).__name__
    return f"{kind} ({', '.join(sorted(names))})" if names else kind


@register
class DefaultRegistryCollector(Collector[DefaultRegistryOptions, RegistryState]):
    """prometheus_client.REGISTRY of the workload process, read at each scrape."""

    name = "default_registry"
    description = "prometheus_client's default registry of the workload process (its own metrics), at each scrape."
    options = DefaultRegistryOptions
    heartbeat = False  # /healthz and /readyz do not wait on it: it has nothing to poll
    order = 1000
    scrapes = True

    def __init__(self, opts: DefaultRegistryOptions, ctx: Context, registry: CollectorRegistry = REGISTRY) -> None:
        super().__init__(opts, ctx)
        self.registry = registry
        self._lock = threading.Lock()
        self._failed: tuple[str, ...] = ()
        self._reading: _Reading | None = None
        self._busy: dict[int, PromCollector] = {}  # collectors whose collect() runs now (id -> the collector)

    @classmethod
    def unavailable(cls, opts: DefaultRegistryOptions, ctx: Context) -> str | None:
        """Only a workload process has metrics of its own in its default registry."""
        return ctx.not_in_workload()

    def _collectors(self) -> list[tuple[PromCollector, list[str]]]:
        """The registry's collectors, each with the names it registered."""
        try:
            # Each collector on its own, so one that raises or hangs leaves the others served (prometheus_client's
            # own collect() stops at the first). The attribute is prometheus_client's; without it, all or nothing.
            with self.registry._lock:
                return [(c, list(names)) for c, names in self.registry._collector_to_names.items()]
        except AttributeError:
            return [(self.registry, [])]

    def _read(self, reading: _Reading) -> None:
        """Read every collector not already inside collect() (a hung one of an earlier reading) into `reading`."""
        try:
            for collector, names in self._collectors():
                described = _describe(collector, names)
                with self._lock:
                    if reading.late:
                        return  # a scrape gave up on this reading: the next one reads anew
                    if id(collector) in self._busy:
                        reading.failed.append(described)  # still inside the collect() an earlier reading began
                        continue
                    self._busy[id(collector)] = collector
                    reading.current = described
                try:
                    families = list(collector.collect())
                except Exception as exc:
                    with self._lock:
                        reading.failed.append(described)
                    _errors.error(
                        f"collect/{described}",
                        "a collector of prometheus_client's default registry failed: left out of the scrape",
                        f"{type(exc).__name__}: {exc}",
                        collector=described,
                    )
                    continue
                finally:
                    with self._lock:
                        self._busy.pop(id(collector), None)
                _errors.ok(f"collect/{described}", "a collector of prometheus_client's default registry answers again")
                with self._lock:
                    reading.families.extend(families)
        finally:
            reading.done.set()

    def scrape_families(self) -> list[Metric]:
        """Every family of the registry now, less the collectors that raise or do not answer within the timeout.

        Concurrent scrapes share one reading; a reading a scrape gave up on is not waited for again.
        """
        timeout = self.opts.timeout
        with self._lock:
            reading = self._reading
            if reading is None or reading.done.is_set() or reading.late:
                reading = self._reading = _Reading()
                thread = threading.Thread(
                    target=self._read, args=(reading,), name="jaxmon-default-registry", daemon=True
                )
                thread.start()
        finished = reading.done.wait(timeout)
        with self._lock:
            families, failed = list(reading.families), list(reading.failed)
            hung = reading.current or "the registry"
            if not finished:
                reading.late = True
                failed.append(hung)
            self._failed = tuple(failed)
        if not finished:
            _errors.error(
                f"collect/{hung}",
                "a collector of prometheus_client's default registry did not answer in time: left out of the scrape "
                "until it does",
                f"collect() still running after {format_duration(timeout)} (--collector.default-registry.timeout)",
                same="hung",
                collector=hung,
            )
        return families

    def update(self) -> Update[RegistryState]:
        """Whether the last scrape read every collector of the registry."""
        with self._lock:
            failed = self._failed
        return Update(RegistryState(failed), success=not failed)

    def families(self, snap: Snapshot, state: RegistryState) -> Iterator[Metric]:
        """None from the snapshot: the exposition reads the registry at each scrape (`scrape_families`)."""
        return iter(())
