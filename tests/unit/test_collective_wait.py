"""Each device's collective wait in the last sampled trace (jaxmon_training_collective_wait_ratio) and the step the
sample began at (jaxmon_training_profile_sample_step): from a real split of hand-laid XSpace bytes through the
profile totals, to the families, through the spool, and past the births' zero-holding (a gauge is never held)."""

from __future__ import annotations

import dataclasses

import pytest

from jaxmon.births import Births, with_zeros
from jaxmon.families.training import training_families, training_labels
from jaxmon.sources.spool_codec import spool_training, training_reading
from jaxmon.training.profile_totals import ProfileTotals
from jaxmon.training.trace_links import Catalog
from jaxmon.training.trace_split import split_trace
from jaxmon.training_readings import ProfileReading, TrainingReading
from tests.unit.xla.test_split_fakes import GPU0, GPU1
from tests.xspace_fakes import START_UNIX_NS, Kernel, gpu_space

# The trace's local GPUs 0 and 1 are the job's devices 4 and 5 (a second process's), as the profiler names them.
KEYS = {("gpu", 0): ("gpu", 4), ("gpu", 1): ("gpu", 5)}
WHOLE = [(START_UNIX_NS, START_UNIX_NS + 100_000)]  # the fakes' 100 us profile, one step


def totals_after(*samples: tuple[bytes, int]) -> ProfileTotals:
    totals = ProfileTotals()
    for data, step in samples:
        split = split_trace(data, Catalog(), WHOLE)
        assert split is not None
        totals.add(split, KEYS, step)
    return totals


def test_each_device_waits_its_collective_part_of_the_last_sample() -> None:
    # GPU 0's exposed collectives are [30, 40) and [70, 80) of 100 us; GPU 1's [60, 75): test_split_fakes.py.
    totals = totals_after((gpu_space({0: GPU0, 1: GPU1}), 1000))
    assert totals.sample_step == 1000
    waits = {(d.platform, d.id): d.sample_wait_ratio for d in totals.devices()}
    assert waits == {("gpu", 4): pytest.approx(0.20), ("gpu", 5): pytest.approx(0.15)}
    # A second sample, its collective [0, 50) of 100 us exposed on GPU 0 alone: the last sample's figure, not a
    # mean over both; GPU 1, not in it, has none of this sample's (its totals stay).
    second = gpu_space({0: [Kernel(13, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 50, hlo_op="all-reduce.1")]})
    totals = totals_after((gpu_space({0: GPU0, 1: GPU1}), 1000), (second, 2000))
    assert totals.sample_step == 2000
    by_device = {(d.platform, d.id): d for d in totals.devices()}
    assert by_device[("gpu", 4)].sample_wait_ratio == pytest.approx(0.5)
    assert by_device[("gpu", 5)].sample_wait_ratio is None
    assert by_device[("gpu", 5)].profiled_seconds_total == pytest.approx(100e-6)
    # The cumulative parts are unchanged by the per-sample figure: GPU 0 waited 20 + 50 us of 200.
    assert by_device[("gpu", 4)].parts["collective"] == pytest.approx(70e-6)


def rendered(reading: TrainingReading) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    labels = training_labels("llama", 1, 2, "host-1")
    out = {}
    for fam in training_families([(labels, reading)]):
        for s in fam.samples:
            if s.name in ("jaxmon_training_collective_wait_ratio", "jaxmon_training_profile_sample_step"):
                out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k in ("device", "platform"))))] = (
                    s.value
                )
    return out


def sampled() -> TrainingReading:
    totals = totals_after((gpu_space({0: GPU0, 1: GPU1}), 1000))
    profile = ProfileReading(results={"taken": 1}, devices=totals.devices(), sample_step=totals.sample_step)
    return TrainingReading(steps_total=1002, profile=profile)


def test_the_families_carry_each_devices_wait_and_the_processs_sample_step() -> None:
    assert rendered(sampled()) == {
        ("jaxmon_training_collective_wait_ratio", (("device", "4"), ("platform", "gpu"))): pytest.approx(0.20),
        ("jaxmon_training_collective_wait_ratio", (("device", "5"), ("platform", "gpu"))): pytest.approx(0.15),
        ("jaxmon_training_profile_sample_step", ()): 1000.0,
    }
    # Before the first sample: neither series (sampling on, nothing taken yet).
    before = TrainingReading(profile=ProfileReading(results={"taken": 0}))
    assert rendered(before) == {}


def test_the_spool_carries_them_to_the_sidecar() -> None:
    reading = sampled()
    back = training_reading(spool_training(reading, now=100.0), time=100.0)
    assert back.profile == reading.profile
    assert rendered(back) == rendered(reading)


def test_a_gauge_is_served_as_it_is_while_the_counters_are_held_at_zero() -> None:
    reading = with_zeros(sampled())
    births = Births(proof=lambda: 0, taken=lambda: 0)  # no scrape: every new counter held
    births.begin()
    served = births.training("p", reading)
    births.end()
    assert served.profile is not None and reading.profile is not None
    # A new series' counters read 0 until a scrape served them; the last sample's wait and step are not counters.
    assert all(d.profiled_seconds_total == 0 for d in served.profile.devices)
    assert served.profile.sample_step == 1000
    waits = [d.sample_wait_ratio for d in served.profile.devices]
    assert waits == [d.sample_wait_ratio for d in reading.profile.devices]
    assert rendered(served) == rendered(reading)
    assert dataclasses.replace(served.profile, results={}, devices=()) == ProfileReading(sample_step=1000)
