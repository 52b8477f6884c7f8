"""`jaxmon snapshot`: one poll and one probe, as a table or JSON (cli.main in-process, on real JAX CPU devices)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from jaxmon.allocator import memory_numbers
from jaxmon.device_readings import DeviceInfo, MemoryReading
from jaxmon.table import format_table
from tests.conftest import CLI, FIXTURES
from tests.snapshots import make_snapshot

GiB = 1 << 30


@pytest.fixture
def restore_environ() -> Iterator[None]:
    """Put os.environ back: a local source sets the sidecar's GPU variables, which later daemons would inherit."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_snapshot_json_of_a_replay_holds_the_derived_numbers(cli: CLI) -> None:
    code, out, err = cli("snapshot", "--replay", str(FIXTURES / "shapes.json"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    devices = {(d["platform"], d["id"]): d for d in doc["devices"]}
    assert devices[("gpu", 1)]["memory"]["fragmentation_ratio"] == 0.5
    assert devices[("gpu", 1)]["memory"]["largest_allocatable_bytes"] == 58 * GiB
    assert devices[("gpu", 6)]["memory_error"] == "ReplayedDeviceError: XlaRuntimeError: INTERNAL: device lost"
    assert devices[("cpu", 5)]["memory"]["supported"] is False
    assert devices[("gpu", 0)]["probe"] is None  # replayed devices run no probe
    assert doc["source"] == "replay"


@pytest.mark.usefixtures("restore_environ")
def test_snapshot_table_probes_every_cpu_device(cli: CLI) -> None:
    code, out, err = cli("snapshot", "--collector.probe.size", "64")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].split()[:2] == ["device", "kind"]
    rows = [line.split() for line in lines[1:] if line.startswith("cpu:")]
    assert [r[0] for r in rows] == [f"cpu:{i}" for i in range(8)]
    for r in rows:
        assert r[2] == "unsupported"  # CPU devices have no allocator stats
        assert r[-1] == "yes"  # the probe answered
        assert float(r[-4]) > 0  # probe ms
        assert 0.0 <= float(r[-2]) <= 1.0  # utilization


def test_a_device_error_is_printed_whole_under_the_table() -> None:
    """A long memory_stats() error is not cut in the memory column: the row points below, where it is whole."""
    error = "XlaRuntimeError: INTERNAL: CUDA error: an illegal memory access was encountered (device lost)"
    gpu0 = DeviceInfo(id=0, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    gpu1 = DeviceInfo(id=1, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    snap = make_snapshot(
        devices=[gpu0, gpu1],
        memory={gpu0.key: MemoryReading(numbers=None, error=error), gpu1.key: MemoryReading(memory_numbers(None))},
    )
    lines = format_table(snap).splitlines()
    assert lines[1].split()[:5] == ["gpu:0", "NVIDIA", "H100", "80GB", "HBM3"]
    assert "error (below)" in lines[1] and error not in lines[1]
    assert "unsupported" in lines[2]
    assert lines[3] == f"gpu:0: memory_stats failed: {error}"
