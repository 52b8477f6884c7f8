"""The fault source (jaxmon/sources/faults.py): a fault file makes reads or one device's probe runs hang, and
lifting the fault ends the hang; without a file the wrapped source answers as it is.

The daemon with JAXMON_FAULTS_FILE (a hung probe marks only its device down, a stalled poll turns /healthz 503,
SIGTERM during a hang) is tests/e2e/test_daemon_cpu.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from jaxmon.device_readings import BackendStatus, DeviceInfo, ProbeKernel
from jaxmon.sources.faults import ENV_VAR, Faults, FaultySource
from jaxmon.sources.replay import ReplaySource
from tests.helpers import FIXTURES

GPU0 = DeviceInfo(id=0, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
# Longer than any test waits: a hang that ends did so because the fault was lifted.
HANG = 600


class CountingKernel:
    flops_per_step = 1.0
    footprint_bytes = 1

    def __init__(self) -> None:
        self.runs = 0

    def run(self, steps: int) -> None:
        self.runs += 1


class KernelSource:
    """Two CPU devices whose probes are counting kernels."""

    name = "test"
    runs_probes = True

    def __init__(self) -> None:
        self.kernels: dict[str, CountingKernel] = {}

    def discover(self) -> tuple[list[DeviceInfo], list[BackendStatus]]:
        return [DeviceInfo(i, "cpu", "cpu") for i in (0, 1)], [BackendStatus("cpu", True)]

    def read_memory(self, device: DeviceInfo) -> Mapping[str, Any] | None:
        return None

    def make_probe(self, device: DeviceInfo, size: int) -> ProbeKernel:
        return self.kernels.setdefault(device.name, CountingKernel())


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """`call()` on a thread of its own (daemon: a test that fails leaves no one waiting); its result, once done."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    return thread, result


def test_without_a_fault_file_the_wrapped_source_answers_as_it_is(tmp_path: Path) -> None:
    replay = ReplaySource(FIXTURES / "shapes.json")
    expected = replay.read_memory(GPU0)
    for faults in (Faults(None), Faults(str(tmp_path / "missing.json"))):
        source = FaultySource(ReplaySource(FIXTURES / "shapes.json"), faults)
        assert (source.name, source.runs_probes) == ("replay", False)
        assert source.discover() == replay.discover()
        assert source.read_memory(GPU0) == expected
        assert source.make_probe(GPU0, 8) is None  # replayed devices run no probe, faulty or not
    assert Faults(None).inactive and not Faults(str(tmp_path / "missing.json")).inactive


def test_the_fault_file_is_named_by_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert Faults.from_env().inactive
    path = tmp_path / "faults.json"
    path.write_text(json.dumps({"poll_delay_seconds": 7, "probe_delay_seconds": {"cpu:3": 2.5}}))
    monkeypatch.setenv(ENV_VAR, str(path))
    faults = Faults.from_env()
    assert (faults.poll_delay(), faults.probe_delay("cpu:3"), faults.probe_delay("cpu:2")) == (7.0, 2.5, 0.0)


@pytest.mark.parametrize(
    "content", ["{not json", "[1, 2]", '{"poll_delay_seconds": "long", "probe_delay_seconds": ["cpu:3"]}']
)
def test_a_broken_fault_file_means_no_faults(tmp_path: Path, content: str) -> None:
    path = tmp_path / "faults.json"
    path.write_text(content)
    faults = Faults(str(path))
    assert (faults.poll_delay(), faults.probe_delay("cpu:3")) == (0.0, 0.0)


def test_a_poll_delay_makes_a_read_hang_and_lifting_it_ends_the_hang(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    source = FaultySource(ReplaySource(FIXTURES / "shapes.json"), Faults(str(path)))
    expected = ReplaySource(FIXTURES / "shapes.json").read_memory(GPU0)
    path.write_text(json.dumps({"poll_delay_seconds": HANG}))
    thread, result = in_thread(lambda: source.read_memory(GPU0))
    thread.join(0.5)
    assert thread.is_alive() and result == []  # hanging in the read
    path.unlink()  # the fault is lifted
    thread.join(30)
    assert not thread.is_alive(), "the read still hangs after the fault was lifted"
    assert result == [expected]  # and then it read the device


def test_a_probe_delay_hangs_only_its_devices_runs_until_it_is_lifted(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    inner = KernelSource()
    source = FaultySource(inner, Faults(str(path)))
    cpu0, cpu1 = source.discover()[0]
    hung, other = source.make_probe(cpu0, 8), source.make_probe(cpu1, 8)
    assert hung is not None and other is not None
    assert (hung.flops_per_step, hung.footprint_bytes) == (1.0, 1)  # the wrapped kernel's, as the probe reads them
    path.write_text(json.dumps({"probe_delay_seconds": {"cpu:0": HANG}}))
    thread, _ = in_thread(lambda: hung.run(3))
    other.run(3)  # cpu:1 has no fault: it runs at once
    assert inner.kernels["cpu:1"].runs == 1
    thread.join(0.5)
    assert thread.is_alive() and inner.kernels["cpu:0"].runs == 0  # cpu:0's run hangs before the device is called
    path.write_text(json.dumps({"probe_delay_seconds": {}}))  # lifted (a new file: its mtime moves)
    thread.join(30)
    assert not thread.is_alive(), "the probe run still hangs after the fault was lifted"
    assert inner.kernels["cpu:0"].runs == 1
