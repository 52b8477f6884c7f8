"""The default_registry collector and its place in the exposition: prometheus_client registries of the test's own,
served less the names jaxmon serves, each collector of them on its own."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.default_registry import (
    DefaultRegistryCollector,
    DefaultRegistryOptions,
    foreign_families,
)
from jaxmon.exposition import Exposition
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


def test_a_family_whose_name_or_sample_name_is_taken_is_left_out_and_each_name_is_served_once() -> None:
    taken = {"jaxmon_build_info", "process_cpu_seconds_total"}
    counter = Counter("process_cpu_seconds", "the registry's copy", registry=None)  # sample process_cpu_seconds_total
    fams = [gauge("jaxmon_build_info", 1), *counter.collect(), gauge("mine", 1), gauge("mine", 2), gauge("empty", 0)]
    fams[-1].samples.clear()
    kept = foreign_families(fams, taken)
    assert [(f.name, f.samples[0].value) for f in kept] == [("mine", 1)]
    assert "mine" in taken


def test_a_collector_that_raises_leaves_the_others_served_and_the_update_says_so() -> None:
    registry = CollectorRegistry()
    Gauge("before", "help", registry=registry).set(3)
    registry.register(Broken())
    Gauge("after", "help", registry=registry).set(4)
    c = collector(registry)
    assert c.update().success
    assert {f.name for f in c.read()} == {"before", "after"}
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
