"""The host's CPU backend beside an accelerator (jaxmon.sources.selection): left out by default, read when asked or
when it is all there is. Through `build_runtime` (the daemon's, `jaxmon snapshot`'s and the embedded exporter's
composition) on the replay format's second platform: tests/fixtures/tpu_reserved.json holds TPU devices and the
host's CPU device, as JAX on a TPU host starts both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxmon.compose import build_runtime, load_settings
from jaxmon.device_readings import DeviceInfo
from jaxmon.exposition import Exposition
from jaxmon.runtime import Runtime
from jaxmon.sources.replay import ReplaySource
from jaxmon.sources.selection import select_devices
from tests.conftest import CLI
from tests.helpers import FIXTURES

TPU_HOST = FIXTURES / "tpu_reserved.json"
TPUS = [f"tpu:{i}" for i in range(5)]


def device(platform: str, id: int) -> DeviceInfo:
    return DeviceInfo(id=id, platform=platform, device_kind=platform)


@pytest.mark.parametrize(
    ("platforms", "include_cpu", "kept"),
    [
        (["cpu", "tpu", "tpu"], False, ["tpu", "tpu"]),  # a TPU host: the host's CPU left out
        (["gpu", "cpu"], False, ["gpu"]),  # a GPU host
        (["cpu", "cpu"], False, ["cpu", "cpu"]),  # CPU devices alone are read
        (["cpu", "tpu"], True, ["cpu", "tpu"]),  # asked for
        ([], False, []),
    ],
)
def test_select_devices(platforms: list[str], include_cpu: bool, kept: list[str]) -> None:
    devices = [device(p, i) for i, p in enumerate(platforms)]
    read, left_out = select_devices(devices, include_cpu)
    assert [d.platform for d in read] == kept
    assert sorted(d.key for d in read + left_out) == sorted(d.key for d in devices)  # nothing lost or doubled


def rendered(rt: Runtime) -> str:
    rt.update_all_once()
    return Exposition(rt.snapshot, rt.collectors, rt.transform).render(False).decode()


@pytest.mark.parametrize("workload", [None, "trainer"])  # the daemon's runtime, and the embedded exporter's
def test_beside_tpus_the_host_cpu_has_no_series_by_default(workload: str | None) -> None:
    rt = build_runtime(load_settings(), ReplaySource(TPU_HOST), workload=workload)
    try:
        assert [d.name for d in rt.snapshot().devices] == TPUS
        text = rendered(rt)
    finally:
        rt.stop()
    assert 'platform="cpu"' not in text
    assert text.count("jaxmon_device_info{") == 5
    # The backend itself is up and says so: only its device is not read.
    assert 'jaxmon_backend_up{backend="cpu"} 1.0' in text


def test_the_host_cpu_is_read_when_asked() -> None:
    rt = build_runtime(load_settings(["--devices.include-cpu"]), ReplaySource(TPU_HOST), workload="trainer")
    try:
        assert [d.name for d in rt.snapshot().devices] == [*TPUS, "cpu:0"]
        text = rendered(rt)
    finally:
        rt.stop()
    assert 'jaxmon_memory_stats_supported{device="0",platform="cpu",workload="trainer"} 0.0' in text
    assert text.count("jaxmon_device_info{") == 6


def test_cpu_devices_alone_are_read(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"devices": [{"id": i, "platform": "cpu", "memory_stats": None} for i in range(2)]}))
    rt = build_runtime(load_settings(), ReplaySource(path))
    try:
        assert [d.name for d in rt.snapshot().devices] == ["cpu:0", "cpu:1"]
    finally:
        rt.stop()


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, TPUS),
        (("--devices.include-cpu",), {}, [*TPUS, "cpu:0"]),
        ((), {"JAXMON_DEVICES__INCLUDE_CPU": "true"}, [*TPUS, "cpu:0"]),
    ],
)
def test_snapshot_leaves_the_host_cpu_out_unless_asked(
    cli: CLI, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], env: dict[str, str], expected: list[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = cli("snapshot", "--replay", str(TPU_HOST), "--json", *args)
    assert code == 0, err
    assert [f"{d['platform']}:{d['id']}" for d in json.loads(out)["devices"]] == expected
