"""What the daemon writes to its log, as a real process: a lost device warned about once a minute, "serving" and
"ready" once each, a workload appearing and going. Logging set up in-process is tests/unit/test_logging.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jaxmon.files import write_atomically
from tests.conftest import FIXTURES, Daemon, StartDaemon, sample, wait_until


def log_events(d: Daemon) -> list[dict[str, Any]]:
    """The daemon's log lines (JSON: its stderr is not a TTY)."""
    return [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]


def wait_for_event(d: Daemon, event: str, timeout: float = 20.0) -> None:
    """Wait until the daemon has logged `event`."""
    wait_until(lambda: any(e["event"] == event for e in log_events(d)), timeout, f"{event!r} logged", 0.05, d.log)


def test_a_lost_device_is_warned_about_once_a_minute_not_every_poll(start_daemon: StartDaemon) -> None:
    """A replayed device whose memory_stats() raises, polled every 100 ms for a second, is warned about once."""
    d = start_daemon("--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "100ms")
    d.wait_for(
        lambda s: (sample(s, "jaxmon_memory_read_errors_total", device="6", platform="gpu") or 0) >= 10,
        what="ten failed reads of gpu:6",
    )
    lost = [e for e in log_events(d) if e["event"] == "memory_stats failed"]
    assert [(e["device"], e["error"]) for e in lost] == [
        ("gpu:6", "ReplayedDeviceError: XlaRuntimeError: INTERNAL: device lost")
    ]


def test_a_starting_daemon_says_serving_once_then_ready_and_no_gpu_defaults_on_a_cpu_host(
    start_daemon: StartDaemon,
) -> None:
    """On CPU devices: one "serving" line, then one "ready" line once /readyz is 200; the GPU defaults stay quiet."""
    d = start_daemon("--no-collector.probe", "--poll.interval", "100ms")
    wait_for_event(d, "ready: first poll done")
    stamp = "jaxmon_collector_last_success_timestamp_seconds"
    first = d.scrape()[(stamp, frozenset({("collector", "memory")}))]
    # Polls after the first: "ready" is still said once.
    d.wait_for(lambda s: (sample(s, stamp, collector="memory") or 0) > first + 0.3, what="more polls")
    events = [e["event"] for e in log_events(d)]
    assert events[0] == "devices discovered", events  # not the GPU defaults, which change nothing here
    assert not any("GPU" in e or "Running on" in e for e in events), events
    assert [e for e in events if "serving" in e] == ["serving"]
    assert [e for e in events if e.startswith("ready")] == ["ready: first poll done"]
    assert events.index("serving") < events.index("ready: first poll done")


def test_the_sidecar_logs_a_workload_appearing_and_going(start_daemon: StartDaemon, tmp_path: Path) -> None:
    """A spool file that starts reporting is logged as appeared; when it falls silent past the TTL, as gone."""
    spool = tmp_path / "spool"
    spool.mkdir()
    doc = json.loads((FIXTURES / "spool_document.json").read_text())
    d = start_daemon(
        "--replay",
        str(FIXTURES / "shapes.json"),
        "--collector.spool.dir",
        str(spool),
        "--collector.spool.ttl",
        "1s",
        "--poll.interval",
        "100ms",
    )
    write_atomically(spool / "fixture.json", {**doc, "time": time.time(), "started": time.time()})
    wait_for_event(d, "workload appeared")
    wait_for_event(d, "workload gone")
    changes = [e for e in log_events(d) if e["event"] in ("workload appeared", "workload gone")]
    assert [(e["event"], e["workload"], e["host"], e["pid"]) for e in changes] == [
        ("workload appeared", "fixture", "host-a", 4242),
        ("workload gone", "fixture", "host-a", 4242),
    ]
