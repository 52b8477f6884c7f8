"""The default_registry collector: prometheus_client's default registry (`prometheus_client.REGISTRY`), served by
the embedded exporter beside jaxmon's own families, as an in-process prometheus_client exporter would.

What the training process registers there (the user's own Counters and Histograms, grain's
`grain_python_dataset_*` families) is read at each scrape (jaxmon.exposition.Exposition.render), never on a poll:
values are as fresh as prometheus_client's own `start_http_server` serves them. A family whose name jaxmon already
serves is left out (jaxmon's wins: the default registry's process_* and python_* collectors are the same numbers
jaxmon serves itself). A collector of the registry that raises is left out of that scrape, and this collector's
next update says so (`jaxmon_collector_success{collector="default_registry"} 0`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import structlog
from prometheus_client import REGISTRY
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry
from pydantic import Field

from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Update
from jaxmon.logsetup import ErrorLog
from jaxmon.settings import CollectorOptions, Enabled
from jaxmon.snapshot import Snapshot

_errors = ErrorLog(structlog.get_logger("jaxmon.default_registry"), 600.0)


def sample_names(family: Metric) -> set[str]:
    """The family's name and every name its samples are written under (`x_total`, `x_bucket`, `x_created`)."""
    return {family.name, *(s.name for s in family.samples)}


def foreign_families(families: Iterable[Metric], taken: set[str]) -> list[Metric]:
    """`families` less those whose name or a sample name is in `taken` (jaxmon's own wins), less those without
    samples; the names of the families kept are added to `taken` (a name registered twice is served once)."""
    kept = []
    for fam in families:
        names = sample_names(fam)
        if not fam.samples or names & taken:
            continue
        taken |= names
        kept.append(fam)
    return kept


@dataclass(frozen=True)
class RegistryState:
    """The last scrape's reading of the registry: the collectors of it that raised."""

    failed: tuple[str, ...] = ()


class DefaultRegistryOptions(CollectorOptions):
    """`--collector.default_registry`: on inside a workload process (embedded), off in a daemon."""

    enabled: Enabled = Field(
        default="auto",
        description="true, false, or auto (on inside a workload process: jaxmon.start()): also serve "
        "prometheus_client's default registry (the process's own metrics, grain's) at each scrape.",
    )


@register
class DefaultRegistryCollector(Collector[DefaultRegistryOptions, RegistryState]):
    """prometheus_client.REGISTRY of the workload process, read at each scrape."""

    name = "default_registry"
    description = "prometheus_client's default registry of the workload process (its own metrics), at each scrape."
    options = DefaultRegistryOptions
    heartbeat = False  # /healthz and /readyz do not wait on it: it has nothing to poll
    order = 1000

    def __init__(self, opts: DefaultRegistryOptions, ctx: Context, registry: CollectorRegistry = REGISTRY) -> None:
        super().__init__(opts, ctx)
        self.registry = registry
        self._lock = threading.Lock()
        self._failed: tuple[str, ...] = ()

    @classmethod
    def unavailable(cls, opts: DefaultRegistryOptions, ctx: Context) -> str | None:
        """Only a workload process has metrics of its own in its default registry."""
        return ctx.not_in_workload()

    def read(self) -> list[Metric]:
        """Every family of the registry now; a collector of it that raises is left out (and remembered)."""
        collectors: list[PromCollector] | None
        try:
            # Each collector on its own, so one that raises leaves the others served (prometheus_client's own
            # collect() stops at the first). The attribute is prometheus_client's; without it, all or nothing.
            with self.registry._lock:
                collectors = list(self.registry._collector_to_names)
        except AttributeError:
            collectors = None
        families: list[Metric] = []
        failed: list[str] = []
        for collector in collectors if collectors is not None else [self.registry]:
            try:
                families.extend(collector.collect())
            except Exception as exc:
                failed.append(type(collector).__name__)
                _errors.error(
                    f"collect/{type(collector).__name__}",
                    "a collector of prometheus_client's default registry failed: left out of the scrape",
                    f"{type(exc).__name__}: {exc}",
                )
        with self._lock:
            self._failed = tuple(failed)
        return families

    def update(self) -> Update[RegistryState]:
        """Whether the last scrape read every collector of the registry."""
        with self._lock:
            failed = self._failed
        return Update(RegistryState(failed), success=not failed)

    def families(self, snap: Snapshot, state: RegistryState) -> Iterator[Metric]:
        """None on a poll: the exposition reads the registry at each scrape (`read`)."""
        return iter(())
