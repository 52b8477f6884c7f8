"""jaxmon.births: counters born at zero, held at 0 until a scrape has served them, and a restart seen as a reset."""

from __future__ import annotations

import dataclasses

from jaxmon.births import (
    BADPUT_KINDS,
    DURATION_BOUNDS,
    GONE_MEMORY,
    PROBLEM_REASONS,
    PROFILE_PARTS,
    PROFILE_RESULTS,
    SCRAPES,
    Births,
    Scrapes,
    for_process,
    with_zeros,
)
from jaxmon.collectors.training import MAX_DECLARED_KINDS
from jaxmon.snapshot import Snapshot
from jaxmon.training import handed, ledger, sampler
from jaxmon.training_readings import DeviceProfile, DeviceTraining, ProfileReading, TrainingReading
from jaxmon.xla.intervals import Split


def test_the_names_are_the_trackers() -> None:
    assert set(BADPUT_KINDS) == {
        ledger.STARTUP,
        ledger.STALL,
        ledger.RESTART,
        ledger.HOST,
        *handed.EVENT_KINDS,
    }
    assert PROFILE_RESULTS == sampler.RESULTS
    # The parts the sampler splits a window into (jaxmon.xla.intervals.Split, in its field order).
    assert tuple(f.name for f in dataclasses.fields(Split))[1:5] == PROFILE_PARTS
    assert MAX_DECLARED_KINDS == handed.MAX_USER_KINDS
    assert DURATION_BOUNDS == ledger.DURATION_BUCKETS
    # Every reason the tracker's help names (the problems family's HELP lists them all).
    from jaxmon.catalog.metrics import TRAINING_TRACKING_PROBLEMS as PROBLEMS

    assert all(f"{reason}" in PROBLEMS.help for reason in PROBLEM_REASONS)


def test_with_zeros_fills_in_what_has_not_happened_and_keeps_what_has() -> None:
    reading = TrainingReading(
        badput_seconds_total={"checkpoint": 2.5, "eval": 1.0},
        problems={"back": 1},
        profile=ProfileReading(results={"taken": 3}, devices=(DeviceProfile("cpu", 0, 1.0, {"compute": 1.0}),)),
    )
    full = with_zeros(reading, ("data",))
    assert full.badput_seconds_total == {**dict.fromkeys((*BADPUT_KINDS, "data"), 0.0), "checkpoint": 2.5, "eval": 1.0}
    assert full.problems == {**dict.fromkeys(PROBLEM_REASONS, 0), "back": 1}
    assert full.profile is not None
    assert full.profile.results == {"taken": 3, "busy": 0, "failed": 0, "skipped": 0}
    assert full.profile.devices[0].parts == {"compute": 1.0, "collective": 0.0, "copy": 0.0, "idle": 0.0}
    assert with_zeros(TrainingReading()).profile is None  # sampling off: no profile series
    assert with_zeros(TrainingReading()).duration_buckets[-1] == (float("inf"), 0)  # the histogram, empty
    assert len(with_zeros(TrainingReading()).duration_buckets) == len(DURATION_BOUNDS) + 1


def _poll(births: Births, prefix: object, reading: TrainingReading) -> TrainingReading:
    births.begin()
    try:
        return births.training(prefix, reading)
    finally:
        births.end()


def test_a_new_series_reads_0_until_a_scrape_was_served_it_then_all_of_it() -> None:
    scrapes = Scrapes()
    births = Births(scrapes.proof, scrapes.taken)
    devices = (
        DeviceTraining("cpu", 0, model_flops_total=5.0, collective_bytes_total={("all-reduce", "data", "local"): 8.0}),
    )
    reading = TrainingReading(
        steps_total=3,
        duration_buckets=((0.1, 1), (float("inf"), 3)),
        duration_sum=0.4,
        tokens_total=30.0,
        productive_seconds_total=2.0,
        badput_seconds_total={"startup": 1.5, "compile": 2.0},
        problems={"jump": 1},
        devices=devices,
        start_time_seconds=1000.0,
        step=2,
    )
    held = _poll(births, "p", reading)
    assert held.steps_total == 0 and held.tokens_total == 0 and held.productive_seconds_total == 0
    assert held.badput_seconds_total == {"startup": 0.0, "compile": 0.0}
    assert held.problems == {"jump": 0}
    assert held.duration_buckets == ((0.1, 0), (float("inf"), 0)) and held.duration_sum == 0
    assert held.devices[0].model_flops_total == 0 and held.devices[0].collective_bytes_total == {
        ("all-reduce", "data", "local"): 0
    }
    assert held.step == 2 and held.start_time_seconds == 1000.0  # gauges as they are
    assert _poll(births, "p", reading) == held  # no scrape yet: still held
    scrapes.serve_one()
    assert _poll(births, "p", reading) == reading  # served once at 0: all of it counts
    # A kind that appears later is held on its own, the others keep counting.
    later = TrainingReading(badput_seconds_total={"startup": 1.5, "compile": 2.0, "eval": 4.0})
    assert _poll(births, "p", later).badput_seconds_total == {"startup": 1.5, "compile": 2.0, "eval": 0.0}
    assert _poll(births, "p", later).badput_seconds_total == {"startup": 1.5, "compile": 2.0, "eval": 0.0}
    scrapes.serve_one()
    assert _poll(births, "p", later).badput_seconds_total == later.badput_seconds_total


def test_a_scrape_that_read_the_snapshot_before_the_series_was_held_frees_nothing() -> None:
    """A series born while a scrape is rendering: that scrape read the snapshot before the poll that held it, and
    served no 0; only a scrape that took its ticket after the next poll began can have (it read that poll's snapshot
    or a later one, both holding the 0)."""
    scrapes = Scrapes()
    births = Births(scrapes.proof, scrapes.taken)
    counters = {"compilations": 8.0}
    in_flight = scrapes.take()  # a scrape reads the snapshot ...
    births.begin()  # ... a poll meanwhile holds the new series ...
    assert births.compile("p", counters) == {"compilations": 0.0}
    births.end()
    scrapes.served(in_flight)  # ... and the scrape is served, without the series
    births.begin()
    assert births.compile("p", counters) == {"compilations": 0.0}  # still held
    births.end()
    scrapes.served(scrapes.take())  # a scrape read the snapshot after that poll began: it was served the 0
    births.begin()
    assert births.compile("p", counters) == counters
    births.end()


def test_only_prometheus_scrapes_free_a_held_series() -> None:
    """jaxmon top, curl: their renders take no ticket, and a series stays held for Prometheus to see its 0."""
    from jaxmon.exposition import Exposition
    from jaxmon.scrapers import MetricsRequest, identify

    before = (SCRAPES.taken(), SCRAPES.proof())
    exposition = Exposition(lambda: Snapshot(), [], None)
    for reader in (identify("127.0.0.1", "curl/8.5.0", ""), identify("127.0.0.1", "jaxmon-top/0.1", "")):
        scrape = MetricsRequest(reader)
        exposition.render(False, scrape=scrape)
        exposition.served(scrape)
        assert scrape.ticket is None
    exposition.render(False)  # no request at all (jaxmon snapshot, a bench)
    assert (SCRAPES.taken(), SCRAPES.proof()) == before
    for prometheus in (
        identify("10.0.0.1", "Prometheus/2.42.0", "10"),
        identify("10.0.0.2", "vmagent/1.100", "9.5"),  # Prometheus-compatible: it sends the timeout header
    ):
        assert prometheus.prometheus
        scrape = MetricsRequest(prometheus)
        exposition.render(False, scrape=scrape)
        assert scrape.ticket is not None and SCRAPES.proof() < scrape.ticket
        exposition.served(scrape)
        assert SCRAPES.proof() >= scrape.ticket
    filtered = MetricsRequest(identify("10.0.0.1", "Prometheus/2.42.0", "10"))
    exposition.render(False, set(), scrape=filtered)  # collect[]: a scrape of those collectors, which it frees
    exposition.served(filtered)
    assert filtered.ticket is not None and SCRAPES.proof() >= filtered.ticket


def _polls(births: Births, readings: dict[object, TrainingReading]) -> dict[object, TrainingReading]:
    births.begin()
    try:
        return {key: births.training(key, reading) for key, reading in readings.items()}
    finally:
        births.end()


def test_a_restarted_process_is_a_reset_and_a_gone_one_is_remembered_a_while() -> None:
    scrapes = Scrapes()
    births = Births(scrapes.proof, scrapes.taken)
    old = TrainingReading(badput_seconds_total={"compile": 3.0})
    first, second = ("llama", 0, "host", 100, 1.0), ("llama", 0, "host", 200, 9.0)
    _polls(births, {first: old})
    _polls(births, {first: old})
    scrapes.serve_one()
    assert _polls(births, {first: old}) == {first: old}
    # The same workload and process index, a new pid and start: its first exposition is 0 (below the old 3.0).
    new = TrainingReading(badput_seconds_total={"compile": 3.1})
    assert _polls(births, {second: new})[second].badput_seconds_total == {"compile": 0.0}
    assert not births._free & {(first, "badput", "compile")}  # the old process's series went ...
    # ... and one that comes back (silent past the spool's TTL, then writing again) counts on at once: a 0 between
    # its two values would be counted as a reset (3 -> 0 -> 3: increase() 3 for nothing).
    assert _polls(births, {first: old, second: new}) == {
        first: old,
        second: dataclasses.replace(new, badput_seconds_total={"compile": 0.0}),
    }
    scrapes.serve_one()
    assert _polls(births, {first: old, second: new}) == {first: old, second: new}


def test_a_gone_series_is_forgotten_after_an_hour() -> None:
    scrapes = Scrapes()
    births = Births(scrapes.proof, scrapes.taken)
    counters = {"compilations": 5.0}
    for _ in range(2):
        births.begin()
        births.compile("p", counters)
        births.end(now=0.0)
    scrapes.serve_one()
    births.begin()
    assert births.compile("p", counters) == counters
    births.end(now=0.0)
    births.begin()
    births.end(now=10.0)  # gone
    births.begin()
    births.end(now=10.0 + GONE_MEMORY)  # and forgotten
    births.begin()
    assert births.compile("p", counters) == {"compilations": 0.0}  # new again
    births.end(now=10.0 + GONE_MEMORY)


def test_compile_counters_are_held_the_same_way() -> None:
    scrapes = Scrapes()
    births = Births(scrapes.proof, scrapes.taken)
    counters = {"compilations": 98.0, "compile_seconds": 12.0}
    for _ in range(2):
        births.begin()
        assert births.compile((), counters) == {"compilations": 0.0, "compile_seconds": 0.0}
        births.end()
    scrapes.serve_one()
    births.begin()
    assert births.compile((), counters) == counters
    births.end()


def test_a_process_s_own_births_outlive_its_exporter() -> None:
    """An in-process stop() and start(): the next exporter's collectors read the same Births, so counters that count
    on (the compile counters: 8 -> 10) are not held at 0 between (8 -> 0 -> 10: increase() 18 for 10)."""
    assert for_process("test-births") is for_process("test-births")
    assert for_process("test-births") is not for_process("test-births-2")


def test_prometheus_is_served_the_held_zero_and_every_other_reader_the_value() -> None:
    """One snapshot, two readers: Prometheus reads a new series at 0 (born at zero, for increase()), jaxmon top and
    curl read its value (what it is); each render is cached apart."""
    from collections.abc import Iterator

    from prometheus_client.core import CounterMetricFamily, Metric

    from jaxmon.exposition import Exposition
    from jaxmon.scrapers import MetricsRequest, identify

    class Holding:
        name, scrapes = "holding", False

        def families(self, snap: Snapshot, state: float) -> Iterator[Metric]:
            yield CounterMetricFamily("held_things", "Things.", value=state)

        def unheld(self, state: float) -> float:
            return 7.0 if state == 0.0 else state

        def scrape_families(self) -> list[Metric]:
            return []

    snap = Snapshot(states={"holding": 0.0})
    exposition = Exposition(lambda: snap, [Holding()])
    for reader, value in (("Prometheus/2.42.0", b"held_things_total 0.0"), ("curl/8.5.0", b"held_things_total 7.0")):
        for _ in range(2):
            assert value in exposition.render(False, scrape=MetricsRequest(identify("h", reader, ""))), reader
    assert b"held_things_total 7.0" in exposition.render(False)  # no request (jaxmon snapshot): the values
