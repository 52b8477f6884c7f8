"""`/debug/trace?steps=N` (or `?seconds=S`): a trace of the workload, answered as a gzip tar of its profile directory.

The archive holds `plugins/profile/<run>/<host>.xplane.pb` (and the trace viewer's `.trace.json.gz`), as
`jax.profiler.stop_trace()` writes them: XProf (TensorBoard's profile plugin) and Perfetto open it as it is. The
trace is jaxmon's session (jaxmon.sources.local.profiler): it gives way to the user's own `jax.profiler` traces, and
none is started while one runs (503). One trace at a time (409 for a second); `steps` at most MAX_DEMAND_STEPS and
`seconds` at most MAX_DEMAND_SECONDS (400 beyond). Like /debug/pprof, it is on with `--web.enable-profiling` and
only inside the training process (a daemon or sidecar has no JAX of the job's).
"""

from __future__ import annotations

import asyncio
import math
import socket
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs

import structlog

from jaxmon.sampled_traces import MAX_DEMAND_SECONDS, MAX_DEMAND_STEPS, Busy
from jaxmon.sources import InProcess
from jaxmon.web.profiling import TEXT, Response

log = structlog.get_logger("jaxmon.web.tracing")

TRACE_PATH = "/debug/trace"
TAR_TYPE = "application/gzip"


DISABLED = (
    "traces on demand are off: start the exporter with --web.enable-profiling "
    '(jaxmon.start(..., web={"enable_profiling": True}))\n'
)
NO_WORKLOAD = (
    "no workload runs in this process: a daemon or sidecar has no JAX of the training job's to trace; ask the "
    'exporter inside the training process (jaxmon.start(..., web={"enable_profiling": True}))\n'
)
NO_TRACKER = "the training collector is off in this process: traces on demand follow its steps (collector.training)\n"
USAGE = (
    f"ask for steps=N (1..{MAX_DEMAND_STEPS}, whole training steps) or seconds=S (0 < S <= {MAX_DEMAND_SECONDS:g}, "
    "for a job that is not stepping), one of the two\n"
)


def _bad(text: str) -> Response:
    return 400, TEXT, f"{text}; {USAGE}".encode(), []


def parse_request(query_string: bytes) -> tuple[int | None, float | None] | Response:
    """(steps, seconds) of the query, exactly one of them set; or the 400 that says what is wrong."""
    query = parse_qs(query_string.decode("latin-1"), keep_blank_values=True)
    unknown = sorted(set(query) - {"steps", "seconds"})
    if unknown:
        return _bad(f"unknown parameter {', '.join(unknown)}")
    if ("steps" in query) == ("seconds" in query):
        return _bad("give steps or seconds")
    if "steps" in query:
        (text,) = query["steps"][-1:]
        try:
            steps = int(text)
        except ValueError:
            return _bad(f"steps={text!r} is not a whole number")
        if not 1 <= steps <= MAX_DEMAND_STEPS:
            return _bad(f"steps={steps} is out of range")
        return steps, None
    (text,) = query["seconds"][-1:]
    try:
        seconds = float(text)
    except ValueError:
        return _bad(f"seconds={text!r} is not a number")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_DEMAND_SECONDS):
        return _bad(f"seconds={text} is out of range")
    return None, seconds


class Traces:
    """Serves traces of `in_process`'s training, one at a time."""

    def __init__(self, enabled: bool, in_process: InProcess | None) -> None:
        self.enabled = enabled
        self._in_process = in_process
        self._lock = threading.Lock()
        self._busy = False

    @property
    def available(self) -> bool:
        return self.enabled and self._in_process is not None

    async def respond(self, query_string: bytes) -> Response:
        """The gzip tar, or why not: 404 (off, no workload), 400 (bad query), 409 (one runs), 503 (the user is
        profiling), 504 (the steps did not come), 500 (JAX failed)."""
        if not self.enabled:
            return 404, TEXT, DISABLED.encode(), []
        if self._in_process is None:
            return 404, TEXT, NO_WORKLOAD.encode(), []
        demand = self._in_process.trace_demand
        if demand is None:
            return 404, TEXT, NO_TRACKER.encode(), []
        parsed = parse_request(query_string)
        if len(parsed) == 4:
            return parsed
        steps, seconds = parsed
        with self._lock:
            if self._busy:
                return 409, TEXT, b"a trace is being recorded: one at a time, ask again when it is done\n", []
            self._busy = True
        started = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="jaxmon-trace-") as directory:
                # Off the event loop: it waits for the job's steps, then writes and packs the profile.
                body = await asyncio.to_thread(demand, Path(directory), steps, seconds)
        except Busy as exc:
            text = f"the job is being profiled already (its own jax.profiler trace): jaxmon takes none now ({exc})\n"
            return 503, TEXT, text.encode(), [(b"retry-after", b"60")]
        except TimeoutError as exc:
            return 504, TEXT, f"{exc}\n".encode(), []
        except Exception as exc:
            log.warning("trace on demand failed", error=f"{type(exc).__name__}: {exc}")
            return 500, TEXT, f"trace failed: {type(exc).__name__}: {exc}\n".encode(), []
        finally:
            with self._lock:
                self._busy = False
        log.info("trace on demand served", bytes=len(body), seconds=round(time.perf_counter() - started, 3))
        name = f"jaxmon-trace-{socket.gethostname()}-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"
        return 200, TAR_TYPE, body, [(b"content-disposition", f'attachment; filename="{name}"'.encode())]
