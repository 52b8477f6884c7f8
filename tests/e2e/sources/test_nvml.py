"""The NVML source (jaxmon/sources/nvml/) through NVML's real C ABI: pynvml loads the fake libnvidia-ml.so.1
(tests/fakenvml, built with gcc), and every reading is checked against the scenario the test wrote; an old driver's
library (the fake built without the newer symbols) is read in a child process, which loads it by its soname.

The nvml collector's families over this source are tests/e2e/collectors/test_nvml.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pynvml
import pytest

from jaxmon.sources.nvml import (
    GpuReading,
    MigDevice,
    NvLink,
    Nvml,
    Process,
    ProcessUtilization,
    RemappedRows,
    probe_library,
)
from tests.conftest import ROOT
from tests.fakenvml import (
    GPU_IS_LOST,
    H200_MAX_CLOCKS_MHZ,
    H200_MEMORY,
    H200_NAME,
    SONAME,
    Scenario,
    build,
    device,
    link,
    mig_device,
)
from tests.helpers import wait_until

GIB = 1 << 30


@pytest.fixture(scope="module", autouse=True)
def fake_library() -> None:
    """Load the fake once: pynvml's `CDLL("libnvidia-ml.so.1")` then finds it by its soname, as it finds a driver's."""
    ctypes.CDLL(str(build() / SONAME))


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1, minor_number=6)])
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    return scenario


def test_every_gpu_reads_as_the_scenario_has_it(scenario: Scenario, nvml: Nvml) -> None:
    scenario.update(
        1,
        clocks_event_reasons=0x40,
        ecc={"enabled": True, "corrected": 7, "uncorrected": 1},
        processes=[{"pid": 4242, "used": 3 * GIB}, {"pid": 4343, "used": None}],
    )
    zero, one = nvml.read_all()
    mhz = 1e6
    assert zero == GpuReading(
        index=0,
        name=H200_NAME,
        uuid=device(0)["uuid"],
        pci_bus_id="00000000:18:00.0",
        minor_number=0,  # the fake's default: its index
        memory_total_bytes=H200_MEMORY,
        memory_used_bytes=10 * GIB,  # v2 memory info: the driver's reservation is not counted as used
        duty_cycle_ratio=0.10,
        memory_bandwidth_utilization_ratio=0.05,
        encoder_utilization_ratio=0.0,
        decoder_utilization_ratio=0.0,
        power_watts=200.0,  # NVML reports milliwatts
        power_limit_watts=700.0,
        power_management_limit_watts=700.0,
        energy_joules_total=3_600_000.0,  # and millijoules
        temperature_celsius=40.0,
        fan_speed_ratios=None,  # an SXM board has no fans
        graphics_clock_hertz=1980 * mhz,  # and MHz
        sm_clock_hertz=1980 * mhz,
        memory_clock_hertz=2619 * mhz,
        video_clock_hertz=1755 * mhz,
        graphics_clock_max_hertz=H200_MAX_CLOCKS_MHZ["graphics"] * mhz,
        sm_clock_max_hertz=H200_MAX_CLOCKS_MHZ["sm"] * mhz,
        memory_clock_max_hertz=H200_MAX_CLOCKS_MHZ["memory"] * mhz,
        video_clock_max_hertz=H200_MAX_CLOCKS_MHZ["video"] * mhz,
        clocks_event_reasons=0,
        ecc_corrected_total=0,
        ecc_uncorrected_total=0,
        remapped_rows=RemappedRows(0, 0, pending=False, failed=False),
        pcie_tx_bytes_per_second=1000 * 1024.0,  # and KB/s (KiB)
        pcie_rx_bytes_per_second=2000 * 1024.0,
        pcie_replays_total=0,
        nvlinks=tuple(
            NvLink(n, True, (1_000_000 + 1000 * n) * 1024, (2_000_000 + 1000 * n) * 1024, 0, 0, 0, 0) for n in range(18)
        ),
        mig_enabled=False,
        mig_devices=None,
        processes=(),
        process_utilization=(),  # nothing sampled (NOT_FOUND), nothing running
        gpm_supported=True,  # an H200: GPM's values come with a second sample (test_gpm_*)
        gpm=None,
    )
    assert zero.up
    assert (one.index, one.pci_bus_id, one.minor_number, one.memory_used_bytes, one.temperature_celsius) == (
        1,
        "00000000:19:00.0",
        6,  # /dev/nvidia6: not NVML's index
        11 * GIB,
        41.0,
    )
    assert (one.clocks_event_reasons, one.ecc_corrected_total, one.ecc_uncorrected_total) == (0x40, 7, 1)
    assert (one.decoder_utilization_ratio, one.energy_joules_total, one.video_clock_hertz) == (
        0.01,
        3_601_000.0,
        1754e6,
    )
    # A process NVML gives no memory figure for is kept, with None (never 0).
    assert one.processes == (Process(4242, 3 * GIB), Process(4343, None))
    # Running, never sampled (NVML samples only busy processes): idle.
    assert one.process_utilization == (ProcessUtilization(4242, 0, 0, 0, 0, 0), ProcessUtilization(4343, 0, 0, 0, 0, 0))


def test_fans_encoder_power_energy_clocks_pcie_and_row_remapping_are_the_scenarios(
    scenario: Scenario, nvml: Nvml
) -> None:
    scenario.update(
        0,
        fans=[37, 112],  # NVML's intended speed can exceed 100 %
        encoder_util=23,
        decoder_util=71,
        power_management_limit_mw=650_500,
        energy_mj=123_456_789,
        clocks_mhz={"graphics": 1410, "sm": 1395, "memory": 2619, "video": 1215},
        max_clocks_mhz={"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1965},
        pcie={"tx_kbps": 12_345, "rx_kbps": 54_321, "replays": 17},
        remapped_rows={"correctable": 3, "uncorrectable": 1, "pending": True, "failure": True},
    )
    r = nvml.read(0)
    assert r.fan_speed_ratios == ((0, 0.37), (1, 1.12))
    assert (r.encoder_utilization_ratio, r.decoder_utilization_ratio) == (0.23, 0.71)
    assert (r.power_management_limit_watts, r.energy_joules_total) == (650.5, 123_456.789)
    assert (r.graphics_clock_hertz, r.sm_clock_hertz, r.memory_clock_hertz, r.video_clock_hertz) == (
        1410e6,
        1395e6,
        2619e6,
        1215e6,
    )
    assert (r.pcie_tx_bytes_per_second, r.pcie_rx_bytes_per_second, r.pcie_replays_total) == (
        12_345 * 1024.0,
        54_321 * 1024.0,
        17,
    )
    assert r.remapped_rows == RemappedRows(3, 1, pending=True, failed=True)
    # The other GPU keeps its own.
    other = nvml.read(1)
    assert (other.fan_speed_ratios, other.pcie_replays_total, other.remapped_rows) == (
        None,
        0,
        RemappedRows(0, 0, False, False),
    )


def test_nvlink_is_read_per_link_inactive_links_have_their_state_alone(scenario: Scenario, nvml: Nvml) -> None:
    links = [link(0, n) for n in range(4)]
    links[1] = link(0, 1, active=False, replay=9)  # a down link's counters are not read
    links[2] = link(0, 2, tx_kib=7, rx_kib=8, replay=1, recovery=2, crc_flit=3, crc_data=4)
    scenario.update(0, nvlink=links)
    scenario.update(1, nvlink=None)  # a GPU without NVLink (PCIe only)
    assert nvml.read(0).nvlinks == (
        NvLink(0, True, 1_000_000 * 1024, 2_000_000 * 1024, 0, 0, 0, 0),
        NvLink(1, False),
        NvLink(2, True, 7 * 1024, 8 * 1024, 1, 2, 3, 4),
        NvLink(3, True, 1_003_000 * 1024, 2_003_000 * 1024, 0, 0, 0, 0),
    )
    assert nvml.read(1).nvlinks is None
    # The links a GPU has are learnt once per handle; their state, traffic and errors every poll.
    links[2] = link(0, 2, active=False)
    links[3] = link(0, 3, tx_kib=100, rx_kib=200, crc_data=12)
    scenario.update(0, nvlink=links, not_supported=["nvlink_throughput"])
    read = nvml.read(0).nvlinks
    assert read is not None
    assert read[2] == NvLink(2, False)
    assert read[3] == NvLink(3, True, None, None, 0, 0, 0, 12)  # the throughput fields answered NOT_SUPPORTED


def test_mig_devices_carry_their_uuid_instance_ids_profile_memory_and_utilization(
    scenario: Scenario, nvml: Nvml
) -> None:
    small = mig_device(1, 0, "1g.18gb", 9)
    large = mig_device(1, 3, "3g.71gb", 2, compute_instance=1, utilization={"gpu": 64, "memory": 20})
    scenario.update(1, mig={"current": 1, "pending": 1, "max_devices": 7, "devices": [small, large]})
    scenario.update(0, mig=None)  # a GPU without MIG
    one = nvml.read(1)
    assert one.mig_enabled is True
    assert one.mig_devices == (
        MigDevice(
            index=0,
            uuid=small["uuid"],
            gpu_instance=9,
            compute_instance=0,
            profile="1g.18gb",
            name="NVIDIA H200 MIG 1g.18gb",
            memory_total_bytes=small["memory"]["total"],
            memory_used_bytes=GIB,
            duty_cycle_ratio=None,  # NOT_SUPPORTED for MIG devices, as current drivers answer
        ),
        MigDevice(
            index=3,  # the MIG indexes in between hold nothing (NOT_FOUND)
            uuid=large["uuid"],
            gpu_instance=2,
            compute_instance=1,
            profile="3g.71gb",
            name="NVIDIA H200 MIG 3g.71gb",
            memory_total_bytes=large["memory"]["total"],
            memory_used_bytes=4 * GIB,
            duty_cycle_ratio=0.64,
        ),
    )
    zero = nvml.read(0)
    assert (zero.mig_enabled, zero.mig_devices) == (None, None)
    # An instance destroyed and another made: the next poll has the new set.
    made = mig_device(1, 1, "2g.35gb", 5, memory={"total": 35 * GIB, "reserved": 0, "used": 0})
    scenario.update(1, mig={"current": 1, "max_devices": 7, "devices": [large, made]})
    assert [(m.index, m.profile, m.memory_used_bytes) for m in nvml.read(1).mig_devices or ()] == [
        (1, "2g.35gb", 0),
        (3, "3g.71gb", 4 * GIB),
    ]
    # MIG mode turned off: no MIG devices, whatever the instances were.
    scenario.update(1, mig={"current": 0, "devices": [large]})
    assert (nvml.read(1).mig_enabled, nvml.read(1).mig_devices) == (False, None)


def test_a_field_this_gpu_does_not_offer_is_none_and_the_gpu_stays_up(scenario: Scenario, nvml: Nvml) -> None:
    scenario.update(
        0,
        not_supported=[
            "power",
            "temperature",
            "utilization",
            "encoder",
            "energy",
            "max_clock",
            "pcie_throughput",
            "nvlink_errors",
            "remapped_rows",
            "mig",
        ],
        ecc={"enabled": False},
        clocks_mhz={"sm": 1500},  # the other clocks NOT_SUPPORTED
    )
    reading = nvml.read(0)
    assert reading.up
    assert (reading.power_watts, reading.temperature_celsius, reading.duty_cycle_ratio) == (None, None, None)
    assert reading.memory_bandwidth_utilization_ratio is None
    assert (reading.ecc_corrected_total, reading.ecc_uncorrected_total) == (None, None)  # ECC off: no counts
    assert (reading.encoder_utilization_ratio, reading.energy_joules_total, reading.remapped_rows) == (None, None, None)
    assert (reading.graphics_clock_hertz, reading.sm_clock_hertz, reading.video_clock_hertz) == (None, 1500e6, None)
    # The maxima are asked once, when the handle opens: here, at this first read.
    assert reading.sm_clock_max_hertz is None
    assert (reading.pcie_tx_bytes_per_second, reading.pcie_replays_total) == (None, 0)
    assert (reading.mig_enabled, reading.mig_devices) == (None, None)
    assert reading.nvlinks is not None and reading.nvlinks[0] == NvLink(
        0, True, 1_000_000 * 1024, 2_000_000 * 1024, None, None, None, None
    )
    assert reading.memory_used_bytes == 10 * GIB and reading.power_limit_watts == 700.0
    assert reading.decoder_utilization_ratio == 0.0


def test_any_other_error_of_one_call_fails_that_gpu_alone(scenario: Scenario, nvml: Nvml) -> None:
    scenario.update(0, fail={"nvlink_errors": 999})
    failed = nvml.read(0)
    assert failed.error is not None and failed.error.startswith("NVML_ERROR_UNKNOWN")
    assert failed.nvlinks is None and failed.memory_used_bytes is None  # nothing invented
    assert nvml.read(1).up and nvml.read(1).nvlinks is not None
    scenario.update(0, fail=None)
    assert nvml.read(0).up


def test_a_lost_gpu_reads_as_its_error_with_the_identity_it_had_and_comes_back(scenario: Scenario, nvml: Nvml) -> None:
    assert nvml.read(1).up
    scenario.update(1, error=GPU_IS_LOST)
    lost = nvml.read(1)
    assert not lost.up
    assert lost.error is not None and lost.error.startswith("NVML_ERROR_GPU_IS_LOST")
    assert (lost.name, lost.uuid, lost.pci_bus_id) == (H200_NAME, device(1)["uuid"], "00000000:19:00.0")
    assert lost.memory_used_bytes is None and lost.temperature_celsius is None  # nothing invented
    assert nvml.read(0).up  # the other GPU keeps answering
    scenario.update(1, error=None, temperature_c=77)
    back = nvml.read(1)
    assert back.up and back.temperature_celsius == 77.0


def test_closed_and_opened_again_it_reads_and_counts_xid_events_again(scenario: Scenario, nvml: Nvml) -> None:
    assert [r.up for r in nvml.read_all()] == [True, True]  # opens the handles, registered for Xid events
    scenario.xid(0, 79)
    wait_until(lambda: nvml.xid_counts() == {(0, 79): 1}, what="an Xid event counted")
    nvml.close()
    nvml.open()
    scenario.update(1, temperature_c=77)
    zero, one = nvml.read_all()
    assert zero.up and one.up and one.temperature_celsius == 77.0
    # A new NVML session: the handles re-opened and registered on its event set, the watcher running again.
    scenario.xid(1, 48)
    wait_until(lambda: nvml.xid_counts() == {(0, 79): 1, (1, 48): 1}, what="an Xid event after close and open")


def test_a_gpu_whose_handle_never_opened_has_no_identity(scenario: Scenario, nvml: Nvml) -> None:
    scenario.update(0, handle_error=GPU_IS_LOST)
    reading = nvml.read(0)
    assert reading.error is not None and reading.error.startswith("NVML_ERROR_GPU_IS_LOST")
    assert (reading.name, reading.uuid, reading.pci_bus_id) == (None, None, None)


def test_an_nvml_that_does_not_initialise_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0)], init_error=9)
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    assert probe_library() == "NVML does not initialise: NVML_ERROR_DRIVER_NOT_LOADED (Driver Not Loaded)"


# Run in a child with the legacy build on its library path: one process can load only one libnvidia-ml.so.1.
LEGACY = """
import json
from jaxmon.sources.nvml import Nvml
nvml = Nvml(xid_wait_seconds=0.05)
nvml.open()
r = nvml.read(0)
nvml.close()
print(json.dumps({"used": r.memory_used_bytes, "reasons": r.clocks_event_reasons,
                  "processes": [[p.pid, p.used_bytes] for p in r.processes or ()], "error": r.error,
                  "fans": r.fan_speed_ratios, "rows": r.remapped_rows, "mig": [r.mig_enabled, r.mig_devices],
                  "energy": r.energy_joules_total, "gpm": [r.gpm_supported, r.gpm]}))
"""


def test_an_old_driver_library_is_read_through_its_older_calls(tmp_path: Path) -> None:
    mig = {"current": 1, "devices": [mig_device(0, 0, "1g.18gb", 9)]}
    dev = device(0, clocks_event_reasons=0x8, processes=[{"pid": 5, "used": GIB}], fans=[41, 42], mig=mig)
    scenario = Scenario(tmp_path / "scenario.json", [dev])
    result = subprocess.run(
        [sys.executable, "-c", LEGACY],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **scenario.env(legacy=True)},
    )
    assert result.returncode == 0, result.stderr
    *logged, last = result.stdout.strip().splitlines()
    # v1 memory info counts the driver's reservation as used; the throttle reasons, v2 process list and the one-fan
    # speed stand in for the calls the old library lacks; the row remapper, MIG and GPM it does not have are absent
    # (GPM unsupported, FUNCTION_NOT_FOUND, said once).
    assert [line for line in logged if "GPM unsupported" in line and "FUNCTION_NOT_FOUND" in line] == logged
    assert len(logged) == 1
    assert json.loads(last) == {
        "used": 10 * GIB + (512 << 20),
        "reasons": 0x8,
        "processes": [[5, GIB]],
        "error": None,
        "fans": [[0, 0.41]],
        "rows": None,
        "mig": [None, None],
        "energy": 3_600_000.0,
        "gpm": [False, None],
    }


def _readers() -> list[str]:
    return sorted(
        t.name for t in threading.enumerate() if t.name.startswith("jaxmon-nvml-") and t.name != "jaxmon-nvml-xid"
    )


def test_healthy_gpus_share_one_reader_thread_and_a_wedged_one_holds_one_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight GPUs that answer promptly are read in turn by one thread (a thread per GPU cost a wake-up each way per
    GPU and the GIL handed between them call by call); a GPU wedged first in the queue keeps its thread, and the
    seven behind it are read by another within the same poll's deadline, poll after poll, with no third thread."""
    scenario = Scenario(tmp_path / "scenario.json", [device(i) for i in range(8)])
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    # A stall is 1/9 of the deadline: 0.33 s, which a prompt read does not take even on a loaded machine.
    nvml = Nvml(xid_wait_seconds=0.05, timeout_seconds=3.0, gpm=False)
    nvml.open()
    try:
        for _ in range(3):
            assert all(g.up for g in nvml.read_all())
        assert _readers() == ["jaxmon-nvml-reader"]
        scenario.hang(0, 30)  # the test ends it sooner, below
        for temperature in (61, 62):
            scenario.update(7, temperature_c=temperature)
            started = time.monotonic()
            gpus = nvml.read_all()
            assert time.monotonic() - started < 3.0 + 1.0  # the deadline, and a loaded machine's slack
            assert [g.up for g in gpus] == [False] + [True] * 7
            assert gpus[7].temperature_celsius == temperature
            # The wedged GPU's one thread, and one more (two, were a healthy read to stall on a loaded machine).
            assert _readers().count("jaxmon-nvml-gpu0") == 1 and len(_readers()) in (2, 3), _readers()
        scenario.update(0, hang_until=None, temperature_c=77)
        wait_until(lambda: _readers().count("jaxmon-nvml-gpu0") == 0, what="the hung read to return")
        gpus = nvml.read_all()
        assert [g.up for g in gpus] == [True] * 8 and gpus[0].temperature_celsius == 77
        assert _readers().count("jaxmon-nvml-reader") == len(_readers()) <= 3  # idle, for the next stall
    finally:
        scenario.update(0, hang_until=None)
        nvml.close()


def _utilization(sm: int, memory: int, encoder: int = 0, decoder: int = 0, **at: int) -> dict[str, int]:
    return {"sm": sm, "memory": memory, "encoder": encoder, "decoder": decoder, **at}


def test_a_time_sliced_gpus_processes_each_read_their_own_utilization(scenario: Scenario, nvml: Nvml) -> None:
    """Three processes share GPU 0 (time-slicing): each gets the scenario's SM, memory, encoder and decoder shares,
    as ratios, through nvmlDeviceGetProcessesUtilizationInfo; GPU 1, with no process, reads an empty tuple."""
    procs = [
        {"pid": 4001, "used": 20 * GIB, "utilization": _utilization(55, 30, 1, 2)},
        {"pid": 4002, "used": 10 * GIB, "utilization": _utilization(25, 12)},
        {"pid": 4003, "used": GIB, "utilization": _utilization(5, 1, 0, 7)},
    ]
    scenario.update(0, processes=procs)
    for _ in range(2):  # every poll: each process sampled again (stamped at the call) since the previous one
        zero, one = nvml.read_all()
        assert zero.process_utilization == (
            ProcessUtilization(4001, 0.55, 0.30, 0.01, 0.02, 1),
            ProcessUtilization(4002, 0.25, 0.12, 0.0, 0.0, 1),
            ProcessUtilization(4003, 0.05, 0.01, 0.0, 0.07, 1),
        )
        assert one.process_utilization == ()
    assert nvml._versions.processes_utilization_info  # the newer call answered


def test_a_poll_averages_the_samples_since_the_previous_one_and_keeps_its_timestamp(
    scenario: Scenario, nvml: Nvml
) -> None:
    """The lastSeenTimeStamp is kept per GPU between polls: a poll averages the samples NVML took since the previous
    one, a running process sampled no more reads 0, and an old sample is never counted twice."""
    t = time.time_ns() // 1000 - 10_000_000
    busy = [_utilization(40, 10, at_us=t), _utilization(80, 30, at_us=t + 1)]
    scenario.update(0, processes=[{"pid": 11, "used": GIB, "utilization": busy}, {"pid": 12, "used": GIB}])
    # GPU 1's samples carry timestamps after GPU 0's: each GPU keeps its own.
    scenario.update(1, processes=[{"pid": 21, "used": GIB, "utilization": [_utilization(9, 9, at_us=t + 500)]}])
    zero, one = nvml.read_all()
    assert zero.process_utilization == (
        ProcessUtilization(11, 0.6, 0.2, 0, 0, 2),
        ProcessUtilization(12, 0, 0, 0, 0, 0),
    )
    assert one.process_utilization == (ProcessUtilization(21, 0.09, 0.09, 0, 0, 1),)
    zero, one = nvml.read_all()  # nothing new since: both idle, not the old samples again
    assert zero.process_utilization == (ProcessUtilization(11, 0, 0, 0, 0, 0), ProcessUtilization(12, 0, 0, 0, 0, 0))
    assert one.process_utilization == (ProcessUtilization(21, 0, 0, 0, 0, 0),)
    # A new sample of 12, stamped between GPU 0's last and GPU 1's: read on GPU 0 (after its own timestamp) alone.
    later = [_utilization(20, 4, at_us=t + 2)]
    scenario.update(
        0, processes=[{"pid": 11, "used": GIB, "utilization": busy}, {"pid": 12, "used": GIB, "utilization": later}]
    )
    zero, _ = nvml.read_all()
    assert zero.process_utilization == (
        ProcessUtilization(11, 0, 0, 0, 0, 0),
        ProcessUtilization(12, 0.2, 0.04, 0, 0, 1),
    )


def test_per_process_utilization_is_none_in_mig_mode_and_where_not_supported(scenario: Scenario, nvml: Nvml) -> None:
    """MIG-enabled GPUs do not support it (nvml.h); a GPU that answers NOT_SUPPORTED has none either, and stays up."""
    procs = [{"pid": 7, "used": GIB, "utilization": _utilization(50, 5)}]
    scenario.update(0, processes=procs, mig={"current": 1, "devices": [mig_device(0, 0, "1g.18gb", 9)]})
    scenario.update(1, processes=procs, not_supported=["process_utilization"])
    zero, one = nvml.read_all()
    assert zero.up and one.up
    assert (zero.process_utilization, one.process_utilization) == (None, None)
    assert zero.processes == one.processes == (Process(7, GIB),)
    scenario.update(1, not_supported=None, fail={"process_utilization": GPU_IS_LOST})
    _, one = nvml.read_all()  # any other error fails the GPU, as every other call's does
    assert one.error is not None and "GPU_IS_LOST" in one.error


UTILIZATION = """
import json
from jaxmon.sources.nvml import Nvml
nvml = Nvml(xid_wait_seconds=0.05, gpm=False)
nvml.open()
polls = [nvml.read(0) for _ in range(3)]
versions = nvml._versions
nvml.close()
print(json.dumps({"util": [[(p.pid, p.sm) for p in r.process_utilization] if r.process_utilization is not None
                           else None for r in polls], "errors": [r.error for r in polls],
                  "versions": [versions.processes_utilization_info, versions.process_utilization]}))
"""


@pytest.mark.parametrize("variant", ["legacy", "without"])
def test_an_older_driver_falls_back_and_one_without_the_calls_reads_none_silently(variant: str, tmp_path: Path) -> None:
    """A legacy library (no nvmlDeviceGetProcessesUtilizationInfo) answers through nvmlDeviceGetProcessUtilization;
    a library with neither call gives None every poll, learnt once, with nothing logged and the GPU up."""
    dev = device(0, processes=[{"pid": 5, "used": GIB, "utilization": _utilization(33, 3)}], gpm=None)
    scenario = Scenario(tmp_path / "scenario.json", [dev])
    env = scenario.env(legacy=True) if variant == "legacy" else scenario.env(process_utilization=False)
    result = subprocess.run(
        [sys.executable, "-c", UTILIZATION],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr
    *logged, last = result.stdout.strip().splitlines()
    assert logged == []  # no error storm: not a line
    out = json.loads(last)
    assert out["errors"] == [None, None, None]
    if variant == "legacy":
        assert out["util"] == [[[5, 0.33]]] * 3
        assert out["versions"] == [False, True]
    else:
        assert out["util"] == [None, None, None]
        assert out["versions"] == [False, False]


def test_the_fakes_mig_handles_answer_as_nvmls_do(scenario: Scenario, nvml: Nvml) -> None:
    """The fake itself, through pynvml: a MIG device handle is one, leads to its GPU's handle, and GPU-wide calls on
    it are NOT_SUPPORTED (the calls jaxmon makes on MIG handles are checked above)."""
    scenario.update(1, mig={"current": 1, "devices": [mig_device(1, 0, "1g.18gb", 9)]})
    gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(gpu).value == 0
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert ctypes.cast(parent, ctypes.c_void_p).value == ctypes.cast(gpu, ctypes.c_void_p).value
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(mig)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceId(gpu)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    size = ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
    assert size == 40, f"pynvml's nvmlFieldValue_t is {size} bytes; the fake's is 40"


def test_the_fake_answers_the_calls_nvitop_makes_as_nvml_does(scenario: Scenario, nvml: Nvml) -> None:
    """The calls nvitop-exporter makes beside jaxmon's (bench/node_weight.py runs it on this fake), read through
    pynvml: the CUDA driver version, the versioned temperature, graphics processes, per-process utilization
    samples and the NVLink link count field, with the scenario's values and NVML's return codes."""
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040  # the default: CUDA 12.4, as a 550 driver reports
    scenario.data["cuda_driver_version"] = 12080
    scenario.write()
    assert pynvml.nvmlSystemGetCudaDriverVersion() == pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12080

    zero, one = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetTemperatureV(one, pynvml.NVML_TEMPERATURE_GPU) == 41
    assert ctypes.sizeof(pynvml.c_nvmlTemperature_v1_t) | (1 << 24) == pynvml.nvmlTemperature_v1
    wrong = pynvml.c_nvmlTemperature_v1_t(version=pynvml.nvmlTemperature_v1 + 1, sensorType=0)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetTemperatureV")
    assert fn(one, ctypes.byref(wrong)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH

    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(zero) == []
    utilization = {"sm": 61, "memory": 22, "encoder": 3, "decoder": 4}
    scenario.update(
        0,
        processes=[{"pid": 7001, "used": 3 * GIB, "utilization": utilization}, {"pid": 7002, "used": GIB}],
        graphics_processes=[{"pid": 7003, "used": None}],
    )
    graphics = pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3(zero)
    assert [(p.pid, p.usedGpuMemory) for p in graphics] == [(7003, None)]  # NVML_VALUE_NOT_AVAILABLE
    samples_after = pynvml.nvmlDeviceGetProcessUtilization  # the samples after a CPU timestamp, in microseconds
    before = time.time_ns() // 1000 - 1
    samples = samples_after(zero, before)
    assert [(s.pid, s.smUtil, s.memUtil, s.encUtil, s.decUtil) for s in samples] == [(7001, 61, 22, 3, 4)]
    assert before < samples[0].timeStamp <= time.time_ns() // 1000
    with pytest.raises(pynvml.NVMLError_NotFound):  # none after now, and none on a GPU no process samples
        samples_after(zero, time.time_ns() // 1000 + 60_000_000)
    with pytest.raises(pynvml.NVMLError_NotFound):
        samples_after(one, before)

    scenario.update(1, nvlink=None)
    count = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT
    (links,) = pynvml.nvmlDeviceGetFieldValues(zero, [count])
    assert (links.nvmlReturn, links.valueType, links.value.uiVal) == (0, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 18)
    (none,) = pynvml.nvmlDeviceGetFieldValues(one, [count])
    assert none.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
