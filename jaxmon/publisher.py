"""`jaxmon.publish()`: a training process writes its allocator stats to a shared spool directory."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from jaxmon.logsetup import ErrorLog, ensure_library_logging
from jaxmon.model import DeviceInfo
from jaxmon.sources import DeviceSource, InProcess
from jaxmon.sources.spool import SpoolCompile, SpoolDevice, SpoolDocument, safe_name, write_atomically

log = structlog.get_logger("jaxmon.publisher")


def default_workload_name() -> str:
    """The running script's name (`train` for `python train.py`), else `python`."""
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return safe_name(script) if script else "python"


class Publisher:
    """A daemon thread that writes this process's snapshot every interval; it never raises into the caller."""

    def __init__(self, directory: Path, workload: str, interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.directory = directory
        self.workload = workload
        self.interval = interval
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.path = directory / f"{safe_name(workload)}.{safe_name(self.host)}.{self.pid}.json"
        self.started = time.time()
        self.writes = 0
        self.failures = 0
        self._errors = ErrorLog(log, max(interval, 60.0))  # a lasting failure: once a minute, not every write
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jaxmon-publisher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from jaxmon.app import workload_source

        try:
            source, in_process = workload_source()
            devices, _ = source.discover()
        except Exception as exc:  # never into the training code
            log.error("publisher cannot read JAX devices; not publishing", error=f"{type(exc).__name__}: {exc}")
            return
        while True:
            try:
                self._publish_once(source, devices, in_process)
            except Exception as exc:
                self.failures += 1
                self._errors.error("write", "spool write failed", f"{type(exc).__name__}: {exc}", path=str(self.path))
            if self._stop.wait(self.interval):
                return

    def document(self, source: DeviceSource, devices: list[DeviceInfo], in_process: InProcess) -> SpoolDocument:
        """This process's snapshot: raw `memory_stats()` per device (live arrays where it reports nothing)."""
        entries: list[SpoolDevice] = []
        live: dict[tuple[str, int], int] | None = None
        for dev in devices:
            fields: dict[str, Any] = dev.identity()
            try:
                stats = source.read_memory(dev)
                if stats is None:
                    live = in_process.live_array_bytes() if live is None else live
                    fields["live_array_bytes"] = live.get(dev.key, 0)
                else:
                    fields["memory_stats"] = {k: v for k, v in stats.items() if _number(v)}
            except Exception as exc:
                fields["error"] = f"{type(exc).__name__}: {exc}"[:4096]
            entries.append(SpoolDevice.model_validate(fields))
        return SpoolDocument(
            schema="jaxmon.spool/1",
            workload=self.workload,
            host=self.host,
            pid=self.pid,
            process_index=in_process.process_index,
            jax_version=in_process.jax_version,
            time=time.time(),
            started=self.started,
            interval=self.interval,
            devices=entries,
            compile=SpoolCompile.model_validate(in_process.compile_counts()),
        )

    def _publish_once(self, source: DeviceSource, devices: list[DeviceInfo], in_process: InProcess) -> None:
        doc = self.document(source, devices, in_process)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, doc.model_dump(by_alias=True))
        self.writes += 1
        self._errors.ok("write", "spool writable again", path=str(self.path))

    def stop(self, remove: bool = True) -> None:
        """Stop publishing; by default remove this process's file so the workload disappears at once."""
        self._stop.set()
        self._thread.join(timeout=10)
        if remove:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_publishers: dict[Path, Publisher] = {}
_publishers_lock = threading.Lock()


def publish(directory: str | os.PathLike[str], workload: str | None = None, interval: float = 5.0) -> Publisher:
    """Publish this process's device snapshots to `directory` every `interval` seconds, in the background.

    Calling it again for the same directory returns the running publisher. Errors while writing (a missing,
    unwritable or full directory) are logged and retried every interval; they never reach the caller.
    """
    ensure_library_logging()
    path = Path(directory).absolute()
    with _publishers_lock:
        running = _publishers.get(path)
        if running is not None and running._thread.is_alive():
            return running
        publisher = Publisher(path, workload or default_workload_name(), interval)
        _publishers[path] = publisher
        return publisher
