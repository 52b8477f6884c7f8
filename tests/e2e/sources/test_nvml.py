"""The NVML source (jaxmon/sources/nvml.py) through NVML's real C ABI: pynvml loads the fake libnvidia-ml.so.1
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
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxmon.sources.nvml import GpuReading, Nvml, Process, probe_library
from tests.conftest import ROOT
from tests.fakenvml import GPU_IS_LOST, SONAME, Scenario, build, device

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


@pytest.fixture
def nvml(scenario: Scenario) -> Iterator[Nvml]:
    opened = Nvml(xid_wait_seconds=0.05)
    opened.open()
    yield opened
    opened.close()


def test_every_gpu_reads_as_the_scenario_has_it(scenario: Scenario, nvml: Nvml) -> None:
    scenario.update(
        1,
        clocks_event_reasons=0x40,
        ecc={"enabled": True, "corrected": 7, "uncorrected": 1},
        processes=[{"pid": 4242, "used": 3 * GIB}, {"pid": 4343, "used": None}],
    )
    zero, one = nvml.read_all()
    assert zero == GpuReading(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid=device(0)["uuid"],
        pci_bus_id="00000000:18:00.0",
        minor_number=0,  # the fake's default: its index
        memory_total_bytes=80 * GIB,
        memory_used_bytes=10 * GIB,  # v2 memory info: the driver's reservation is not counted as used
        duty_cycle_ratio=0.10,
        memory_bandwidth_utilization_ratio=0.05,
        power_watts=200.0,  # NVML reports milliwatts
        power_limit_watts=700.0,
        temperature_celsius=40.0,
        sm_clock_hertz=1980e6,  # and MHz
        clocks_event_reasons=0,
        ecc_corrected_total=0,
        ecc_uncorrected_total=0,
        processes=(),
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
    # A process NVML gives no memory figure for is kept, with None (never 0).
    assert one.processes == (Process(4242, 3 * GIB), Process(4343, None))


def test_a_field_this_gpu_does_not_offer_is_none_and_the_gpu_stays_up(scenario: Scenario, nvml: Nvml) -> None:
    scenario.update(0, not_supported=["power", "temperature", "utilization"], ecc={"enabled": False})
    reading = nvml.read(0)
    assert reading.up
    assert (reading.power_watts, reading.temperature_celsius, reading.duty_cycle_ratio) == (None, None, None)
    assert reading.memory_bandwidth_utilization_ratio is None
    assert (reading.ecc_corrected_total, reading.ecc_uncorrected_total) == (None, None)  # ECC off: no counts
    assert reading.memory_used_bytes == 10 * GIB and reading.power_limit_watts == 700.0


def test_a_lost_gpu_reads_as_its_error_with_the_identity_it_had_and_comes_back(scenario: Scenario, nvml: Nvml) -> None:
    assert nvml.read(1).up
    scenario.update(1, error=GPU_IS_LOST)
    lost = nvml.read(1)
    assert not lost.up
    assert lost.error is not None and lost.error.startswith("NVML_ERROR_GPU_IS_LOST")
    assert (lost.name, lost.uuid, lost.pci_bus_id) == ("NVIDIA H100 80GB HBM3", device(1)["uuid"], "00000000:19:00.0")
    assert lost.memory_used_bytes is None and lost.temperature_celsius is None  # nothing invented
    assert nvml.read(0).up  # the other GPU keeps answering
    scenario.update(1, error=None, temperature_c=77)
    back = nvml.read(1)
    assert back.up and back.temperature_celsius == 77.0


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
                  "processes": [[p.pid, p.used_bytes] for p in r.processes or ()], "error": r.error}))
"""


def test_an_old_driver_library_is_read_through_its_older_calls(tmp_path: Path) -> None:
    scenario = Scenario(
        tmp_path / "scenario.json", [device(0, clocks_event_reasons=0x8, processes=[{"pid": 5, "used": GIB}])]
    )
    result = subprocess.run(
        [sys.executable, "-c", LEGACY],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **scenario.env(legacy=True)},
    )
    assert result.returncode == 0, result.stderr
    # v1 memory info counts the driver's reservation as used; the throttle reasons and v2 process list stand in
    # for the calls the old library lacks.
    assert json.loads(result.stdout) == {
        "used": 10 * GIB + (512 << 20),
        "reasons": 0x8,
        "processes": [[5, GIB]],
        "error": None,
    }
