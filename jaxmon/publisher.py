"""`jaxmon.publish()`: a training process writes its allocator stats (and its training telemetry, and where its
arrays lie) to a shared spool directory.

The file vanishes when the process exits normally (or `stop()` is called); a killed process's file ages out by
the sidecar's TTL, and a later publisher of the same workload on the same host removes it once it is old.
`stop(remove=False)` keeps it, rewritten once more at the stop so that it holds every step seen complete by then.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from jaxmon.checkpoints import CheckpointReading
from jaxmon.device_readings import ArrayBytes, DeviceInfo
from jaxmon.files import write_atomically
from jaxmon.finalization import EXIT_WAIT, before_finalization
from jaxmon.identity import host_name, scheduler_labels
from jaxmon.logsetup import ErrorLog, ensure_library_logging
from jaxmon.settings import Settings
from jaxmon.sources import DeviceSource, InProcess
from jaxmon.sources.selection import select_devices
from jaxmon.sources.spool import FILE_NAME, TMP_NAME, safe_name
from jaxmon.sources.spool_codec import spool_checkpoint, spool_device, spool_training
from jaxmon.sources.spool_document import SCHEMA, SpoolCompile, SpoolDevice, SpoolDocument

log = structlog.get_logger("jaxmon.publisher")

# A predecessor's file (same workload and host, another pid) this old is a crashed run's: 10 x the sidecar's
# default TTL. Younger ones may belong to a live process in another PID namespace sharing the hostname.
STALE_AFTER = 300.0
# The process's start as jaxmon saw it: the compile counters (process-wide) count from about then, through every
# publisher started and stopped in the process (jaxmon.births keys them by it).
PROCESS_STARTED = time.time()


def default_workload_name() -> str:
    """The running script's name (`train` for `python train.py`), else `python`."""
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return safe_name(script) if script else "python"


class Publisher:
    """A daemon thread that writes this process's snapshot every interval; it never raises into the caller."""

    def __init__(self, directory: Path, workload: str, interval: float, settings: Settings | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.directory = directory
        self.workload = workload
        self.interval = interval
        self.host = host_name()
        self.pid = os.getpid()
        self.prefix = f"{safe_name(workload)}.{safe_name(self.host)}."
        self.path = directory / f"{self.prefix}{self.pid}.json"
        self.started = time.time()
        self.writes = 0
        self.failures = 0
        self.removed_stale = 0
        self._errors = ErrorLog(log, max(interval, 60.0))  # a lasting failure: once a minute, not every write
        self._stop = threading.Event()
        self._final = False  # stop() keeps the file: the thread writes it once more before it ends
        self._wait = 0.0  # how long stop() waits for that
        self._stop_lock = threading.Lock()
        self._released = False
        self._workload: tuple[DeviceSource, InProcess] | None = None
        self._include_cpu = False
        self._declared: Callable[[CheckpointReading], CheckpointReading] = lambda reading: reading
        try:
            from jaxmon.compose import default_settings, workload_source

            settings = settings or default_settings()
            self._include_cpu = settings.devices.include_cpu
            # The checkpoint interval the job declared (jaxmon.collectors.checkpoint.CheckpointOptions).
            self._declared = getattr(settings.collector_options("checkpoint"), "declared", self._declared)
            # Here, not on the thread: the training tracker must exist before the caller's first jaxmon.step().
            self._workload = workload_source(settings)
        except Exception as exc:  # never into the training code
            log.error("publisher cannot read JAX devices; not publishing", error=f"{type(exc).__name__}: {exc}")
        self._thread = threading.Thread(target=self._run, name="jaxmon-publisher", daemon=True)
        self._unregister_exit = before_finalization(self._exit)
        self._thread.start()

    def _run(self) -> None:
        if self._workload is None:
            return
        source, in_process = self._workload
        try:
            devices, _ = select_devices(source.discover()[0], self._include_cpu)
        except Exception as exc:  # never into the training code
            log.error("publisher cannot read JAX devices; not publishing", error=f"{type(exc).__name__}: {exc}")
            return
        self.remove_stale()
        while True:
            stopped = self._stop.is_set()
            if stopped and not self._final:
                return
            if stopped:  # the last document: with every step handed by now
                in_process.settle(self._wait / 2)
            try:
                self._publish_once(source, devices, in_process)
            except Exception as exc:
                self.failures += 1
                # The message names the random temporary file: two failures are the same when type and errno are.
                same = f"{type(exc).__name__}/{getattr(exc, 'errno', None)}"
                message = f"{type(exc).__name__}: {exc}"
                self._errors.error("write", "spool write failed", message, same, path=str(self.path))
            if stopped:
                return  # that was the final document of a stop() that keeps the file
            self._stop.wait(self.interval)

    def remove_stale(self, now: float | None = None) -> int:
        """Remove this workload's files on this host that crashed runs left (older than STALE_AFTER)."""
        now = time.time() if now is None else now
        removed = 0
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return 0  # not there yet: nothing to clean
        for entry in entries:
            name = entry.name
            own = name.startswith(self.prefix) and FILE_NAME.match(name)
            own_tmp = name.startswith("." + self.prefix) and TMP_NAME.match(name)
            if not (own or own_tmp) or entry.path == str(self.path):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or now - st.st_mtime <= STALE_AFTER:
                    continue
                os.unlink(entry.path)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    self._errors.error("clean", "cannot remove a stale spool file", str(exc), type(exc).__name__)
                continue
            removed += 1
        if removed:
            log.info("removed stale spool files of earlier runs", workload=self.workload, files=removed)
        self.removed_stale += removed
        return removed

    def document(self, source: DeviceSource, devices: list[DeviceInfo], in_process: InProcess) -> SpoolDocument:
        """This process's snapshot: raw `memory_stats()` per device (live arrays where it reports nothing), and
        every device's replicated and host-memory array bytes, from one pass over the live arrays (as the embedded
        memory collector makes it)."""
        entries: list[SpoolDevice] = []
        arrays: ArrayBytes | None = None
        failed = ""
        try:
            arrays = in_process.array_bytes()
        except Exception as exc:  # the devices' allocator numbers still go out
            failed = f"{type(exc).__name__}: {exc}"
        for dev in devices:
            stats, error = None, None
            try:
                stats = source.read_memory(dev)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            entries.append(spool_device(dev, stats, error, arrays, failed))
        reading = in_process.training()
        now = time.time()
        return SpoolDocument(
            schema=SCHEMA,
            workload=self.workload,
            host=self.host,
            pid=self.pid,
            process_index=in_process.process_index,
            jax_version=in_process.jax_version,
            time=now,
            started=self.started,
            process_started=PROCESS_STARTED,
            interval=self.interval,
            devices=entries,
            compile=SpoolCompile.model_validate(in_process.compile_counts()),
            training=None if reading is None else spool_training(reading, now),
            checkpoint=spool_checkpoint(self._declared(in_process.checkpoints())),
            process_count=in_process.process_count,
            scheduler=scheduler_labels(),
        )

    def _publish_once(self, source: DeviceSource, devices: list[DeviceInfo], in_process: InProcess) -> None:
        doc = self.document(source, devices, in_process)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, doc.model_dump(by_alias=True))
        self.writes += 1
        self._errors.ok("write", "spool writable again", path=str(self.path))

    def stop(self, remove: bool = True, wait: float = 10.0) -> None:
        """Stop publishing; by default remove this process's file so the workload disappears at once. With
        `remove=False` the file is written once more first (within `wait`), with every step seen complete by now:
        the sidecar sees the last interval's steps too. Then the publisher lets go of its exit callback and of its
        share of the training tracker (a later publish() or start() gets a tracker with its own options)."""
        with self._stop_lock:
            if not self._stop.is_set():
                self._final, self._wait = not remove, wait
                self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=wait)
        if remove and os.getpid() == self.pid:  # a forked child never removes its parent's file
            with contextlib.suppress(OSError):
                self.path.unlink()
        self._release()

    def _release(self) -> None:
        with self._stop_lock:
            released, self._released = self._released, True
        if released:
            return
        self._unregister_exit()
        with _publishers_lock:
            if _publishers.get(self.directory) is self:
                del _publishers[self.directory]
        if self._workload is not None and os.getpid() == self.pid:
            self._workload[1].release()

    def _exit(self) -> None:
        """At interpreter exit: the thread leaves JAX first (jaxmon.finalization), then a clean exit removes the
        file."""
        if os.getpid() != self.pid or self._stop.is_set():
            return  # a forked child's copy, or stopped by the caller (who chose whether to keep the file)
        self.stop(remove=True, wait=EXIT_WAIT)
        if self._thread.is_alive():
            log.warning("exiting while the publisher thread is still inside JAX", waited_seconds=EXIT_WAIT)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_publishers: dict[Path, Publisher] = {}
_publishers_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child (a data loader worker) has no publisher thread: it publishes nothing unless it calls
    publish() itself, and never removes the parent's file (Publisher checks the pid)."""
    global _publishers_lock
    _publishers_lock = threading.Lock()  # it may have been held by another thread at fork
    _publishers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def publish(
    directory: str | os.PathLike[str], workload: str | None = None, interval: float = 5.0, **overrides: Any
) -> Publisher:
    """Publish this process's device snapshots (and its training telemetry, once it calls jaxmon.step()) to
    `directory` every `interval` seconds, in the background.

    `overrides` are settings sections, as for jaxmon.start(): `training={"peak_flops": 2e14}`; bad ones raise
    SettingsError. Calling it again for the same directory returns the running publisher. Errors while writing (a
    missing, unwritable or full directory) are logged and retried every interval; they never reach the caller.
    """
    ensure_library_logging()
    from jaxmon.compose import load_settings, log_settings_notes

    path = Path(directory).absolute()
    with _publishers_lock:
        running = _publishers.get(path)
        if running is not None and running._thread.is_alive():
            return running
        settings = load_settings(
            [], arguments=overrides, prog="jaxmon.publish", title="jaxmon.publish: invalid settings"
        )
        log_settings_notes(settings)
        publisher = Publisher(path, workload or default_workload_name(), interval, settings)
        _publishers[path] = publisher
        return publisher
