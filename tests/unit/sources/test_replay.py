"""The replay source (jaxmon/sources/replay.py) on the replay files the suite and the demo ship: tests/fixtures/
shapes.json (one device per allocator shape, tests/fixtures/README.md) and deploy/demo/replay.json.

The daemon serving shapes.json over HTTP is tests/e2e/test_daemon_replay.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxmon.device_readings import BackendStatus, DeviceInfo
from jaxmon.sources.replay import ReplayedDeviceError, ReplayError, ReplaySource
from tests.helpers import FIXTURES, ROOT

SHAPES = FIXTURES / "shapes.json"


def recorded(platform: str, device: int) -> object:
    """The entry of shapes.json for one device, as the file has it."""
    doc = json.loads(SHAPES.read_text())
    return next(d for d in doc["devices"] if (d["platform"], d["id"]) == (platform, device))


def test_shapes_json_discovers_every_recorded_device_with_its_identity() -> None:
    devices, backends = ReplaySource(SHAPES).discover()
    assert [d.name for d in devices] == [
        "gpu:0", "gpu:1", "gpu:2", "tpu:3", "gpu:4", "cpu:5", "gpu:6", "gpu:7", "gpu:8",
    ]  # fmt: skip
    # The TPU's topology as labels take it: coords joined with commas, its core on the chip.
    (tpu,) = [d for d in devices if d.platform == "tpu"]
    assert tpu == DeviceInfo(id=3, platform="tpu", device_kind="TPU v5 lite", coords="1,0,0", core_on_chip=0)
    assert all(d.coords is None and d.core_on_chip is None for d in devices if d.platform != "tpu")
    # One backend per recorded platform, every one up.
    assert backends == [BackendStatus("cpu", True), BackendStatus("gpu", True), BackendStatus("tpu", True)]
    assert ReplaySource(SHAPES).runs_probes is False


def test_each_device_reads_back_its_recorded_stats_and_the_failing_one_raises() -> None:
    source = ReplaySource(SHAPES)
    devices = {d.name: d for d in source.discover()[0]}
    for name in ("gpu:0", "gpu:1", "gpu:2", "tpu:3", "gpu:4", "gpu:7"):
        platform, device = name.split(":")
        entry = recorded(platform, int(device))
        assert isinstance(entry, dict)
        assert source.read_memory(devices[name]) == entry["memory_stats"], name
    assert source.read_memory(devices["cpu:5"]) is None  # a backend without allocator stats
    with pytest.raises(ReplayedDeviceError, match=r"^XlaRuntimeError: INTERNAL: device lost$"):
        source.read_memory(devices["gpu:6"])
    # Replayed devices run no probe.
    assert source.make_probe(devices["gpu:0"], 64) is None


def test_a_recorded_list_is_replayed_one_entry_per_read_cycling_per_device() -> None:
    source = ReplaySource(SHAPES)
    devices = {d.name: d for d in source.discover()[0]}
    reads = [source.read_memory(devices["gpu:8"]) for _ in range(7)]
    in_use = [r["bytes_in_use"] if r is not None else None for r in reads]
    assert in_use == [1000, 2000, 3000, 1000, 2000, 3000, 1000]
    # Another source on the same file starts at the first entry again: the cursor is the source's.
    again = ReplaySource(SHAPES)
    first = again.read_memory(devices["gpu:8"])
    assert first is not None and first["bytes_in_use"] == 1000


def test_the_demo_replay_file_reads_on_every_device() -> None:
    """The README's demo: eight recorded GPUs, each readable (none fails on purpose, unlike shapes.json)."""
    source = ReplaySource(ROOT / "deploy" / "demo" / "replay.json")
    devices, backends = source.discover()
    assert [d.platform for d in devices] == ["gpu"] * 8 and [d.id for d in devices] == list(range(8))
    assert backends == [BackendStatus("gpu", True)]
    for device in devices:
        stats = source.read_memory(device)
        assert stats is not None and stats["bytes_in_use"] is not None, device.name


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ('{"devices": [{"id": 0, "platform": "gpu", "memory_stats": {"bytes_in_use": "lots"}}]}',
         "devices.0.memory_stats.bytes_in_use: must be a number (got 'lots')"),
        ('{"devices": [{"id": 0, "platform": "gpu"}, {"id": 0, "platform": "gpu"}]}', "device gpu:0 appears twice"),
        ('{"devices": [{"id": 0, "platform": "gpu", "memory_stats": []}]}', "at least one dict"),
        ('{"devices": [{"id": 0, "platform": "gpu", "colour": "red"}]}', "devices.0.colour: no such field"),
    ],
)  # fmt: skip
def test_a_file_that_does_not_validate_is_refused_naming_the_file_and_the_field(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "replay.json"
    path.write_text(content)
    with pytest.raises(ReplayError) as err:
        ReplaySource(path)
    assert str(err.value).startswith(f"replay file {path}: ")
    assert message in str(err.value)
