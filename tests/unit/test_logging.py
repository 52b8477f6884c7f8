"""configure_logging (one JSON chain for structlog and stdlib loggers) and ErrorLog's throttling, in-process.

What the daemon logs as a real process is tests/e2e/test_daemon_logging.py."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import MutableMapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from jaxmon.logsetup import ErrorLog, configure_logging, ensure_library_logging


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


def test_in_process_jaxmon_events_reach_pytests_log_capture_not_stdout(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The probe's events in a test process go through stdlib logging (tests/conftest.py), never straight to stdout."""
    structlog.get_logger("jaxmon.probe").warning("probe failed", device="cpu:0")
    assert capsys.readouterr().out == ""
    assert [(r.name, r.levelname) for r in caplog.records] == [("jaxmon.probe", "WARNING")]
    assert "probe failed" in caplog.records[0].getMessage() and "device='cpu:0'" in caplog.records[0].getMessage()


@pytest.mark.usefixtures("restore_logging")
def test_inside_a_workload_only_apschedulers_run_lines_are_quieted_and_an_applications_own_level_stands() -> None:
    """ensure_library_logging (jaxmon.start, jaxmon.publish) under a trainer's logging.basicConfig(level=INFO):
    apscheduler's INFO lines go, its warnings stay; the root, the trainer's and jax's loggers keep their levels; an
    "apscheduler" level the application set itself is left as it is."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for name in ("apscheduler", "jax"):
        logging.getLogger(name).setLevel(logging.NOTSET)
    ensure_library_logging()
    scheduler = logging.getLogger("apscheduler.executors.default")
    assert not scheduler.isEnabledFor(logging.INFO) and scheduler.isEnabledFor(logging.WARNING)
    assert root.level == logging.INFO and logging.getLogger("jax").level == logging.NOTSET
    assert logging.getLogger("trainer").isEnabledFor(logging.INFO)
    logging.getLogger("apscheduler").setLevel(logging.DEBUG)  # the application runs apscheduler of its own
    ensure_library_logging()
    assert logging.getLogger("apscheduler").level == logging.DEBUG
