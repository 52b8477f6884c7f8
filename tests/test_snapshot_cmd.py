"""`jaxmon snapshot`: one poll and one probe, as a table or JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from jaxmon.memory import memory_numbers
from jaxmon.model import DeviceInfo, MemoryReading
from jaxmon.table import format_table
from tests.conftest import FIXTURES, ROOT
from tests.snapshots import make_snapshot

GiB = 1 << 30


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxmon", "snapshot", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "JAX_NUM_CPU_DEVICES": "8"},
    )


def test_snapshot_json_of_a_replay_holds_the_derived_numbers() -> None:
    result = _run("--replay", str(FIXTURES / "shapes.json"), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    devices = {(d["platform"], d["id"]): d for d in doc["devices"]}
    assert devices[("gpu", 1)]["memory"]["fragmentation_ratio"] == 0.5
    assert devices[("gpu", 1)]["memory"]["largest_allocatable_bytes"] == 58 * GiB
    assert devices[("gpu", 6)]["memory_error"] == "ReplayedDeviceError: XlaRuntimeError: INTERNAL: device lost"
    assert devices[("cpu", 5)]["memory"]["supported"] is False
    assert devices[("gpu", 0)]["probe"] is None  # replayed devices run no probe
    assert doc["source"] == "replay"


def test_snapshot_table_probes_every_cpu_device() -> None:
    result = _run("--probe.size", "64")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
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
