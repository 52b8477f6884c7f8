"""GPM in the real daemon: `jaxmon serve` with the fake libnvidia-ml.so.1 on its LD_LIBRARY_PATH (tests/fakenvml),
scraped over HTTP on loopback. Every GPM series against the scenario (per GPU and per MIG GPU instance, one GPU with
lower SM activity than the others), a GPU without GPM, a metric that fails, a GPU lost and back, the 100 ms floor
under a fast poll, `--collector.nvml.gpm false`, and the fake's count of live samples after polls, a loss and the
daemon's exit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import Daemon, Samples, StartDaemon, sample
from tests.fakenvml import GPM_IDS, GPU_IS_LOST, Scenario, device, gpm, gpm_metrics, mig_device

FAST = ("--no-collector.probe", "--poll.interval", "0.3s", "--collector.nvml")
UNKNOWN = 999
# GPM_IDS name -> (family, pipe label)
SERIES = {
    "sm_active": ("jaxmon_device_sm_active_ratio", None),
    "sm_occupancy": ("jaxmon_device_sm_occupancy_ratio", None),
    "tensor_active": ("jaxmon_device_tensor_active_ratio", None),
    "dram_active": ("jaxmon_device_dram_active_ratio", None),
    "graphics_engine": ("jaxmon_device_graphics_engine_active_ratio", None),
    "pipe_fp64": ("jaxmon_device_pipe_active_ratio", "fp64"),
    "pipe_fp32": ("jaxmon_device_pipe_active_ratio", "fp32"),
    "pipe_fp16": ("jaxmon_device_pipe_active_ratio", "fp16"),
    "pipe_tensor_hmma": ("jaxmon_device_pipe_active_ratio", "tensor_hmma"),
    "pipe_tensor_imma": ("jaxmon_device_pipe_active_ratio", "tensor_imma"),
    "pipe_tensor_dfma": ("jaxmon_device_pipe_active_ratio", "tensor_dfma"),
    "pipe_integer": ("jaxmon_device_pipe_active_ratio", "integer"),
}
FAMILIES = {family for family, _ in SERIES.values()}
assert set(SERIES) == set(GPM_IDS)


def gpu(index: int, **extra: str) -> dict[str, str]:
    return {"device": str(index), "platform": "gpu", "source": "nvml", **extra}


def gpm_series(s: Samples, labels: dict[str, str]) -> dict[str, float]:
    """The GPM values of the series with exactly `labels` (and `pipe`), by GPM_IDS name."""
    out = {}
    for name, (family, pipe) in SERIES.items():
        value = sample(s, family, **labels, **({} if pipe is None else {"pipe": pipe}))
        if value is not None:
            out[name] = value
    return out


def want(index: int, **percent: float) -> dict[str, float]:
    """The ratios the scenario's GPM percentages make, by GPM_IDS name."""
    by_id = gpm_metrics(index, **percent)
    return {name: by_id[str(metric)] / 100 for name, metric in GPM_IDS.items()}


def live(scenario: Scenario) -> int:
    return scenario.state().get("gpm_live_samples", 0)


def test_the_daemon_exports_gpm_per_gpu_and_gpu_instance_and_frees_every_sample(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    small = mig_device(3, 0, "1g.18gb", 9, gpm=gpm(10, sm_active=15.5))
    large = mig_device(3, 1, "3g.71gb", 2, gpm=gpm(11, sm_active=77.5))
    gpus = [
        device(0),
        device(1, gpm={"supported": False}),  # not a Hopper: no GPM
        device(2, gpm=gpm(2, errors={"pipe_fp32": UNKNOWN})),
        # The slow one of the job: SM activity far under the others'.
        device(3, gpm=gpm(3, sm_active=20.5), mig={"current": 1, "max_devices": 7, "devices": [small, large]}),
    ]
    scenario = Scenario(tmp_path / "scenario.json", gpus)
    d = start_daemon(*FAST, "--collector.nvml.gpm-pipes", env=scenario.env())
    s = d.wait_for(
        lambda s: all(sample(s, "jaxmon_device_sm_active_ratio", **gpu(i)) is not None for i in (0, 2, 3)),
        what="GPM values from a second sample",
    )
    assert gpm_series(s, gpu(0)) == want(0)
    assert gpm_series(s, gpu(3)) == want(3, sm_active=20.5)
    # A failed metric is absent, never 0; the GPU's other GPM series are there.
    expected = want(2)
    del expected["pipe_fp32"]
    assert gpm_series(s, gpu(2)) == expected
    # No GPM on GPU 1: jaxmon_device_gpm_supported 0 and no GPM series.
    assert [sample(s, "jaxmon_device_gpm_supported", **gpu(i)) for i in range(4)] == [1, 0, 1, 1]
    assert not [k for k in s if k[0] in FAMILIES and ("device", "1") in k[1]]
    # Each MIG GPU instance: the same families, with the MIG device's labels.
    for entry, profile, values in (
        (small, "1g.18gb", want(10, sm_active=15.5)),
        (large, "3g.71gb", want(11, sm_active=77.5)),
    ):
        own = gpu(
            3, mig_uuid=entry["uuid"], gpu_instance=str(entry["gpu_instance"]), compute_instance="0", profile=profile
        )
        assert gpm_series(s, own) == values
    assert len([k for k in s if k[0] == "jaxmon_device_sm_active_ratio"]) == 3 + 2
    said = [e for e in events(d) if e.get("event", "").startswith("NVML GPM unsupported")]
    assert [(e["gpu"], e["level"]) for e in said] == [(1, "info")], "said once"
    assert "isSupportedDevice = 0" in said[0]["reason"]

    # Two samples per sampled unit (GPUs 0, 2, 3 and GPU 3's two instances), reused poll after poll.
    assert live(scenario) == 10
    allocated = scenario.state()["gpm_allocated"]

    # GPU 2 lost: its GPM series go and its samples are freed; back, it starts afresh.
    scenario.update(2, error=GPU_IS_LOST)
    s = d.wait_for(lambda s: sample(s, "jaxmon_device_source_up", **gpu(2)) == 0, what="GPU 2 lost")
    assert not [k for k in s if k[0] in FAMILIES and ("device", "2") in k[1]]
    assert sample(s, "jaxmon_device_gpm_supported", **gpu(2)) is None
    assert gpm_series(s, gpu(0)) == want(0), "the others keep theirs"
    assert live(scenario) == 8
    scenario.update(2, error=None, gpm=gpm(2, sm_active=66.5))
    s = d.wait_for(
        lambda s: sample(s, "jaxmon_device_sm_active_ratio", **gpu(2)) == 0.665, what="GPU 2's GPM after it returned"
    )
    assert live(scenario) == 10
    assert scenario.state()["gpm_allocated"] == allocated + 2
    assert scenario.state()["gpm_short_intervals"] == 0

    assert d.stop() == 0
    state = scenario.state()
    assert state["gpm_live_samples"] == 0, "every sample freed on shutdown"
    assert state["gpm_freed"] == state["gpm_allocated"] and state["gpm_bad_samples"] == 0


def test_a_poll_faster_than_the_floor_never_asks_for_an_interval_under_100_ms(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1)])
    d = start_daemon(
        "--no-collector.probe",
        "--poll.interval",
        "30ms",
        "--collector.nvml",
        "--collector.nvml.gpm-pipes",
        env=scenario.env(),
    )
    d.wait_for(lambda s: sample(s, "jaxmon_device_sm_active_ratio", **gpu(1)) is not None, what="GPM values")
    for _ in range(10):
        s = d.scrape()
        assert gpm_series(s, gpu(0)) == want(0)
        assert gpm_series(s, gpu(1)) == want(1)
    assert scenario.state()["gpm_short_intervals"] == 0
    assert live(scenario) == 4


def test_gpm_false_exports_no_gpm_series_and_takes_no_sample(start_daemon: StartDaemon, tmp_path: Path) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1)])
    d = start_daemon(*FAST, "--collector.nvml.gpm", "false", env=scenario.env())
    s = d.wait_for(lambda s: sample(s, "jaxmon_collector_success", collector="nvml") == 1, what="an nvml poll")
    s = d.wait_for(lambda s: sample(s, "jaxmon_device_temperature_celsius", **gpu(1)) is not None, what="a read")
    assert not [k for k in s if k[0] in FAMILIES or k[0] == "jaxmon_device_gpm_supported"]
    assert scenario.state().get("gpm_allocated", 0) == 0
    assert "GPM" not in d.log()


def events(d: Daemon) -> list[dict[str, Any]]:
    return [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
