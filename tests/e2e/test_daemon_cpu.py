"""The real daemon on 8 real JAX CPU devices, scraped over HTTP."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import Samples, StartDaemon, sample, wait_until

DEVICES = [str(i) for i in range(8)]
SIZE = 64
# A calibration times seven seeds `spacing` apart on each device in turn (100 ms by default: about a second per
# device). These tests check what the probes report, not their pacing (tests/unit/collectors/test_probe.py does),
# so they wait for a shorter one.
SPACING = ("--collector.probe.spacing", "10ms")


def _cpu(s: Samples, name: str, device: str) -> float | None:
    return sample(s, name, device=device, platform="cpu")


def _unrecorded_for(s: Samples, collector: str, seconds: float) -> bool:
    """True when `collector` succeeded once but has recorded no success for `seconds` (its runs hang)."""
    stamp = sample(s, "jaxmon_collector_last_success_timestamp_seconds", collector=collector)
    return stamp is not None and time.time() - stamp > seconds


def _all_probed(s: Samples) -> bool:
    return all(_cpu(s, "jaxmon_probe_duration_seconds", d) is not None for d in DEVICES)


@pytest.mark.parametrize("each", [False, True], ids=["one-for-all", "each-cpu-device"])
def test_probe_metrics_of_the_cpu_devices(start_daemon: StartDaemon, each: bool) -> None:
    """By default one CPU device (cpu:0) is probed for all: its probe series, and every CPU device's device_up and
    utilization estimate are its. --collector.probe.each-cpu-device probes all eight, each with its own series."""
    started = time.time()
    flags = ["--collector.probe.each-cpu-device"] if each else []
    d = start_daemon(
        "--collector.probe.interval",
        "1s",
        "--collector.probe.size",
        str(SIZE),
        "--poll.interval",
        "1s",
        *SPACING,
        *flags,
    )
    probed = DEVICES if each else ["0"]
    s = d.wait_for(
        lambda s: all(_cpu(s, "jaxmon_probe_duration_seconds", dev) is not None for dev in probed),
        timeout=60,
        what=f"a probe on {len(probed)} devices",
    )
    for dev in DEVICES:
        assert _cpu(s, "jaxmon_device_up", dev) == 1
        util = _cpu(s, "jaxmon_device_utilization_ratio", dev)
        assert util is not None and 0.0 <= util <= 1.0
        if dev not in probed:  # cpu:0's answer and estimate, and no probe series of its own
            assert util == _cpu(s, "jaxmon_device_utilization_ratio", "0")
            assert not [k for k in s if k[0].startswith("jaxmon_probe_") and ("device", dev) in k[1]]
    for dev in probed:
        assert _cpu(s, "jaxmon_device_up", dev) == 1
        util = _cpu(s, "jaxmon_device_utilization_ratio", dev)
        assert util is not None and 0.0 <= util <= 1.0
        duration = _cpu(s, "jaxmon_probe_duration_seconds", dev)
        baseline = _cpu(s, "jaxmon_probe_baseline_seconds", dev)
        steps = _cpu(s, "jaxmon_probe_steps", dev)
        flops = _cpu(s, "jaxmon_probe_flops_per_second", dev)
        assert duration and baseline and steps and flops
        # Independent truth: an n x n matmul is 2 n^3 FLOPs, one per step.
        assert flops == pytest.approx(steps * 2 * SIZE**3 / duration, rel=0.01)
        # The estimate is the documented formula of the exported latency and baseline.
        assert util == pytest.approx(max(0.0, 1 - baseline / duration), abs=1e-9)
        # Footprint: x, w and the output are n x n float32 each, plus XLA's loop temporaries (one more copy).
        footprint = _cpu(s, "jaxmon_probe_memory_bytes", dev)
        assert footprint is not None and 3 * SIZE * SIZE * 4 <= footprint <= 4 * SIZE * SIZE * 4 + 1024
        assert (_cpu(s, "jaxmon_probe_runs_total", dev) or 0) >= 1
        assert _cpu(s, "jaxmon_probe_failures_total", dev) == 0
        assert _cpu(s, "jaxmon_probe_timeouts_total", dev) == 0
        busy = _cpu(s, "jaxmon_probe_busy_seconds_total", dev)
        assert busy is not None and busy >= duration
        # CPU devices have no allocator stats: supported 0 and no memory numbers.
        assert _cpu(s, "jaxmon_memory_stats_supported", dev) == 0
        assert _cpu(s, "jaxmon_memory_bytes_in_use", dev) is None
        assert (
            sample(
                s,
                "jaxmon_device_info",
                device=dev,
                platform="cpu",
                device_kind="cpu",
                process_index="0",
                coords="",
                core_on_chip="",
                source="local",
            )
            == 1
        )
    assert sample(s, "jaxmon_backend_up", backend="cpu") == 1
    assert sample(s, "jaxmon_collector_success", collector="memory") == 1
    assert sample(s, "jaxmon_collector_success", collector="probe") == 1
    for collector in ("memory", "probe"):
        stamp = sample(s, "jaxmon_collector_last_success_timestamp_seconds", collector=collector)
        assert stamp is not None and started <= stamp <= time.time(), collector
    # The memory poll reads 8 devices that return None: far below one poll interval.
    poll_seconds = sample(s, "jaxmon_collector_duration_seconds", collector="memory")
    assert poll_seconds is not None and 0 < poll_seconds < 1.0
    # The probe collector's duration is the device time of one round: the sum of the last latencies.
    round_seconds = sum(_cpu(s, "jaxmon_probe_duration_seconds", dev) or 0 for dev in probed)
    assert sample(s, "jaxmon_collector_duration_seconds", collector="probe") == pytest.approx(round_seconds, rel=0.5)
    versions = {k: v for k, v in next(iter(k for k in s if k[0] == "jaxmon_build_info"))[1]}
    assert versions["jax_version"] == metadata.version("jax")
    assert versions["jaxlib_version"] == metadata.version("jaxlib")
    assert versions["version"] == metadata.version("jaxmon")


def test_a_hung_probe_marks_only_its_device_down_and_it_recovers(start_daemon: StartDaemon, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    d = start_daemon(
        "--collector.probe.interval",
        "0.5s",
        "--collector.probe.timeout",
        "1s",
        "--collector.probe.size",
        str(SIZE),
        *SPACING,
        "--collector.probe.each-cpu-device",  # eight probes, to see one hang alone
        env={"JAXMON_FAULTS_FILE": str(faults)},
    )
    d.wait_for(_all_probed, timeout=60, what="calibration on all devices")
    faults.write_text(json.dumps({"probe_delay_seconds": {"cpu:3": 600}}))

    def only_3_down(s: Samples) -> bool:
        return all(_cpu(s, "jaxmon_device_up", dev) == (0 if dev == "3" else 1) for dev in DEVICES)

    # On a loaded machine another device's run can outlast the 1 s timeout now and then (and recover at its next
    # run): wait for a scrape where only cpu:3 is down rather than take the first one where it is.
    s = d.wait_for(only_3_down, timeout=30, what="cpu:3 down and every other device up")
    assert (_cpu(s, "jaxmon_probe_timeouts_total", "3") or 0) >= 1
    assert _cpu(s, "jaxmon_device_utilization_ratio", "3") is None  # no estimate from a device that does not answer
    assert sample(s, "jaxmon_collector_success", collector="probe") == 0
    # The hung run stays in flight: later runs are skipped, not queued behind it.
    s = d.wait_for(lambda s: (_cpu(s, "jaxmon_probe_skipped_total", "3") or 0) >= 2, timeout=30, what="skips")
    threads = len(os.listdir(f"/proc/{d.proc.pid}/task"))
    d.wait_for(lambda s: (_cpu(s, "jaxmon_probe_skipped_total", "3") or 0) >= 6, timeout=30, what="more skips")
    assert len(os.listdir(f"/proc/{d.proc.pid}/task")) <= threads, "threads pile up behind a hung probe"
    started = time.monotonic()
    assert d.get("/metrics").status_code == 200
    assert time.monotonic() - started < 1.0
    faults.unlink()
    s = d.wait_for(lambda s: _cpu(s, "jaxmon_device_up", "3") == 1, timeout=30, what="cpu:3 back up")
    assert sample(s, "jaxmon_collector_success", collector="probe") == 1
    assert "probe failed" in d.log() and "probe recovered" in d.log()


def test_health_turns_503_when_polling_stalls_and_recovers(start_daemon: StartDaemon, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    d = start_daemon(
        "--no-collector.probe",
        "--poll.interval",
        "0.5s",
        "--health.max-staleness",
        "2s",
        env={"JAXMON_FAULTS_FILE": str(faults)},
    )
    assert d.get("/healthz").status_code == 200
    faults.write_text(json.dumps({"poll_delay_seconds": 600}))
    wait_until(lambda: d.get("/healthz").status_code != 200, timeout=20, what="healthz failing", step=0.2)
    r = d.get("/healthz")
    assert r.status_code == 503 and "last memory update completed" in r.text
    assert d.get("/metrics").status_code == 200  # stale data is still served
    assert d.get("/readyz").status_code == 200  # ready stays ready
    faults.unlink()
    wait_until(lambda: d.get("/healthz").status_code == 200, timeout=20, what="healthz recovered", step=0.2)


def test_sigterm_exits_zero_within_five_seconds_even_mid_probe(start_daemon: StartDaemon, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    d = start_daemon(
        "--collector.probe.interval",
        "0.5s",
        "--collector.probe.timeout",
        "30s",
        "--collector.probe.size",
        str(SIZE),
        *SPACING,
        env={"JAXMON_FAULTS_FILE": str(faults)},
    )
    d.wait_for(lambda s: _cpu(s, "jaxmon_probe_duration_seconds", "0") is not None, timeout=60, what="calibration")
    faults.write_text(json.dumps({"probe_delay_seconds": {f"cpu:{i}": 600 for i in range(8)}}))
    # Every device's job records a run every 0.5 s; none for 1.5 s means every probe hangs in its worker thread
    # (and its scheduler thread waits for it: the timeout is 30 s).
    d.wait_for(lambda s: _unrecorded_for(s, "probe", 1.5), timeout=30, what="every probe hanging")
    started = time.monotonic()
    assert d.stop(signal.SIGTERM, timeout=10) == 0
    assert time.monotonic() - started < 5.0
    assert "shutting down" in d.log()


def test_sigint_exits_zero(start_daemon: StartDaemon) -> None:
    d = start_daemon("--no-collector.probe")
    assert d.stop(signal.SIGINT) == 0


def test_a_backend_that_fails_to_start_is_reported_and_the_rest_served(start_daemon: StartDaemon) -> None:
    # libtpu is not installed here: asking for the TPU backend explicitly makes it fail for real.
    d = start_daemon("--no-collector.probe", env={"JAX_PLATFORMS": "cpu,tpu"})
    s = d.scrape()
    assert sample(s, "jaxmon_backend_up", backend="tpu") == 0
    assert sample(s, "jaxmon_backend_up", backend="cpu") == 1
    assert all(_cpu(s, "jaxmon_memory_stats_supported", dev) == 0 for dev in DEVICES)
    assert "backend unavailable" in d.log() and "tpu" in d.log()
    assert "tpu: down" in d.get("/").text


def test_sigterm_exits_zero_within_five_seconds_while_a_poll_hangs(start_daemon: StartDaemon, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    d = start_daemon("--no-collector.probe", "--poll.interval", "0.3s", env={"JAXMON_FAULTS_FILE": str(faults)})
    faults.write_text(json.dumps({"poll_delay_seconds": 600}))
    d.wait_for(lambda s: _unrecorded_for(s, "memory", 1.0), timeout=30, what="the poll stuck")  # 3 intervals
    started = time.monotonic()
    assert d.stop(signal.SIGTERM, timeout=10) == 0
    assert time.monotonic() - started < 5.0
    assert "exiting with a device call still running" in d.log()


def test_the_daemon_restores_every_devices_baseline_after_a_restart(start_daemon: StartDaemon, tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    args = (
        "--collector.probe.baseline-file",
        str(path),
        "--collector.probe.size",
        "32",
        *SPACING,
        "--collector.probe.interval",
        "30s",
        "--collector.probe.each-cpu-device",  # one baseline per device in the file
    )

    def all_with_origin(origin: str) -> Callable[[dict[tuple[str, frozenset[tuple[str, str]]], float]], bool]:
        return lambda s: all(
            sample(s, "jaxmon_probe_baseline_info", device=str(i), platform="cpu", origin=origin) == 1.0
            for i in range(8)
        )

    first = start_daemon(*args)
    first.wait_for(all_with_origin("calibrated"), what="every device calibrated")
    first.stop()
    assert len(json.loads(path.read_text())["entries"]) == 8
    second = start_daemon(*args)
    restored = all_with_origin("restored")

    def restored_and_up(s: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> bool:
        # The origin is set when the baseline is restored; device_up when that first timing (its shots) ends.
        return restored(s) and all(
            sample(s, "jaxmon_device_up", device=str(i), platform="cpu") == 1.0 for i in range(8)
        )

    second.wait_for(restored_and_up, what="every device restored and probed")
