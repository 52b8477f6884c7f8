"""A probe timing of spaced shots, each a warm-up and a timed run of a scripted kernel (300, 50 and 150 ms, a quarter
of a second apart): seconds of real time. The baseline's other tests are tests/unit/test_probe_baseline.py's."""

from __future__ import annotations

import time

from jaxmon.probe import ProbeConfig
from tests.unit.test_probe_baseline import ScriptedKernel, probe_over


def test_a_timing_is_the_median_of_spaced_shots_and_every_run_counts_as_busy() -> None:
    # Three shots, each a one-step warm-up and a timed run of 300, 50 and 150 ms: the median is 150 ms.
    kernel = ScriptedKernel([0.300, 0.050, 0.150])
    config = ProbeConfig(size=8, timeout_seconds=10.0, target_seconds=0.010, repeats=3, spacing_seconds=0.25)
    probe = probe_over(kernel, config=config)
    try:
        probe.run_once()  # calibration (1 ms runs) and one measurement of 1 ms runs
        before = probe.status()
        kernel.calibrating = False
        started = time.monotonic()
        probe.run_once()
        took = time.monotonic() - started
        after = probe.status()
    finally:
        probe.stop()
        probe.join(2)
    assert kernel.script == []  # three timed runs for one timing
    assert after.last_duration_seconds is not None
    assert 0.150 <= after.last_duration_seconds < 0.300  # neither the fastest (50 ms) nor the slowest
    busy = after.busy_seconds_total - before.busy_seconds_total
    assert 0.500 <= busy < 2.0  # every run (500 ms together, and the warm-ups) is the probe's time on the device
    assert took >= 0.500 + 2 * 0.5 * 0.25  # the runs and two pauses (each at least half the spacing)
