"""`jaxmon top`'s `t` key: save a trace of the training job (`/debug/trace?steps=2`) to a file in the working
directory, on a thread of its own (the trace waits for the job's steps), and say on screen where it went."""

from __future__ import annotations

import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from jaxmon.top.fetch import ClientConfig, clip

TRACE_KEYS = frozenset("tT")
TRACE_STEPS = 2
# The exporter waits up to 300 s for the steps (jaxmon.training.sampler.DEMAND_STEP_TIMEOUT), then packs the trace.
TRACE_TIMEOUT = 330.0
MAX_TRACE_BYTES = 1 << 30


def trace_url(metrics: str, steps: int = TRACE_STEPS) -> str:
    """/debug/trace of the exporter serving `metrics` (answered at the root whatever the telemetry path)."""
    parts = urlsplit(metrics)
    return urlunsplit((parts.scheme, parts.netloc, "/debug/trace", f"steps={steps}", ""))


def trace_file(metrics: str, directory: Path, now: float) -> Path:
    """`jaxmon-trace-<host>_<port>-<YYYYmmdd-HHMMSS>.tar.gz` in `directory`."""
    where = urlsplit(metrics).netloc.replace(":", "_").replace("/", "_")
    return directory / f"jaxmon-trace-{where}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}.tar.gz"


def save_trace(metrics: str, config: ClientConfig, directory: Path, now: float | None = None) -> Path:
    """Ask the exporter at `metrics` for a trace of TRACE_STEPS steps and write it to `directory`; its path. Raises
    ValueError with the exporter's answer (off, busy, not a workload, ...) or the connection's error."""
    ctx: ssl.SSLContext | None = config.ssl_context() if metrics.startswith("https:") else None
    request = urllib.request.Request(trace_url(metrics), headers=config.headers())
    try:
        with urllib.request.urlopen(request, timeout=TRACE_TIMEOUT, context=ctx) as response:
            body = response.read(MAX_TRACE_BYTES)
    except urllib.error.HTTPError as exc:
        text = exc.read(4096).decode("utf-8", "replace") if exc.fp is not None else ""
        raise ValueError(f"HTTP {exc.code}: {clip(text.strip(), 200)}") from None
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    path = trace_file(metrics, directory, time.time() if now is None else now)
    path.write_bytes(body)
    return path


class TraceSaver:
    """One trace at a time, saved from the first endpoint; `note` says what happens (for the header)."""

    def __init__(self, metrics: str, config: ClientConfig, directory: Path, on_change: Callable[[], None]) -> None:
        self.metrics = metrics
        self.config = config
        self.directory = directory
        self.on_change = on_change
        self.note = ""
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self.note = f"trace: recording {TRACE_STEPS} steps of {urlsplit(self.metrics).netloc}…"
        self._thread = threading.Thread(target=self._save, name="jaxmon-top-trace", daemon=True)
        self._thread.start()

    def _save(self) -> None:
        try:
            self.note = f"trace saved: {save_trace(self.metrics, self.config, self.directory)}"
        except ValueError as exc:
            self.note = f"trace failed: {exc}"
        self.on_change()
