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
    code, out, err = cli("snapshot", "--replay", str(FIXTURES / "shapes.json"), "--json", "--devices.include-cpu")
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


def test_snapshot_table_shows_a_tpus_reservation_beside_in_use(cli: CLI) -> None:
    """tests/fixtures/tpu_reserved.json's real v5e dict: 199.7 MiB in use, 320.1 MiB reserved, and free memory
    without the reservation (15.2 GiB, not 15.5). The host's CPU device is left out beside the TPUs."""
    code, out, err = cli("snapshot", "--replay", str(FIXTURES / "tpu_reserved.json"))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:8] == ["device", "kind", "in", "use", "reserved", "limit", "free", "frag"]
    row = lines[1].split()
    assert row[:2] == ["tpu:0", "TPU"]
    assert row[4:12] == ["199.7", "MiB", "320.1", "MiB", "15.7", "GiB", "15.2", "GiB"]
    assert not [line for line in lines if line.startswith("cpu:")]


def test_snapshot_table_has_no_reserved_column_without_reservations() -> None:
    gpu0 = DeviceInfo(id=0, platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    stats = {"bytes_in_use": GiB, "bytes_limit": 4 * GiB, "bytes_reserved": 0, "largest_free_block_bytes": GiB}
    snap = make_snapshot(devices=[gpu0], memory={gpu0.key: MemoryReading(memory_numbers(stats))})
    lines = format_table(snap).splitlines()
    assert "reserved" not in lines[0]
    assert lines[1].split()[5:9] == ["1.0", "GiB", "4.0", "GiB"]  # in use, then the limit
