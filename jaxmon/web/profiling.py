"""`/debug/pprof/device_memory`: the workload's live device buffers as a pprof profile, rate-limited.

`jax.profiler.device_memory_profile()` walks every live buffer of the process while holding JAX's locks, so a
scraper looping on the endpoint must not be able to stall training: one profile at a time, and at most one per
`min_interval` seconds; other requests are answered 429 with Retry-After at once.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import structlog

from jaxmon.sources import InProcess

log = structlog.get_logger("jaxmon.web.profiling")

PPROF_PATH = "/debug/pprof/device_memory"
PPROF_TYPE = "application/octet-stream"
TEXT = "text/plain; charset=utf-8"

Response = tuple[int, str, bytes, list[tuple[bytes, bytes]]]

DISABLED = (
    "device memory profiling is off: start the exporter with --web.enable-profiling "
    '(jaxmon.start(..., web={"enable_profiling": True}))\n'
)
NO_WORKLOAD = (
    "no workload runs in this process: a sidecar holds none of the trainer's device buffers, so it has no "
    "device memory profile to give; enable profiling on the exporter inside the training process "
    '(jaxmon.start(..., web={"enable_profiling": True}))\n'
)


class DeviceMemoryProfiles:
    """Serves device memory profiles of `in_process`, one at a time and at most one per `min_interval` seconds."""

    def __init__(self, enabled: bool, in_process: InProcess | None, min_interval: float = 5.0) -> None:
        self.enabled = enabled
        self._in_process = in_process
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._busy = False
        self._last_start: float | None = None

    @property
    def available(self) -> bool:
        """True when on and this process is a workload (the landing page links it only then)."""
        return self.enabled and self._in_process is not None

    def _claim(self) -> float | None:
        """Take the slot for one profile; None when taken, else seconds to wait before asking again."""
        now = time.monotonic()
        with self._lock:
            if self._busy:
                return self.min_interval
            if self._last_start is not None and now - self._last_start < self.min_interval:
                return self.min_interval - (now - self._last_start)
            self._busy = True
            self._last_start = now
            return None

    async def respond(self) -> Response:
        """The gzipped profile, or why not: 404 (off, or no workload here), 429 (too soon), 500 (JAX failed)."""
        if not self.enabled:
            return 404, TEXT, DISABLED.encode(), []
        if self._in_process is None:
            return 404, TEXT, NO_WORKLOAD.encode(), []
        wait = self._claim()
        if wait is not None:
            retry = str(max(1, math.ceil(wait))).encode()
            body = f"one device memory profile per {self.min_interval:g}s: retry in {retry.decode()}s\n".encode()
            return 429, TEXT, body, [(b"retry-after", retry)]
        started = time.perf_counter()
        try:
            # Off the event loop: walking the live buffers takes a while with many arrays.
            profile = await asyncio.to_thread(self._in_process.device_memory_profile)
        except Exception as exc:
            log.warning("device memory profile failed", error=f"{type(exc).__name__}: {exc}")
            return 500, TEXT, f"device memory profile failed: {type(exc).__name__}: {exc}\n".encode(), []
        finally:
            with self._lock:
                self._busy = False
        log.debug("device memory profile served", bytes=len(profile), seconds=round(time.perf_counter() - started, 3))
        disposition = (b"content-disposition", b'attachment; filename="device_memory.pb.gz"')
        return 200, PPROF_TYPE, profile, [disposition]
