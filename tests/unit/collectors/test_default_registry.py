"""The default_registry collector and its place in the exposition: prometheus_client registries of the test's own,
served as generate_latest serves them (families without samples yet included) less the names jaxmon serves, each
collector of them on its own. A hung or slow collector over HTTP: tests/unit/test_web_app.py."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.default_registry import DefaultRegistryCollector, DefaultRegistryOptions
from jaxmon.exposition import Exposition, scraped_families
from jaxmon.snapshot import Snapshot
from jaxmon.sources.replay import ReplaySource
from tests.conftest import parse_samples, sample
from tests.helpers import FIXTURES


class Broken(PromCollector):
    def collect(self) -> Iterator[Metric]:
        raise RuntimeError("the user's collector is broken")


def gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, "help", value=value)


def collector(registry: CollectorRegistry) -> DefaultRegistryCollector:
    ctx = standalone_context(ReplaySource(FIXTURES / "shapes.json"), workload="w")
    return DefaultRegistryCollector(DefaultRegistryOptions(), ctx, registry=registry)


class Families(PromCollector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def test_a_family_whose_name_or_sample_name_is_taken_is_left_out_and_each_name_is_served_once() -> None:
    taken = {"jaxmon_build_info", "process_cpu_seconds_total", "jaxmon_steps_total"}
    counter = Counter("process_cpu_seconds", "the registry's copy", registry=None)  # sample process_cpu_seconds_total
    labelled = Counter("jaxmon_steps", "no child yet: no sample", ["split"], registry=None)  # still takes _total
    empty = gauge("empty", 0)
    empty.samples.clear()
    fams = [gauge("jaxmon_build_info", 1), *counter.collect(), *labelled.collect(), gauge("mine", 1), gauge("mine", 2)]
    registry = CollectorRegistry()
    registry.register(Families([*fams, empty]))
    kept = scraped_families([collector(registry)], taken)
    assert [(f.name, [s.value for s in f.samples]) for f in kept] == [("mine", [1]), ("empty", [])]
    assert {"mine", "empty"} <= taken


def test_families_without_samples_yet_are_served_as_generate_latest_serves_them() -> None:
    """A labelled Counter and Histogram with no child yet (grain's data-source families before a source reads):
    jaxmon's exposition holds generate_latest's text of the registry, HELP and TYPE of both included."""
    registry = CollectorRegistry()
    Counter("loader_bytes_read", "Bytes read per source.", ["source"], registry=registry)
    Histogram("loader_read_time_ns", "Read time per source.", ["source"], registry=registry)
    Gauge("loader_workers", "Workers.", registry=registry).set(2)
    reference = generate_latest(registry).decode()
    assert "# TYPE loader_bytes_read_total counter" in reference and "# TYPE loader_read_time_ns histogram" in reference
    exposition = Exposition(Snapshot, [collector(registry)])
    assert reference in exposition.render(False).decode()
    assert reference in gzip.decompress(exposition.render(True)).decode()
    assert reference in exposition.render(False, {"default_registry"}).decode()


def test_a_collector_that_raises_leaves_the_others_served_and_the_update_says_so() -> None:
    registry = CollectorRegistry()
    Gauge("before", "help", registry=registry).set(3)
    registry.register(Broken())
    Gauge("after", "help", registry=registry).set(4)
    c = collector(registry)
    assert c.update().success
    assert {f.name for f in c.scrape_families()} == {"before", "after"}
    update = c.update()
    assert not update.success and update.state.failed == ("Broken",)


def test_the_exposition_serves_the_registry_at_each_scrape_less_jaxmons_names() -> None:
    registry = CollectorRegistry()
    batches = Counter("trainer_batches", "help", registry=registry)
    Gauge("jaxmon_build_info", "an impostor", registry=registry).set(7)
    Gauge("python_info", "an impostor", registry=registry).set(7)
    c = collector(registry)
    exposition = Exposition(Snapshot, [c])
    batches.inc(2)
    text = exposition.render(False).decode()
    assert sample(parse_samples(text), "trainer_batches_total") == 2
    assert "an impostor" not in text  # jaxmon's build info and python_info win
    assert text.count("# TYPE jaxmon_build_info ") == 1 and text.count("# TYPE python_info ") == 1
    batches.inc()  # the same snapshot version: the registry is read anew all the same
    assert sample(parse_samples(exposition.render(False).decode()), "trainer_batches_total") == 3
    assert sample(parse_samples(gzip.decompress(exposition.render(True)).decode()), "trainer_batches_total") == 3
    # Only where the collector runs: a daemon's exposition has no registry of its own.
    assert "trainer_batches" not in Exposition(Snapshot, []).render(False).decode()
