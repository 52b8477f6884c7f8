"""The probe's baseline: persisted and restored across restarts, provisional while a device-wide source says busy.

The daemon restoring every device's baseline after a restart is in tests/e2e/test_daemon_cpu.py; a timing of spaced
shots, seconds of real time, in tests/integration/test_probe_baseline_timing.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from jaxmon.device_readings import DeviceInfo, ProbeKernel
from jaxmon.logsetup import ErrorLog
from jaxmon.probe import WARMUP_STEPS, DeviceProbe, ProbeConfig
from jaxmon.probe.baseline import SCHEMA, Baseline, BaselineStore

DEVICE = DeviceInfo(id=5, platform="gpu", device_kind="fake")
KEY = "gpu:5:fake|test"


class CountingKernel:
    """A kernel that takes 0.1 ms per step and records the step counts it was asked for."""

    flops_per_step = 100.0
    footprint_bytes = 1024

    def __init__(self) -> None:
        self.steps_asked: list[int] = []

    def run(self, steps: int) -> None:
        self.steps_asked.append(steps)
        threading.Event().wait(steps * 1e-4)


Make = Callable[..., tuple[DeviceProbe, CountingKernel]]


def probe_over(kernel: ProbeKernel, target: float = 0.001, **options: Any) -> DeviceProbe:
    """A DeviceProbe of DEVICE over `kernel`: 8 x 8, 10 s timeout, one shot per timing unless `config` says."""
    config = options.pop("config", ProbeConfig(size=8, timeout_seconds=10.0, target_seconds=target))
    errors = ErrorLog(structlog.get_logger("jaxmon.test"), 60.0)
    return DeviceProbe(DEVICE, lambda: kernel, config, errors, threading.Lock(), **options)


@pytest.fixture
def make() -> Iterator[Make]:
    probes: list[DeviceProbe] = []

    def build(
        store: BaselineStore | None = None, busy: Callable[[], bool] = lambda: False
    ) -> tuple[DeviceProbe, CountingKernel]:
        kernel = CountingKernel()
        probe = probe_over(kernel, 0.002, store=store, store_key=KEY, busy=busy)
        probes.append(probe)
        return probe, kernel

    yield build
    for p in probes:
        p.stop()
        p.join(2)


def test_a_calibration_is_saved_and_a_restart_restores_it_without_calibrating(make: Make, tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    first, _ = make(BaselineStore(path))
    first.run_once()
    st = first.status()
    assert st.baseline_origin == "calibrated"
    saved = json.loads(path.read_text())
    assert saved["schema"] == SCHEMA
    assert saved["entries"][KEY]["steps"] == st.steps
    seeds_median = saved["entries"][KEY]["seconds"]
    assert seeds_median > 0

    restarted, kernel = make(BaselineStore(path))
    restarted.run_once()
    again = restarted.status()
    assert again.baseline_origin == "restored"
    assert again.steps == st.steps
    # One warm-up run at the saved step count, then one shot (its one-step warm-up and the timed run): no
    # calibration timings at all.
    assert kernel.steps_asked == [st.steps, 1, st.steps]
    assert again.baseline_seconds is not None and again.baseline_seconds <= seeds_median
    assert again.utilization_ratio is not None


def test_a_store_under_another_key_or_a_broken_file_is_not_used(make: Make, tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    BaselineStore(path).put("gpu:5:fake|other-jax", Baseline(steps=7, seconds=0.5))
    probe, _ = make(BaselineStore(path))
    probe.run_once()
    assert probe.status().baseline_origin == "calibrated"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert BaselineStore(broken).get(KEY) is None
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"schema": "x", "entries": {KEY: {"steps": 3, "seconds": 0.1}}}))
    assert BaselineStore(foreign).get(KEY) is None


def test_a_busy_device_gets_a_provisional_baseline_and_no_estimate_until_it_is_idle(make: Make, tmp_path: Path) -> None:
    busy = [True]
    path = tmp_path / "baseline.json"
    probe, _ = make(BaselineStore(path), busy=lambda: busy[0])
    probe.run_once()
    st = probe.status()
    assert st.baseline_origin == "provisional"
    assert st.up is True  # health still works
    assert st.utilization_ratio is None
    assert not path.exists()  # a baseline taken under load is never persisted
    probe.run_once()
    assert probe.status().baseline_origin == "provisional"
    busy[0] = False
    probe.run_once()  # idle now: recalibrated
    st = probe.status()
    assert st.baseline_origin == "calibrated"
    assert st.utilization_ratio is not None
    assert KEY in json.loads(path.read_text())["entries"]


class ScriptedKernel:
    """A kernel whose timed runs take the scripted durations in turn. While calibrating a step takes 0.2 ms, so at
    a 10 ms target the timed runs have many steps and a shot's one-step warm-up is told apart (and takes no time)."""

    flops_per_step = 100.0
    footprint_bytes = 1024

    def __init__(self, script: list[float]) -> None:
        self.script = script
        self.calibrating = True

    def run(self, steps: int) -> None:
        if self.calibrating:
            threading.Event().wait(steps * 0.0002)
        elif steps != WARMUP_STEPS:
            threading.Event().wait(self.script.pop(0))


@pytest.mark.parametrize(
    ("seen_idle", "rises"),
    [(True, True), (False, False), (None, False)],
    ids=["source-says-idle", "source-says-busy", "no-source"],
)
def test_timings_a_device_wide_source_saw_idle_move_the_baseline_up_as_well_as_down(
    seen_idle: bool | None, rises: bool
) -> None:
    """7 seeds and a timing of ~10 ms, then 9 timings of 50 ms: seen idle, the window of 17 has median (9th
    smallest) 50 ms and the baseline follows the idle host up; seen busy or with no source, the 10 ms calibration
    stays the ceiling."""
    kernel = ScriptedKernel([0.050] * 9)
    probe = probe_over(kernel, 0.010, idle=lambda: seen_idle)  # one shot per timing
    try:
        probe.run_once()  # calibration (1 ms runs) and one timing of 1 ms runs
        calibrated = probe.status().baseline_seconds
        kernel.calibrating = False
        for _ in range(9):
            probe.run_once()
        st = probe.status()
    finally:
        probe.stop()
        probe.join(2)
    assert kernel.script == []
    assert calibrated is not None and calibrated < 0.030
    assert st.baseline_seconds is not None and st.last_duration_seconds is not None
    # One timed run of 50 ms, not two (their sum would be 100 ms): up to 50 ms late on a loaded machine, where a
    # thread woken from a wait can queue behind other runnable threads for tens of milliseconds.
    assert 0.050 <= st.last_duration_seconds < 0.100
    if rises:
        assert 0.050 <= st.baseline_seconds < 0.100
        assert st.utilization_ratio is not None and st.utilization_ratio < 0.5
    else:
        assert st.baseline_seconds < 0.030  # still the ~10 ms calibration's, not the 50 ms timings'
        assert st.utilization_ratio is not None and st.utilization_ratio > 0.5
