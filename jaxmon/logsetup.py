"""structlog configuration shared by jaxmon's own and stdlib loggers (apscheduler, JAX)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import structlog

LogFormat = Literal["auto", "json", "console"]

# A persisting problem (a lost device, a held-up job, an unreadable directory) is logged at most this often.
REPEAT_INTERVAL = 60.0


def configure_logging(level: str = "info", fmt: LogFormat = "auto", stream: Any = None) -> None:
    """One processor chain for everything: JSON when not on a TTY, console otherwise."""
    out = stream if stream is not None else sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: jaxmon logs seldom, and a logger cached on first use ignores every later configuration
        # (tests that capture logs after a command configured logging in the same process).
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet_scheduler_logs(max(logging.WARNING, root.level))
    # JAX logs every backend it could not start at INFO (a TPU factory exists even without libtpu); jaxmon
    # reports the backends that matter itself.
    logging.getLogger("jax").setLevel(max(logging.WARNING, root.level))
    for name in ("hypercorn.error", "hypercorn.access", "jax"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def quiet_scheduler_logs(level: int | None = logging.WARNING) -> None:
    """apscheduler's loggers at `level` (None: keep the level they have): it logs two INFO lines at every run of
    every job ("Running job ...", "... executed successfully"), 72 of a trainer's 79 lines in 30 s under
    `logging.basicConfig(level=logging.INFO)`. Its warnings (missed or skipped runs) and errors stay, but a job held
    up by a hung device would warn on every tick: that is said once a minute."""
    if level is not None:
        logging.getLogger("apscheduler").setLevel(level)
    scheduler_log = logging.getLogger("apscheduler.scheduler")
    scheduler_log.filters[:] = [f for f in scheduler_log.filters if not isinstance(f, RepeatFilter)]
    scheduler_log.addFilter(RepeatFilter(REPEAT_INTERVAL))


def ensure_library_logging() -> None:
    """Inside a workload (jaxmon.start, jaxmon.publish): never print on our own.

    apscheduler's run-by-run INFO lines are quieted (`quiet_scheduler_logs`) unless the application set a level
    on the "apscheduler" logger itself; no other logger of the application is touched. If the application has not
    configured structlog, route jaxmon's events to stdlib logging ("jaxmon.*" loggers), where the application's
    handlers, or Python's last-resort handler for warnings, take them.
    """
    own = logging.getLogger("apscheduler").level != logging.NOTSET  # the application chose: its choice stands
    quiet_scheduler_logs(None if own else logging.WARNING)
    if structlog.is_configured():
        return
    route_to_stdlib_logging()


def route_to_stdlib_logging(cache_loggers: bool = True) -> None:
    """structlog events as key=value lines on stdlib loggers named after their modules."""
    structlog.configure(
        processors=[
            structlog.stdlib.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=cache_loggers,
    )


class RepeatFilter(logging.Filter):
    """Lets the same message template for the same job through at most once per `interval` seconds."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock  # injectable so tests need not sleep through the interval
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        subject = str(getattr(args[0], "id", args[0])) if args else ""
        key = (str(record.msg), subject)
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                return False
            self._last[key] = now
        return True


class ErrorLog:
    """Logs a persisting error once, then at most once per `interval` (with how often it recurred meanwhile), and
    once more when it clears."""

    def __init__(
        self, logger: Any, interval: float = REPEAT_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self._interval = interval
        self._clock = clock  # injectable so tests need not sleep through the interval
        self._lock = threading.Lock()
        # key -> (error, when last logged, occurrences since then that were not logged)
        self._last: dict[str, tuple[str, float, int]] = {}

    def error(self, key: str, event: str, error: str, same: str | None = None, **fields: Any) -> None:
        """Report `error` for `key` (e.g. a device), throttled while the same error persists.

        `same` says which errors are the same one (default: the message). Messages that embed a changing detail,
        such as a random temporary file name, pass e.g. the exception type and errno.
        """
        identity = error if same is None else same
        now = self._clock()
        with self._lock:
            prev = self._last.get(key)
            repeated = prev is not None and prev[0] == identity
            if prev is not None and repeated and now - prev[1] < self._interval:
                self._last[key] = (prev[0], prev[1], prev[2] + 1)
                return
            suppressed = prev[2] if prev is not None and repeated else 0
            self._last[key] = (identity, now, 0)
        if repeated:
            fields["suppressed"] = suppressed  # the same error this many times since the last line
        self._log.warning(event, error=error, repeated=repeated, **fields)

    def ok(self, key: str, message: str, **fields: Any) -> None:
        """Mark `key` healthy again, logging the recovery if it was failing."""
        with self._lock:
            was = self._last.pop(key, None)
        if was is not None:
            self._log.info(message, **fields)
