"""configure_logging (one JSON chain for structlog and stdlib loggers) and ErrorLog's throttling."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import MutableMapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from jaxmon.files import write_atomically
from jaxmon.logsetup import ErrorLog, configure_logging
from tests.conftest import FIXTURES, Daemon, StartDaemon, sample, wait_until


class FakeClock:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """Every line written to `stream`, each parsed as one JSON object."""
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def assert_recent_utc(timestamp: str) -> None:
    """`timestamp` is ISO 8601 in UTC and within a minute of now."""
    parsed = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    assert parsed.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - parsed) < timedelta(minutes=1)


@pytest.mark.usefixtures("restore_logging")
def test_stdlib_and_structlog_records_both_come_out_as_json_lines() -> None:
    """apscheduler's stdlib warning and a structlog event share one JSON shape: event, level, logger, timestamp."""
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    logging.getLogger("apscheduler.scheduler").warning("Run time of job %s was missed by %s", "poll", "0:00:01")
    structlog.get_logger("x").info("hello", a=1)
    first, second = json_lines(out)
    assert first["event"] == "Run time of job poll was missed by 0:00:01"
    assert first["level"] == "warning"
    assert first["logger"] == "apscheduler.scheduler"
    assert_recent_utc(first["timestamp"])
    assert second["event"] == "hello"
    assert second["level"] == "info"
    assert second["logger"] == "x"
    assert second["a"] == 1
    assert_recent_utc(second["timestamp"])


@pytest.mark.usefixtures("restore_logging")
def test_apscheduler_and_jax_info_records_are_dropped_but_their_warnings_kept() -> None:
    """At level info, apscheduler's per-job INFO chatter and JAX's backend INFO lines are not written."""
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    logging.getLogger("apscheduler.executors.default").info("Job executed successfully")
    logging.getLogger("jax._src.xla_bridge").info("Unable to initialize backend 'tpu'")
    logging.getLogger("jax._src.xla_bridge").warning("a real warning")
    assert [line["event"] for line in json_lines(out)] == ["a real warning"]


@pytest.mark.usefixtures("restore_logging")
def test_the_level_filters_structlog_events() -> None:
    """At level warning an info event is dropped and a warning kept."""
    out = io.StringIO()
    configure_logging("warning", "json", stream=out)
    log = structlog.get_logger("jaxmon.test")
    log.info("quiet")
    log.warning("loud", device="gpu:0")
    lines = json_lines(out)
    assert [(line["event"], line["level"], line["device"]) for line in lines] == [("loud", "warning", "gpu:0")]


def warnings_of(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    """The captured warning events."""
    return [e for e in logs if e["log_level"] == "warning"]


def test_error_log_logs_an_error_once_and_suppresses_the_identical_repeat() -> None:
    """The first error is logged; the same error again within the interval is not."""
    with capture_logs() as logs:
        errors = ErrorLog(structlog.get_logger("jaxmon.test"), interval=60.0)
        errors.error("memory/gpu:0", "memory_stats failed", "XlaRuntimeError: lost", device="gpu:0")
        errors.error("memory/gpu:0", "memory_stats failed", "XlaRuntimeError: lost", device="gpu:0")
    assert logs == [
        {
            "event": "memory_stats failed",
            "error": "XlaRuntimeError: lost",
            "repeated": False,
            "device": "gpu:0",
            "log_level": "warning",
        }
    ]


def test_error_log_logs_again_when_the_message_changes() -> None:
    """A different error for the same key is news, even within the interval."""
    with capture_logs() as logs:
        errors = ErrorLog(structlog.get_logger("jaxmon.test"), interval=60.0)
        errors.error("probe/cpu:1", "probe failed", "first")
        errors.error("probe/cpu:1", "probe failed", "second")
        errors.error("probe/cpu:1", "probe failed", "second")
    assert [(e["error"], e["repeated"]) for e in warnings_of(logs)] == [("first", False), ("second", False)]


def test_error_log_keys_are_throttled_independently() -> None:
    """The same error on two keys (two devices) is logged once for each."""
    with capture_logs() as logs:
        errors = ErrorLog(structlog.get_logger("jaxmon.test"), interval=60.0)
        errors.error("memory/gpu:0", "memory_stats failed", "lost", device="gpu:0")
        errors.error("memory/gpu:1", "memory_stats failed", "lost", device="gpu:1")
    assert [e["device"] for e in warnings_of(logs)] == ["gpu:0", "gpu:1"]


def test_error_log_logs_a_persisting_error_again_after_the_interval() -> None:
    """Once the interval has passed the same error is logged again, marked as repeated."""
    clock = FakeClock()
    with capture_logs() as logs:
        errors = ErrorLog(structlog.get_logger("jaxmon.test"), interval=60.0, clock=clock)
        errors.error("memory/gpu:0", "memory_stats failed", "lost")
        clock.now += 59.9
        errors.error("memory/gpu:0", "memory_stats failed", "lost")  # within the interval
        clock.now += 0.1
        errors.error("memory/gpu:0", "memory_stats failed", "lost")
        clock.now += 59.9
        errors.error("memory/gpu:0", "memory_stats failed", "lost")  # within the new interval again
    assert [e["repeated"] for e in warnings_of(logs)] == [False, True]


def test_error_log_ok_logs_the_recovery_once_and_only_after_a_failure() -> None:
    """ok() is silent for a healthy key, logs one recovery after an error, then is silent again."""
    with capture_logs() as logs:
        errors = ErrorLog(structlog.get_logger("jaxmon.test"), interval=60.0)
        errors.ok("probe/cpu:0", "probe recovered", device="cpu:0")
        errors.error("probe/cpu:0", "probe failed", "timeout", device="cpu:0")
        errors.ok("probe/cpu:0", "probe recovered", device="cpu:0")
        errors.ok("probe/cpu:0", "probe recovered", device="cpu:0")
    assert [(e["event"], e["log_level"]) for e in logs] == [("probe failed", "warning"), ("probe recovered", "info")]
    assert logs[1]["device"] == "cpu:0"


def test_error_log_logs_a_recurring_error_at_once_after_a_recovery() -> None:
    """After ok() the throttle is reset: the same error coming back is logged immediately."""
    with capture_logs() as logs:
        errors = ErrorLog(structlog.get_logger("jaxmon.test"), interval=60.0)
        errors.error("memory/gpu:0", "memory_stats failed", "lost")
        errors.ok("memory/gpu:0", "device memory readable again")
        errors.error("memory/gpu:0", "memory_stats failed", "lost")
    assert [e["event"] for e in logs] == ["memory_stats failed", "device memory readable again", "memory_stats failed"]
    assert [e["repeated"] for e in warnings_of(logs)] == [False, False]


def test_repeat_filter_lets_a_scheduler_warning_through_once_per_interval() -> None:
    """A job held up by a hung device warns on every tick; the filter keeps one per job and interval."""
    from jaxmon.logsetup import RepeatFilter

    class Job:
        def __init__(self, job_id: str) -> None:
            self.id = job_id

    clock = FakeClock()
    f = RepeatFilter(60.0, clock=clock)
    template = 'Execution of job "%s" skipped: maximum number of running instances reached (%d)'

    def record(job: str) -> logging.LogRecord:
        return logging.LogRecord("apscheduler.scheduler", logging.WARNING, __file__, 1, template, (Job(job), 1), None)

    assert f.filter(record("poll")) is True
    assert f.filter(record("poll")) is False
    assert f.filter(record("probe-cpu:0")) is True  # another job is another message
    clock.now += 59.9
    assert f.filter(record("poll")) is False
    clock.now += 0.1
    assert f.filter(record("poll")) is True
    assert f.filter(record("poll")) is False


def test_error_log_says_how_often_a_held_back_error_recurred() -> None:
    """The repeat logged after the interval carries the number of identical errors held back meanwhile."""
    clock = FakeClock()
    with capture_logs() as logs:
        errors = ErrorLog(structlog.get_logger("jaxmon.test"), interval=60.0, clock=clock)
        for _ in range(3):
            errors.error("memory/gpu:0", "memory_stats failed", "lost")
        clock.now += 60.0
        errors.error("memory/gpu:0", "memory_stats failed", "lost")
    assert [(e["repeated"], e.get("suppressed")) for e in warnings_of(logs)] == [(False, None), (True, 2)]


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


def test_in_process_jaxmon_events_reach_pytests_log_capture_not_stdout(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The probe's events in a test process go through stdlib logging (tests/conftest.py), never straight to stdout."""
    structlog.get_logger("jaxmon.probe").warning("probe failed", device="cpu:0")
    assert capsys.readouterr().out == ""
    assert [(r.name, r.levelname) for r in caplog.records] == [("jaxmon.probe", "WARNING")]
    assert "probe failed" in caplog.records[0].getMessage() and "device='cpu:0'" in caplog.records[0].getMessage()
