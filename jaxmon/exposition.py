"""The exposition: every collector's families from the latest snapshot, merged, rendered to text once per snapshot.

Families of one name from several collectors (the spool's workload devices beside this process's devices, NVML and
libtpu's device-wide series) are merged into one family in first-seen order; empty families are dropped. The text
is rendered once per snapshot version and reused by every scrape until the next update; the process and Python
families (`process_*`, `python_*`) are read per scrape and appended as their own gzip member, with the families
collectors read at each scrape (`scrape_families`: in a workload process, prometheus_client's default registry) as
they give them, empty ones included, less the names jaxmon serves. The exposition knows collectors only by this
shape (`FamilySource`), never by their modules. One step runs between the snapshot's families and the text: the
`Transform` the composition root gives (the owner transform, jaxmon.ownership.owners, which adds who owns each series'
device), once per rendered snapshot like the families themselves. A scrape may wait for a collector's scrape-time
families (up to its deadline): where one has them (`waits`), the web app renders off the event loop.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import structlog
from prometheus_client import gc_collector, platform_collector, process_collector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from jaxmon.births import SCRAPES
from jaxmon.catalog import metrics
from jaxmon.families import add
from jaxmon.lastword import LastWord
from jaxmon.logsetup import ErrorLog
from jaxmon.openmetrics_format import render as om_render
from jaxmon.openmetrics_format import with_created
from jaxmon.scrapers import MetricsRequest
from jaxmon.snapshot import Snapshot
from jaxmon.text_format import TextFormat

_render_errors = ErrorLog(structlog.get_logger("jaxmon.exposition"), 60.0)


class FamilySource(Protocol):
    """What the exposition reads of a collector (jaxmon.collectors.base.Collector has this shape)."""

    @property
    def name(self) -> str:
        """The collector's name (`collect[]`, the `collector` label of its health)."""

    @property
    def scrapes(self) -> bool:
        """Whether it has families read at each scrape (`scrape_families`)."""

    def families(self, snap: Snapshot, state: Any) -> Iterator[Metric]:
        """Its families for `state`, its latest state in `snap`."""

    def scrape_families(self) -> list[Metric]:
        """Its families read at each scrape, as they are (empty ones served); within a deadline of its own."""

    def unheld(self, state: Any) -> Any:
        """`state` with the counters held at 0 for Prometheus at their values (what other readers are served)."""


# A step over one snapshot's families before they are rendered (jaxmon.ownership.owners.OwnerTransform); may change them
# in place (they are fresh), returns those to render.
Transform = Callable[[Snapshot, list[Metric]], list[Metric]]


def base_families(snap: Snapshot) -> Iterator[Metric]:
    """What every unfiltered scrape has: versions, backends, and the identity of this process's devices."""
    build = metrics.BUILD_INFO.new()
    add(build, {k: snap.build.get(k, "") for k in metrics.BUILD_INFO.labels}, 1)
    yield build
    backend_up = metrics.BACKEND_UP.new()
    for b in snap.backends:
        add(backend_up, {"backend": b.name}, 1.0 if b.up else 0.0)
    yield backend_up
    info = metrics.DEVICE_INFO.new()
    for d in snap.devices:
        add(info, {**snap.device_labels(d), **d.identity_labels(), "source": snap.source}, 1)
    yield info
    if snap.workload_info:
        workload = metrics.WORKLOAD_INFO.new()
        add(workload, dict(snap.workload_info), 1)
        yield workload


def status_families(snap: Snapshot, names: Iterable[str]) -> Iterator[Metric]:
    """Each of the collectors `names`' health: whether its last run succeeded, how long it took, when it last did."""
    success = metrics.COLLECTOR_SUCCESS.new()
    duration = metrics.COLLECTOR_DURATION_SECONDS.new()
    last = metrics.COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS.new()
    for name in sorted(names):
        status = snap.statuses.get(name)
        if status is None:
            continue
        own = {"collector": name}
        add(success, own, 1.0 if status.success else 0.0)
        add(duration, own, status.duration_seconds)
        if status.last_success_timestamp is not None:
            add(last, own, status.last_success_timestamp)
    yield success
    yield duration
    yield last


def merged(families: Iterable[Metric]) -> list[Metric]:
    """Families of one name merged in first-seen order (samples appended); families without samples dropped."""
    by_name: dict[str, Metric] = {}
    for fam in families:
        seen = by_name.get(fam.name)
        if seen is None:
            by_name[fam.name] = fam
        else:
            seen.samples.extend(fam.samples)
    return [f for f in by_name.values() if f.samples]


def snapshot_families(
    snap: Snapshot,
    collectors: Sequence[FamilySource],
    selected: set[str] | None,
    transform: Transform | None = None,
    held: bool = True,
) -> list[Metric]:
    """Every family of one snapshot, through `transform` where one is given; `selected` limits it to those
    collectors (`collect[]`), without the base. `held`: the counters jaxmon.births holds at 0 as held (what Prometheus
    is served), else at their values (every other reader)."""

    def gen() -> Iterator[Metric]:
        if selected is None:
            yield from base_families(snap)
        names = []
        for c in collectors:
            if selected is not None and c.name not in selected:
                continue
            names.append(c.name)
            state = snap.states.get(c.name)
            if state is not None:
                yield from _guarded_families(c, snap, state if held else c.unheld(state))
        # Unfiltered: every collector with a status, those that were asked for but cannot run included.
        yield from status_families(snap, names if selected is not None else snap.statuses.keys())

    families = merged(gen())
    return families if transform is None else transform(snap, families)


def _guarded_families(c: FamilySource, snap: Snapshot, state: object) -> list[Metric]:
    """One collector's families, or none when building them raises: one bad value never fails a whole scrape."""
    try:
        return list(c.families(snap, state))
    except Exception as exc:
        _render_errors.error(f"render/{c.name}", "collector's families left out", f"{type(exc).__name__}: {exc}")
        return []


def scraped_families(collectors: Iterable[FamilySource], taken: set[str]) -> list[Metric]:
    """The collectors' scrape-time families as they give them (empty ones included, as generate_latest serves a
    labelled metric with no child yet), less those whose name or a sample name is in `taken` (jaxmon's own wins);
    the names kept are added to `taken` (a name given twice is served once)."""
    kept = []
    for c in collectors:
        try:
            families = c.scrape_families()
        except Exception as exc:  # the contract says never; one collector still never fails a whole scrape
            _render_errors.error(f"scrape/{c.name}", "collector's families left out", f"{type(exc).__name__}: {exc}")
            continue
        for fam in families:
            names = sample_names(fam)
            if names & taken:
                continue
            taken |= names
            kept.append(fam)
    return kept


# The names a family's samples are written under, by type, besides those its samples have (a family without
# samples yet still takes them: a Counter `x` with no child is `# TYPE x_total counter`).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
}


def sample_names(family: Metric) -> set[str]:
    """The family's name, every name its samples are written under (`x_total`, `x_bucket`, `x_created`) and those
    its type writes."""
    return {family.name, *(family.name + s for s in _SUFFIXES.get(family.type, ())), *(s.name for s in family.samples)}


class _Registered(PromCollector):
    def __init__(self, collectors: list[PromCollector]) -> None:
        self._collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for c in self._collectors:
            yield from c.collect()


# process_* (RSS, CPU seconds, fds, start time), python_gc_*, python_info: what every client_python exporter serves.
_PROCESS = _Registered(
    [
        process_collector.ProcessCollector(registry=None),
        gc_collector.GCCollector(registry=CollectorRegistry()),
        platform_collector.PlatformCollector(registry=None),
    ]
)


class Exposition:
    """The /metrics body: rendered once per snapshot version (scrapes never touch devices)."""

    def __init__(
        self,
        get_snapshot: Callable[[], Snapshot],
        collectors: Sequence[FamilySource],
        transform: Transform | None = None,
        last_word: LastWord | None = None,
    ) -> None:
        self._get_snapshot = get_snapshot
        self._last_word = last_word  # an embedded exporter's stopping flag, read at each scrape
        self._collectors = list(collectors)
        self._transform = transform
        self.names = {c.name for c in self._collectors}
        self._scraping = [c for c in self._collectors if c.scrapes]
        # A scrape may wait for a collector's scrape-time families: render it off the event loop (a thread hop costs
        # about 75 us a scrape, which a daemon, with none, does not pay).
        self.waits = bool(self._scraping)
        self._format = TextFormat()  # keeps label and value strings from one snapshot to the next
        # The same for what is read at each scrape (its own: far fewer samples). Scrapes render on threads, some at
        # once: its caches hold strings fixed by their keys, so a race costs at most a string formatted again.
        self._scrape_format = TextFormat()
        self._lock = threading.Lock()
        self._version = -1
        # The rendered snapshot's families and every name they use, held (Prometheus's) or not (other readers'), and
        # its renders by (held, OpenMetrics, gzip).
        self._families: dict[bool, tuple[list[Metric], set[str]]] = {}
        self._bodies: dict[tuple[bool, bool, bool], bytes] = {}

    def render(
        self,
        want_gzip: bool,
        selected: set[str] | None = None,
        openmetrics: bool = False,
        scrape: MetricsRequest | None = None,
    ) -> bytes:
        """The exposition now, gzip-compressed when asked, in OpenMetrics when asked (with `_created`:
        jaxmon.openmetrics_format); `selected` names the collectors to include. `scrape` notes what a /metrics
        request read (a Prometheus scrape's births ticket, the last word): the web app reports it `served()`."""
        # Prometheus is served the counters born at zero as jaxmon.births holds them; every other reader (jaxmon top,
        # curl) their values.
        held = scrape is not None and scrape.scraper.prometheus
        if held:
            assert scrape is not None
            scrape.ticket = SCRAPES.take()  # before the snapshot is read (jaxmon.births)
        if selected is not None:
            if scrape is not None:
                scrape.filtered = True
            snap = self._get_snapshot()
            families = snapshot_families(snap, self._collectors, selected, self._transform, held)
            families += scraped_families((c for c in self._scraping if c.name in selected), _names(families))
            body = om_render(with_created(families), True) if openmetrics else TextFormat().render(families)
            return gzip.compress(body, compresslevel=1) if want_gzip else body
        with self._lock:
            snap = self._get_snapshot()
            if snap.version != self._version:
                self._families = {}
                self._bodies = {}
                self._version = snap.version
            rendered = self._families.get(held)
            if rendered is None:
                families = snapshot_families(snap, self._collectors, None, self._transform, held)
                rendered = self._families[held] = (families, _names(families))
            cached = self._bodies.get((held, openmetrics, want_gzip))
            if cached is None:
                plain = self._bodies.get((held, openmetrics, False))
                if plain is None:
                    families = rendered[0]
                    plain = om_render(with_created(families), False) if openmetrics else self._format.render(families)
                    self._bodies[(held, openmetrics, False)] = plain
                # Level 1: half the time of level 5 on an exposition (1.4 -> 0.6 ms at 256 devices), 12 % larger.
                cached = self._bodies[(held, openmetrics, want_gzip)] = gzip.compress(plain, 1) if want_gzip else plain
            body, names = cached, rendered[1]
        scraped = list(_PROCESS.collect())
        if self._last_word is not None:
            word, final = self._last_word.families()
            scraped += word
            if scrape is not None:
                scrape.final = final
        # Read outside the lock: a user's collector may be slow (up to its collector's deadline). jaxmon's names win.
        if self._scraping:
            scraped += scraped_families(self._scraping, names | _names(scraped))
        process = om_render(scraped, True) if openmetrics else self._scrape_format.render(scraped)
        # A gzip stream may hold several members (RFC 1952 2.2); every HTTP client reads them as one body.
        return body + (gzip.compress(process, compresslevel=1) if want_gzip else process)

    def served(self, scrape: MetricsRequest) -> None:
        """`scrape`'s response was handed to its connection whole: a Prometheus scrape frees the series it read held
        (jaxmon.births), and counts as served the last word it rendered (jaxmon.lastword); not one handed over after
        its scraper gave up on it (its X-Prometheus-Scrape-Timeout-Seconds: Prometheus stored nothing of it)."""
        if not scrape.in_time():
            return
        if scrape.ticket is not None:
            SCRAPES.served(scrape.ticket)
        if self._last_word is not None and not scrape.filtered:
            self._last_word.served(scrape)


def _names(families: Iterable[Metric]) -> set[str]:
    """Every family and sample name of `families`."""
    out: set[str] = set()
    for fam in families:
        out |= sample_names(fam)
    return out
