"""The running exporter: a device source, the scheduled polls and probes, and the latest snapshot."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from jaxmon.logsetup import ErrorLog
from jaxmon.memory import memory_numbers
from jaxmon.model import (
    BackendStatus,
    CollectorStatus,
    DeviceInfo,
    MemoryReading,
    ProbeKernel,
    ProbeStatus,
    Snapshot,
)
from jaxmon.probe import DeviceProbe, ProbeConfig
from jaxmon.sources.faults import Faults
from jaxmon.sources.spool import SpoolReader, WorkloadReport

log = structlog.get_logger("jaxmon.runtime")


class DeviceSource(Protocol):
    """Where devices and their stats come from: local JAX devices or a replay file."""

    name: str
    runs_probes: bool

    def discover(self) -> tuple[list[DeviceInfo], list[BackendStatus]]:
        """Devices to report, and the backends tried."""

    def read_memory(self, device: DeviceInfo) -> Mapping[str, Any] | None:
        """One `memory_stats()`-shaped dict, None when unsupported; raises on a device error."""

    def make_probe(self, device: DeviceInfo, size: int) -> ProbeKernel | None:
        """A compiled probe for `device`, or None when the source runs no probes."""


@dataclass(frozen=True)
class RuntimeConfig:
    """The settings the runtime needs, in seconds."""

    poll_interval: float
    probe_enabled: bool
    probe_interval: float
    probe: ProbeConfig
    max_staleness: float
    workload: str | None = None


class WorkloadProbe(Protocol):
    """In-process extras of embedded mode: live arrays and compile counters of this process."""

    process_index: int

    def live_array_bytes(self) -> dict[tuple[str, int], int]:
        """Bytes of live arrays per device."""

    def compile_counts(self) -> dict[str, float]:
        """Compile counters since start."""


class Runtime:
    """Owns the scheduler; polls and probes write state, scrapes read a copy of it."""

    def __init__(
        self,
        source: DeviceSource,
        config: RuntimeConfig,
        build: Mapping[str, str],
        faults: Faults | None = None,
        workload_probe: WorkloadProbe | None = None,
        spool: SpoolReader | None = None,
    ) -> None:
        self.source = source
        self._workload_probe = workload_probe
        self._spool = spool
        self.config = config
        self._faults = faults or Faults(None)
        self._lock = threading.Lock()
        self._version = 0
        self._errors = ErrorLog(log, config.poll_interval)
        self._probe_errors = ErrorLog(log, config.probe_interval)
        self.devices, self.backends = source.discover()
        for backend in self.backends:
            if not backend.up:
                log.warning("backend unavailable", backend=backend.name, error=backend.error)
        log.info(
            "devices discovered",
            source=source.name,
            devices=[d.name for d in self.devices],
            backends={b.name: b.up for b in self.backends},
        )
        self._snapshot = Snapshot(
            devices=list(self.devices),
            backends=list(self.backends),
            source=source.name,
            build=dict(build),
            workload=config.workload,
            process_index=workload_probe.process_index if workload_probe else 0,
            spool_rejected=dict(spool.rejected) if spool else None,
        )
        self._last_poll_done: float | None = None
        self._probe_last_success: float | None = None
        self.probes: dict[tuple[str, int], DeviceProbe] = {}
        if config.probe_enabled and source.runs_probes:
            calibration_lock = threading.Lock()
            for dev in self.devices:
                self.probes[dev.key] = DeviceProbe(
                    dev,
                    self._kernel_factory(dev),
                    config.probe,
                    self._faults,
                    self._probe_errors,
                    calibration_lock,
                    on_change=self._probe_changed,
                )
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=len(self.probes) + 2)},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone="UTC",
        )

    def _kernel_factory(self, dev: DeviceInfo) -> Callable[[], ProbeKernel]:
        def make() -> ProbeKernel:
            kernel = self.source.make_probe(dev, self.config.probe.size)
            if kernel is None:
                raise RuntimeError(f"source {self.source.name} cannot probe {dev.name}")
            return kernel

        return make

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Schedule the first poll now and stagger the probes across their interval."""
        now = datetime.now().astimezone()
        self._scheduler.add_job(
            self.poll,
            "interval",
            seconds=self.config.poll_interval,
            next_run_time=now,
            id="poll",
            misfire_grace_time=max(int(self.config.poll_interval), 1),
        )
        n = max(len(self.probes), 1)
        # Spread probes so devices that share hardware do not time each other's load.
        gap = self.config.probe_interval / n
        for i, probe in enumerate(self.probes.values()):
            self._scheduler.add_job(
                probe.run_once,
                "interval",
                seconds=self.config.probe_interval,
                next_run_time=now + timedelta(seconds=0.2 + i * gap),
                id=f"probe-{probe.device.name}",
                misfire_grace_time=max(int(self.config.probe_interval), 1),
            )
        self._scheduler.start()

    def stop(self) -> None:
        """Stop scheduling; running jobs are not waited for (a hung device must not block exit)."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        for probe in self.probes.values():
            probe.stop()

    @property
    def scheduler_running(self) -> bool:
        """True while the scheduler is started and not shut down."""
        return bool(self._scheduler.running)

    # -- jobs -------------------------------------------------------------------------------------------

    def poll(self) -> None:
        """Read `memory_stats()` of every device; a raising device is recorded and the others go on."""
        started = time.perf_counter()
        delay = self._faults.poll_delay()
        if delay > 0:
            self._faults.hang(delay, self._faults.poll_delay)
        readings: dict[tuple[str, int], MemoryReading] = {}
        for dev in self.devices:
            try:
                stats = self.source.read_memory(dev)
                readings[dev.key] = MemoryReading(numbers=memory_numbers(stats))
                self._errors.ok(f"memory/{dev.name}", "device memory readable again", device=dev.name)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                readings[dev.key] = MemoryReading(numbers=None, error=message)
                self._errors.error(f"memory/{dev.name}", "memory_stats failed", message, device=dev.name)
        live: dict[tuple[str, int], int] = {}
        compile_counts: dict[str, float] | None = None
        if self._workload_probe is not None:
            # Where the allocator reports nothing, live arrays are the only memory truth in this process.
            if any(r.numbers is not None and not r.numbers.supported for r in readings.values()):
                live = self._workload_probe.live_array_bytes()
            compile_counts = self._workload_probe.compile_counts()
        duration = time.perf_counter() - started
        success = all(r.ok for r in readings.values())
        workloads, spool_ok, spool_duration = self._scan_spool()
        with self._lock:
            snap = self._snapshot
            snap.memory = readings
            snap.live_array_bytes = live
            snap.compile = compile_counts
            for key, reading in readings.items():
                if not reading.ok:
                    snap.memory_read_errors[key] = snap.memory_read_errors.get(key, 0) + 1
            self._record_collector(snap, "memory", success, duration)
            if self._spool is not None:
                if spool_ok:
                    snap.workloads = workloads
                snap.spool_rejected = dict(self._spool.rejected)
                self._record_collector(snap, "spool", spool_ok, spool_duration)
            self._last_poll_done = time.monotonic()
            self._version += 1

    def _scan_spool(self) -> tuple[list[WorkloadReport], bool, float]:
        if self._spool is None:
            return [], True, 0.0
        started = time.perf_counter()
        try:
            workloads = self._spool.scan()
            self._errors.ok("spool", "spool directory readable again", directory=str(self._spool.directory))
            return workloads, True, time.perf_counter() - started
        except OSError as exc:
            # Keep serving the last good workloads; the collector says the spool failed.
            self._errors.error("spool", "spool directory unreadable", str(exc), directory=str(self._spool.directory))
            return [], False, time.perf_counter() - started

    def _probe_changed(self) -> None:
        ran = [st for st in (p.status() for p in self.probes.values()) if st.up is not None]
        with self._lock:
            if ran and all(st.up for st in ran):
                self._probe_last_success = time.time()
            self._version += 1

    @staticmethod
    def _record_collector(snap: Snapshot, name: str, success: bool, duration: float) -> None:
        status = snap.collectors.setdefault(name, CollectorStatus())
        status.success = success
        status.duration_seconds = duration
        if success:
            status.last_success_timestamp = time.time()

    # -- reading ----------------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Changes whenever the snapshot does; lets the server reuse a rendered exposition."""
        with self._lock:
            return self._version

    def snapshot(self) -> Snapshot:
        """A consistent copy of everything a scrape renders."""
        probes = {key: probe.status() for key, probe in self.probes.items()}
        with self._lock:
            snap = copy.copy(self._snapshot)
            snap.memory = dict(snap.memory)
            snap.memory_read_errors = dict(snap.memory_read_errors)
            snap.workloads = list(snap.workloads)
            snap.collectors = {k: copy.copy(v) for k, v in snap.collectors.items()}
        snap.probes = probes
        # Derived from the very statuses rendered, so device_up and the collector never disagree.
        with self._lock:
            last_success = self._probe_last_success
        probe_collector = _probe_collector(list(probes.values()), last_success)
        if probe_collector is not None:
            snap.collectors["probe"] = probe_collector
        return snap

    @property
    def ready(self) -> bool:
        """True once the first complete poll has landed."""
        with self._lock:
            return self._last_poll_done is not None

    def health(self) -> tuple[bool, str]:
        """Healthy means fresh data: the scheduler runs and the last poll is recent."""
        if not self.scheduler_running:
            return False, "scheduler is not running"
        with self._lock:
            last = self._last_poll_done
        if last is None:
            return False, "no poll has completed yet"
        age = time.monotonic() - last
        if age > self.config.max_staleness:
            return False, f"last poll completed {age:.1f}s ago (limit {self.config.max_staleness:g}s)"
        return True, f"last poll completed {age:.1f}s ago"


def _probe_collector(statuses: list[ProbeStatus], last_success: float | None) -> CollectorStatus | None:
    """The probe collector succeeds when every probed device answered its last probe; its duration is the device
    time of one round (the sum of the last probe latencies). None before any probe ran."""
    ran = [st for st in statuses if st.up is not None]
    if not ran:
        return None
    return CollectorStatus(
        success=all(st.up for st in ran),
        duration_seconds=sum(st.last_duration_seconds or 0.0 for st in ran),
        last_success_timestamp=last_success,
    )
