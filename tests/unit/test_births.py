"""jaxmon.births: counters born at zero, held at 0 until a scrape has served them, and a restart seen as a reset."""

from __future__ import annotations

import dataclasses

from jaxmon.births import (
    BADPUT_KINDS,
    DURATION_BOUNDS,
    PROBLEM_REASONS,
    PROFILE_PARTS,
    PROFILE_RESULTS,
    Births,
    with_zeros,
)
from jaxmon.collectors.training import MAX_DECLARED_KINDS
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


class Scrapes:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        return self.n


def _poll(births: Births, prefix: object, reading: TrainingReading) -> TrainingReading:
    births.begin()
    try:
        return births.training(prefix, reading)
    finally:
        births.end()


def test_a_new_series_reads_0_until_a_scrape_served_it_then_all_of_it() -> None:
    scrapes = Scrapes()
    births = Births(scrapes)
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
    scrapes.n += 1
    assert _poll(births, "p", reading) == reading  # served once at 0: all of it counts
    # A kind that appears later is held on its own, the others keep counting.
    later = TrainingReading(badput_seconds_total={"startup": 1.5, "compile": 2.0, "eval": 4.0})
    assert _poll(births, "p", later).badput_seconds_total == {"startup": 1.5, "compile": 2.0, "eval": 0.0}
    scrapes.n += 1
    assert _poll(births, "p", later).badput_seconds_total == later.badput_seconds_total


def test_a_restarted_process_is_a_reset_and_a_gone_one_is_forgotten() -> None:
    scrapes = Scrapes()
    births = Births(scrapes)
    old = TrainingReading(badput_seconds_total={"compile": 3.0})
    _poll(births, ("llama", 0, "host", 100, 1.0), old)
    scrapes.n += 1
    assert _poll(births, ("llama", 0, "host", 100, 1.0), old) == old
    # The same workload and process index, a new pid and start: its first exposition is 0 (below the old 3.0).
    new = TrainingReading(badput_seconds_total={"compile": 3.1})
    assert _poll(births, ("llama", 0, "host", 200, 9.0), new).badput_seconds_total == {"compile": 0.0}
    assert not [k for k in births._free if 100 in k[0]]  # type: ignore[index]  # the old process's are forgotten
    scrapes.n += 1
    assert _poll(births, ("llama", 0, "host", 200, 9.0), new) == new


def test_compile_counters_are_held_the_same_way() -> None:
    scrapes = Scrapes()
    births = Births(scrapes)
    counters = {"compilations": 98.0, "compile_seconds": 12.0}
    births.begin()
    assert births.compile((), counters) == {"compilations": 0.0, "compile_seconds": 0.0}
    births.end()
    scrapes.n += 1
    births.begin()
    assert births.compile((), counters) == counters
    births.end()


def test_every_render_of_the_exposition_is_a_scrape() -> None:
    from jaxmon.births import scrape_count
    from jaxmon.exposition import Exposition
    from jaxmon.snapshot import Snapshot

    exposition = Exposition(lambda: Snapshot(), [], None)
    before = scrape_count()
    exposition.render(False)
    exposition.render(True, set())  # collect[]: a scrape too
    assert scrape_count() == before + 2
