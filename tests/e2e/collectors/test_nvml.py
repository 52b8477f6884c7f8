"""The nvml collector in-process, through NVML's real C ABI: pynvml loads the fake libnvidia-ml.so.1 (tests/fakenvml)
by its soname, and every number is checked against the scenario the test wrote. Building the fake takes gcc, so
these are end-to-end tests; the flags and the device matching, which need no NVML, are in
tests/unit/collectors/test_nvml.py."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.collectors.base import Context, standalone_context
from jaxmon.collectors.nvml import NvmlCollector, NvmlOptions, NvmlState
from jaxmon.collectors.spool import SpoolCollector, SpoolState
from jaxmon.device_readings import DeviceInfo
from jaxmon.exchange import DutyCycles
from jaxmon.runtime import Recorder, Runtime
from jaxmon.snapshot import Snapshot
from jaxmon.sources.nvml import CLOCKS_EVENT_REASONS
from jaxmon.sources.spool_codec import WorkloadReport
from tests.conftest import ROOT, Samples, parse_samples, sample
from tests.fakenvml import GPU_IS_LOST, H200_NAME, SONAME, Scenario, build, device, link, mig_device
from tests.helpers import wait_until

GIB = 1 << 30


@pytest.fixture(scope="module", autouse=True)
def fake_library() -> None:
    """Load the fake once: pynvml's `CDLL("libnvidia-ml.so.1")` then finds it by its soname, as it finds a driver's."""
    ctypes.CDLL(str(build() / SONAME))


@dataclass
class Rig:
    scenario: Scenario
    collector: NvmlCollector

    def poll(self, snap: Snapshot | None = None) -> tuple[bool, Samples]:
        """One update, rendered to text and parsed back."""
        update = self.collector.update()
        snap = snap or Snapshot()
        return update.success, render(self.collector, snap, update.state)


class _Families(PromCollector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from (f for f in self.families if f.samples)


def render(collector: NvmlCollector, snap: Snapshot, state: NvmlState) -> Samples:
    registry = CollectorRegistry()
    registry.register(_Families(list(collector.families(snap, state))))
    return parse_samples(generate_latest(registry).decode())


def context() -> Context:
    """The daemon's context as the nvml collector sees it: JAX on CPU devices only (no device source is read)."""
    ctx = standalone_context(None, [DeviceInfo(0, "cpu", "cpu")])  # type: ignore[arg-type]
    for channel, read in SpoolCollector.offers.items():  # as compose.py wires a running spool collector
        ctx.exchange.offer(channel, SpoolCollector.name, read)
    return ctx


def make_collector(xid_wait: float = 0.05, **options: Any) -> NvmlCollector:
    return NvmlCollector(NvmlOptions(xid_wait=xid_wait, **options), context())


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1)])
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    collector = make_collector()
    yield Rig(scenario, collector)
    collector.stop()


def gpu(index: int, **extra: str) -> dict[str, str]:
    return {"device": str(index), "platform": "gpu", "source": "nvml", **extra}


def test_every_metric_is_the_scenarios_value(rig: Rig) -> None:
    rig.scenario.update(
        1,
        memory={"total": 40 * GIB, "reserved": GIB, "used": 30 * GIB},
        utilization={"gpu": 97, "memory": 41},
        power_mw=612_345,
        power_limit_mw=650_000,
        temperature_c=83,
        clocks_mhz={"graphics": 1425, "sm": 1410, "memory": 2600, "video": 1230},
        max_clocks_mhz={"graphics": 1900, "sm": 1890, "memory": 2610, "video": 1950},
        clocks_event_reasons=0x4 | 0x40,  # SW power cap + HW thermal slowdown
        ecc={"enabled": True, "corrected": 12, "uncorrected": 2},
        processes=[{"pid": 4242, "used": 20 * GIB}, {"pid": 4343, "used": 9 * GIB}],
        fans=[30, 45],
        encoder_util=12,
        decoder_util=34,
        power_management_limit_mw=675_000,
        energy_mj=98_765_432,
        pcie={"tx_kbps": 1500, "rx_kbps": 2500, "replays": 6},
        remapped_rows={"correctable": 2, "uncorrectable": 1, "pending": True, "failure": False},
        nvlink=[
            link(1, 0, replay=3, recovery=1, crc_flit=7, crc_data=2, tx_kib=50, rx_kib=60),
            link(1, 1, active=False),
        ],
    )
    success, s = rig.poll()
    assert success
    g = gpu(1)
    assert sample(s, "jaxmon_device_source_up", **g) == 1
    assert sample(s, "jaxmon_device_memory_total_bytes", **g) == 40 * GIB
    # NVML v2 memory info: `used` is what processes use, the driver's reservation apart.
    assert sample(s, "jaxmon_device_memory_used_bytes", **g) == 30 * GIB
    assert sample(s, "jaxmon_device_duty_cycle_ratio", **g) == 0.97
    assert sample(s, "jaxmon_device_memory_bandwidth_utilization_ratio", **g) == 0.41
    assert sample(s, "jaxmon_device_power_watts", **g) == 612.345
    assert sample(s, "jaxmon_device_power_limit_watts", **g) == 650.0
    assert sample(s, "jaxmon_device_temperature_celsius", **g) == 83
    assert sample(s, "jaxmon_device_graphics_clock_hertz", **g) == 1425e6
    assert sample(s, "jaxmon_device_sm_clock_hertz", **g) == 1410e6
    assert sample(s, "jaxmon_device_memory_clock_hertz", **g) == 2600e6
    assert sample(s, "jaxmon_device_video_clock_hertz", **g) == 1230e6
    assert sample(s, "jaxmon_device_graphics_clock_max_hertz", **g) == 1900e6
    assert sample(s, "jaxmon_device_sm_clock_max_hertz", **g) == 1890e6
    assert sample(s, "jaxmon_device_memory_clock_max_hertz", **g) == 2610e6
    assert sample(s, "jaxmon_device_video_clock_max_hertz", **g) == 1950e6
    assert sample(s, "jaxmon_device_fan_speed_ratio", **g, fan="0") == 0.30
    assert sample(s, "jaxmon_device_fan_speed_ratio", **g, fan="1") == 0.45
    assert sample(s, "jaxmon_device_encoder_utilization_ratio", **g) == 0.12
    assert sample(s, "jaxmon_device_decoder_utilization_ratio", **g) == 0.34
    assert sample(s, "jaxmon_device_power_management_limit_watts", **g) == 675.0
    assert sample(s, "jaxmon_device_energy_joules_total", **g) == 98_765.432
    assert sample(s, "jaxmon_device_pcie_throughput_bytes_per_second", **g, direction="tx") == 1500 * 1024
    assert sample(s, "jaxmon_device_pcie_throughput_bytes_per_second", **g, direction="rx") == 2500 * 1024
    assert sample(s, "jaxmon_device_pcie_replays_total", **g) == 6
    assert sample(s, "jaxmon_device_remapped_rows_total", **g, kind="correctable") == 2
    assert sample(s, "jaxmon_device_remapped_rows_total", **g, kind="uncorrectable") == 1
    assert sample(s, "jaxmon_device_row_remapping_pending", **g) == 1
    assert sample(s, "jaxmon_device_row_remapping_failed", **g) == 0
    assert sample(s, "jaxmon_device_nvlink_active", **g, link="0") == 1
    assert sample(s, "jaxmon_device_nvlink_active", **g, link="1") == 0
    # Traffic and errors per GPU (the sums over its links; here link 0 alone is active).
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, direction="tx") == 50 * 1024
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, direction="rx") == 60 * 1024
    for kind, count in (("replay", 3), ("recovery", 1), ("crc_flit", 7), ("crc_data", 2)):
        assert sample(s, "jaxmon_device_nvlink_errors_total", **g, kind=kind) == count
    # Only the links' states carry a link label.
    assert {k[0] for k in s if "link" in dict(k[1])} == {"jaxmon_device_nvlink_active"}
    assert sample(s, "jaxmon_device_mig_enabled", **g) == 0
    active = {r for r in CLOCKS_EVENT_REASONS if sample(s, "jaxmon_device_throttled", **g, reason=r) == 1}
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}
    for reason in CLOCKS_EVENT_REASONS:
        assert sample(s, "jaxmon_device_throttled", **g, reason=reason) is not None
    assert sample(s, "jaxmon_device_ecc_errors_total", **g, kind="corrected") == 12
    assert sample(s, "jaxmon_device_ecc_errors_total", **g, kind="uncorrected") == 2
    assert sample(s, "jaxmon_process_device_memory_bytes", **g, pid="4242") == 20 * GIB
    assert sample(s, "jaxmon_process_device_memory_bytes", **g, pid="4343") == 9 * GIB
    info = gpu(
        1,
        uuid=device(1)["uuid"],
        pci_bus_id="00000000:19:00.0",
        name=H200_NAME,
        device_match="nvml_index",
    )
    assert s.get(("jaxmon_device_info", frozenset(info.items()))) == 1  # a `name` label: not through sample()
    # GPU 0 keeps its own values: nothing leaks across devices.
    assert sample(s, "jaxmon_device_memory_used_bytes", **gpu(0)) == 10 * GIB
    assert sample(s, "jaxmon_device_temperature_celsius", **gpu(0)) == 40
    assert sample(s, "jaxmon_device_ecc_errors_total", **gpu(0), kind="corrected") == 0
    assert sample(s, "jaxmon_device_energy_joules_total", **gpu(0)) == 3_600_000.0
    assert sample(s, "jaxmon_device_nvlink_errors_total", **gpu(0), kind="replay") == 0
    assert sample(s, "jaxmon_device_fan_speed_ratio", **gpu(0), fan="0") is None  # no fans on GPU 0 (SXM)


def test_a_changed_scenario_shows_on_the_next_poll(rig: Rig) -> None:
    _, before = rig.poll()
    assert sample(before, "jaxmon_device_duty_cycle_ratio", **gpu(0)) == 0.10
    rig.scenario.update(0, utilization={"gpu": 55, "memory": 3}, temperature_c=71)
    _, after = rig.poll()
    assert sample(after, "jaxmon_device_duty_cycle_ratio", **gpu(0)) == 0.55
    assert sample(after, "jaxmon_device_temperature_celsius", **gpu(0)) == 71


def test_a_lost_gpu_is_down_while_the_others_keep_flowing_and_comes_back(rig: Rig) -> None:
    rig.poll()
    rig.scenario.update(1, error=GPU_IS_LOST)
    success, s = rig.poll()
    assert success, "NVML answered: the lost GPU is its own source_up 0, not a failing collector"
    assert sample(s, "jaxmon_device_source_up", **gpu(1)) == 0
    assert sample(s, "jaxmon_device_source_up", **gpu(0)) == 1
    assert sample(s, "jaxmon_device_memory_used_bytes", **gpu(0)) == 10 * GIB
    # Nothing is invented for the lost GPU; its identity (read before it was lost) stays in jaxmon_device_info.
    lost = {k for k in s if ("device", "1") in k[1]}
    assert {name for name, _ in lost} == {"jaxmon_device_source_up", "jaxmon_device_info"}
    rig.scenario.update(1, error=None, temperature_c=50)
    success, s = rig.poll()
    assert success
    assert sample(s, "jaxmon_device_source_up", **gpu(1)) == 1
    assert sample(s, "jaxmon_device_temperature_celsius", **gpu(1)) == 50


def test_a_wedged_gpu_is_down_without_values_logged_once_and_comes_back_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1), device(2)])
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    collector = make_collector(timeout=1.0)  # the healthy GPUs answer within it even on a loaded machine
    rig = Rig(scenario, collector)
    try:
        rig.poll()
        scenario.hang(1, 30)  # the test ends it sooner, below
        with structlog.testing.capture_logs() as logs:
            for temperature in (61, 62, 63):
                scenario.update(0, temperature_c=temperature)
                success, s = rig.poll()
                assert success
                assert sample(s, "jaxmon_device_source_up", **gpu(1)) == 0
                # No stale value of the wedged GPU: its identity alone (read before the hang).
                assert {k[0] for k in s if ("device", "1") in k[1]} == {"jaxmon_device_source_up", "jaxmon_device_info"}
                assert sample(s, "jaxmon_device_temperature_celsius", **gpu(0)) == temperature
                assert sample(s, "jaxmon_device_source_up", **gpu(2)) == 1
            # One reader thread for the wedged GPU, however many polls found it still in its hung call.
            assert [t.name for t in threading.enumerate()].count("jaxmon-nvml-gpu1") == 1
        failed = [e for e in logs if e["event"] == "NVML GPU read failed"]
        assert [(e["gpu"], e["error"]) for e in failed] == [
            (1, "NVML did not answer within 1s (a call on this GPU hangs; its next read starts once it returns)")
        ], "logged once, not every poll"
        scenario.update(1, hang_until=None, temperature_c=77)
        deadline = time.monotonic() + 30
        while sample(s, "jaxmon_device_temperature_celsius", **gpu(1)) != 77 and time.monotonic() < deadline:
            _, s = rig.poll()
        assert sample(s, "jaxmon_device_source_up", **gpu(1)) == 1
        assert sample(s, "jaxmon_device_temperature_celsius", **gpu(1)) == 77
    finally:
        scenario.update(1, hang_until=None)
        collector.stop()


def test_a_runtime_stopped_during_a_poll_closes_nvml_once_the_poll_ends_and_nothing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1)])
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    # Polls every 0.2 s, each waiting up to 10 s for the GPUs: the hang below is within a poll's deadline.
    collector = NvmlCollector(NvmlOptions(xid_wait=0.05, timeout=10.0), replace(context(), poll_interval=0.2))
    rt = Runtime(Recorder(Snapshot()), [collector], max_staleness=60.0)
    rt.start()
    try:
        wait_until(lambda: rt.ready, what="the first poll")
        # GPU 0's calls hang for 2 s: read_all() waits for GPU 0 while GPU 1's reader is done. Closing NVML then
        # (the old stop()) cleared the readers under it: KeyError(1), and the poll logged as failed.
        scenario.update(0, hang_until=time.time() + 2, temperature_c=71)
        wait_until(lambda: scenario.blocked_calls() == 1, what="a poll inside GPU 0's hung call")
        with structlog.testing.capture_logs() as logs:
            rt.stop(wait=30.0)
        nvml = collector._nvml
        assert not nvml._open, "NVML closed by stop()"
        assert nvml._thread is None or not nvml._thread.is_alive()
        state = rt.snapshot().state("nvml", NvmlState)
        status = rt.snapshot().statuses["nvml"]
        assert state is not None and status.success, "the running poll ended cleanly and was recorded"
        assert [(g.up, g.temperature_celsius) for g in state.gpus] == [(True, 71.0), (True, 41.0)]
        assert [e for e in logs if e["log_level"] in ("warning", "error")] == []
    finally:
        scenario.update(0, hang_until=None)
        rt.stop()


def test_a_runtime_stopped_during_a_hung_poll_returns_and_closes_nvml_when_the_call_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1)])
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    collector = NvmlCollector(NvmlOptions(xid_wait=0.05, timeout=30.0), replace(context(), poll_interval=0.2))
    rt = Runtime(Recorder(Snapshot()), [collector], max_staleness=60.0)
    rt.start()
    try:
        wait_until(lambda: rt.ready, what="the first poll")
        scenario.hang(0, 30)  # the test ends it sooner, below
        wait_until(lambda: scenario.blocked_calls() == 1, what="a poll inside GPU 0's hung call")
        with structlog.testing.capture_logs() as logs:
            rt.stop(wait=0.3)  # a hung device does not block stop()
            nvml = collector._nvml
            assert nvml._open and scenario.blocked_calls() == 1, "NVML stays open under the hung call"
            scenario.update(0, hang_until=None)
            wait_until(lambda: not nvml._open, what="NVML closed once the poll returned")
        assert rt.snapshot().statuses["nvml"].success, "the poll ended cleanly"
        assert [e["event"] for e in logs if e["log_level"] in ("warning", "error")] == [
            "stopping while a poll is still running: its collector stops when the poll returns"
        ]
    finally:
        scenario.update(0, hang_until=None)
        rt.stop()


def test_the_deadline_defaults_to_2s_or_half_a_short_poll_interval() -> None:
    assert make_collector().timeout == 2.0  # the context's poll interval: 5 s
    short = NvmlCollector(NvmlOptions(), replace(context(), poll_interval=0.5))
    assert short.timeout == 0.25
    assert NvmlCollector(NvmlOptions(timeout=3.0), replace(context(), poll_interval=0.5)).timeout == 3.0


def test_when_nvml_cannot_count_the_gpus_their_readings_go_and_the_xid_counts_stay(rig: Rig) -> None:
    rig.poll()
    rig.scenario.xid(0, 79)
    deadline = time.monotonic() + 10
    while rig.collector._nvml.xid_counts() != {(0, 79): 1} and time.monotonic() < deadline:
        time.sleep(0.02)
    rig.scenario.data["count_error"] = 999
    rig.scenario.write()
    update = rig.collector.update()
    assert not update.success
    assert update.state.error == "NVML cannot count the GPUs: NVML_ERROR_UNKNOWN (Unknown Error)"
    s = render(rig.collector, Snapshot(), update.state)
    assert s == {("jaxmon_device_xid_errors_total", frozenset(gpu(0, xid="79").items())): 1}


def test_a_gpu_whose_handle_does_not_open_is_down_without_identity(rig: Rig) -> None:
    rig.scenario.update(0, handle_error=GPU_IS_LOST)
    success, s = rig.poll()
    assert success
    assert sample(s, "jaxmon_device_source_up", **gpu(0)) == 0
    assert not [k for k in s if k[0] == "jaxmon_device_info" and ("device", "0") in k[1]]
    assert sample(s, "jaxmon_device_source_up", **gpu(1)) == 1


def test_fields_the_gpu_does_not_support_are_absent_not_zero(rig: Rig) -> None:
    unsupported = [
        "power",
        "power_limit",
        "power_management_limit",
        "energy",
        "temperature",
        "clock",
        "max_clock",
        "clocks_event_reasons",
        "utilization",
        "encoder",
        "decoder",
        "remapped_rows",
        "pcie_throughput",
        "pcie_replay",
        "nvlink",
        "mig",
        "processes",
        "gpm",
    ]
    rig.scenario.update(0, not_supported=unsupported, ecc=None, processes=[{"pid": 1, "used": 5}])
    rig.scenario.update(1, ecc={"enabled": False, "corrected": 3, "uncorrected": 3})
    success, s = rig.poll()
    assert success, "an unsupported field is not a failure"
    present = {name for name, labels in s if ("device", "0") in labels}
    assert present == {
        "jaxmon_device_source_up",
        "jaxmon_device_info",
        "jaxmon_device_memory_total_bytes",
        "jaxmon_device_memory_used_bytes",
        "jaxmon_device_gpm_supported",  # 0: GPM NOT_SUPPORTED
    }
    assert sample(s, "jaxmon_device_gpm_supported", **gpu(0)) == 0
    # ECC turned off: no ECC series, although the counters hold numbers.
    assert not [k for k in s if k[0] == "jaxmon_device_ecc_errors_total" and ("device", "1") in k[1]]


def test_one_failing_call_fails_its_gpu_alone_and_it_comes_back(rig: Rig) -> None:
    rig.scenario.update(0, fail={"pcie_throughput": 999})
    success, s = rig.poll()
    assert success
    assert sample(s, "jaxmon_device_source_up", **gpu(0)) == 0
    assert sample(s, "jaxmon_device_nvlink_active", **gpu(0), link="0") is None
    assert sample(s, "jaxmon_device_nvlink_active", **gpu(1), link="0") == 1
    assert sample(s, "jaxmon_device_pcie_throughput_bytes_per_second", **gpu(1), direction="tx") == 2000 * 1024
    rig.scenario.update(0, fail=None)
    success, s = rig.poll()
    assert success and sample(s, "jaxmon_device_pcie_replays_total", **gpu(0)) == 0


def test_mig_devices_are_series_of_their_gpu_with_uuid_instances_and_profile(rig: Rig) -> None:
    small = mig_device(1, 0, "1g.18gb", 9)
    large = mig_device(1, 2, "3g.71gb", 1, compute_instance=0, utilization={"gpu": 81, "memory": 10})
    rig.scenario.update(
        1,
        mig={"current": 1, "devices": [small, large]},
        not_supported=["utilization"],  # as on a MIG GPU
    )
    success, s = rig.poll()
    assert success
    assert rig.collector.update().state.mig_uuids(1) == (small["uuid"], large["uuid"])
    assert sample(s, "jaxmon_device_mig_enabled", **gpu(1)) == 1
    assert sample(s, "jaxmon_device_mig_enabled", **gpu(0)) == 0
    assert sample(s, "jaxmon_device_duty_cycle_ratio", **gpu(1)) is None
    for entry, gi, profile in ((small, "9", "1g.18gb"), (large, "1", "3g.71gb")):
        own = gpu(1, mig_uuid=entry["uuid"], gpu_instance=gi, compute_instance="0", profile=profile)
        info = frozenset({**own, "name": f"{H200_NAME} MIG {profile}"}.items())
        assert s.get(("jaxmon_mig_device_info", info)) == 1
        assert sample(s, "jaxmon_mig_device_memory_total_bytes", **own) == entry["memory"]["total"]
        assert sample(s, "jaxmon_mig_device_memory_used_bytes", **own) == entry["memory"]["used"]
    large_labels = gpu(1, mig_uuid=large["uuid"], gpu_instance="1", compute_instance="0", profile="3g.71gb")
    assert sample(s, "jaxmon_mig_device_duty_cycle_ratio", **large_labels) == 0.81
    small_labels = gpu(1, mig_uuid=small["uuid"], gpu_instance="9", compute_instance="0", profile="1g.18gb")
    assert sample(s, "jaxmon_mig_device_duty_cycle_ratio", **small_labels) is None  # NVML does not report it
    # Only GPU 1's MIG devices: GPU 0 has MIG off.
    assert {dict(k[1])["device"] for k in s if k[0].startswith("jaxmon_mig_device")} == {"1"}


def test_a_process_without_a_memory_figure_is_absent_and_known_pids_carry_their_workload(rig: Rig) -> None:
    # The spool collector's state as it holds the reports of two workload processes.
    def report(workload: str, pid: int) -> WorkloadReport:
        return WorkloadReport(workload, "host", pid, 0, "0.10", 0.0, 0.0, (), {})

    rig.scenario.update(
        0, processes=[{"pid": 100, "used": 7 * GIB}, {"pid": 200, "used": None}, {"pid": 300, "used": 1}]
    )
    snap = Snapshot(states={"spool": SpoolState((report("trainer", 100), report("other", 999)))})
    _, s = rig.poll(snap)
    procs = {k: v for k, v in s.items() if k[0] == "jaxmon_process_device_memory_bytes"}
    assert procs == {
        ("jaxmon_process_device_memory_bytes", frozenset(gpu(0, pid="100", workload="trainer").items())): 7 * GIB,
        ("jaxmon_process_device_memory_bytes", frozenset(gpu(0, pid="300").items())): 1,
    }


def test_a_time_sliced_gpu_has_a_utilization_series_per_process_bounded_and_none_on_mig(rig: Rig) -> None:
    """Three processes share GPU 0: each has its SM, memory, encoder and decoder share (the scenario's percent as a
    ratio), labelled as its memory series; --collector.nvml.max-processes keeps the busiest by SM; a MIG GPU has
    none."""

    def util(sm: int, memory: int) -> dict[str, int]:
        return {"sm": sm, "memory": memory, "encoder": 0, "decoder": 1}

    procs = [
        {"pid": 301, "used": GIB, "utilization": util(70, 40)},
        {"pid": 302, "used": 9 * GIB, "utilization": util(60, 20)},
        {"pid": 303, "used": 4 * GIB, "utilization": util(25, 10)},
    ]
    rig.scenario.update(0, processes=procs)
    rig.scenario.update(1, processes=procs, mig={"current": 1, "devices": [mig_device(1, 0, "1g.18gb", 9)]})
    _, s = rig.poll()
    sm = {dict(k[1])["pid"]: v for k, v in s.items() if k[0] == "jaxmon_process_sm_utilization_ratio"}
    assert sm == {"301": 0.70, "302": 0.60, "303": 0.25}
    for pid, memory in (("301", 0.40), ("302", 0.20), ("303", 0.10)):
        assert sample(s, "jaxmon_process_memory_bandwidth_utilization_ratio", **gpu(0, pid=pid)) == memory
        assert sample(s, "jaxmon_process_encoder_utilization_ratio", **gpu(0, pid=pid)) == 0
        assert sample(s, "jaxmon_process_decoder_utilization_ratio", **gpu(0, pid=pid)) == 0.01
        assert sample(s, "jaxmon_process_device_memory_bytes", **gpu(0, pid=pid)) is not None  # the same labels
    # GPU 1 in MIG mode: its processes' memory, no utilization.
    assert {dict(k[1])["device"] for k in s if k[0].startswith("jaxmon_process_") and "utilization" in k[0]} == {"0"}
    assert sample(s, "jaxmon_process_device_memory_bytes", **gpu(1, pid="302")) == 9 * GIB

    bounded = make_collector(max_processes=2)
    try:
        s = render(bounded, Snapshot(), bounded.update().state)
    finally:
        bounded.stop()
    sm = {dict(k[1])["pid"]: v for k, v in s.items() if k[0] == "jaxmon_process_sm_utilization_ratio"}
    assert sm == {"301": 0.70, "302": 0.60}  # the busiest two by SM
    kept = {dict(k[1])["pid"] for k in s if k[0] == "jaxmon_process_device_memory_bytes" and ("device", "0") in k[1]}
    assert kept == {"302", "303"}  # where the memory series keep the largest two


def test_xid_events_are_counted_per_device_and_xid_and_stop_ends_the_thread(rig: Rig) -> None:
    rig.poll()  # opens the handles and registers both GPUs for Xid events
    for index, xid in ((0, 79), (1, 48), (0, 79), (0, 13)):
        rig.scenario.xid(index, xid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, s = rig.poll()
        xids = {
            (dict(k[1])["device"], dict(k[1])["xid"]): v for k, v in s.items() if k[0].startswith("jaxmon_device_xid")
        }
        if sum(xids.values()) >= 4:
            break
        time.sleep(0.05)
    assert xids == {("0", "79"): 2, ("1", "48"): 1, ("0", "13"): 1}
    assert sample(s, "jaxmon_device_xid_errors_total", **gpu(0, xid="79")) == 2
    thread = rig.collector._nvml._thread
    assert thread is not None and thread.is_alive()
    started = time.monotonic()
    rig.collector.stop()
    assert not thread.is_alive()
    assert time.monotonic() - started < 2


def test_nvml_that_does_not_initialise_is_unavailable_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0)], init_error=9)
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    reason = NvmlCollector.unavailable(NvmlOptions(), context())
    assert reason == "NVML does not initialise: NVML_ERROR_DRIVER_NOT_LOADED (Driver Not Loaded)"
    collector = make_collector()
    update = collector.update()
    assert not update.success
    assert update.state.error is not None and "DRIVER_NOT_LOADED" in update.state.error
    assert render(collector, Snapshot(), update.state) == {}
    collector.stop()


def test_without_the_library_the_collector_is_unavailable() -> None:
    # A fresh interpreter with no NVIDIA library on its path (this machine has no driver), as a CPU host is.
    code = (
        "from tests.e2e.collectors.test_nvml import NvmlCollector, NvmlOptions, context; "
        "print(NvmlCollector.unavailable(NvmlOptions(), context()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "libnvidia-ml.so.1 does not load (no NVIDIA driver library on the library path)"


def jax_gpus(*ids: int, process_index: int = 0) -> list[DeviceInfo]:
    return [DeviceInfo(i, "gpu", "NVIDIA H100 80GB HBM3", process_index=process_index) for i in ids]


def test_the_probe_gets_nvmls_duty_cycle_only_for_a_matched_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0, utilization={"gpu": 73, "memory": 1})])
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    # This daemon's JAX has CPU devices only: NVML's GPU is nobody's JAX device.
    unmatched = make_collector()
    state = unmatched.update().state
    unmatched.stop()
    assert isinstance(state, DutyCycles)
    assert state.match.how == "nvml_index"
    assert state.duty_cycle("gpu", 0) is None
    # A daemon whose JAX has the one GPU NVML has: matched, and its duty cycle is the probe's busy signal.
    ctx = standalone_context(None, jax_gpus(0))  # type: ignore[arg-type]
    matched = NvmlCollector(NvmlOptions(xid_wait=0.05), ctx)
    state = matched.update().state
    assert state.match.how == "only_gpu"
    assert state.duty_cycle("gpu", 0) == 0.73
    assert state.duty_cycle("gpu", 1) is None
    assert state.duty_cycle("tpu", 0) is None
    s = render(matched, Snapshot(), state)
    assert [dict(k[1])["device_match"] for k in s if k[0] == "jaxmon_device_info"] == ["only_gpu"]
    scenario.update(0, error=GPU_IS_LOST)
    assert matched.update().state.duty_cycle("gpu", 0) is None  # a lost GPU says nothing about busy
    matched.stop()
