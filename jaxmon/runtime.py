"""The running exporter: the collectors' jobs on a scheduler, every update guarded and recorded in one snapshot.

The `Recorder` holds the snapshot and exists before the collectors (they are built with its publish function and
an exchange over its snapshot); the `Runtime` schedules their jobs. Scrapes read the latest snapshot and never run
a job. An update that raises is recorded as a failed run of its collector (the last good state stays); one
failing collector never stops the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from jaxmon.collectors.base import AnyCollector, Job
from jaxmon.exposition import Transform
from jaxmon.logsetup import ErrorLog
from jaxmon.snapshot import Snapshot, Update
from jaxmon.sources import InProcess

log = structlog.get_logger("jaxmon.runtime")


class Recorder:
    """The latest snapshot, replaced whole by every recorded update, and when each collector last recorded one."""

    def __init__(self, initial: Snapshot) -> None:
        self._lock = threading.Lock()
        self._snapshot = initial
        self._last_update: dict[str, float] = {}

    def snapshot(self) -> Snapshot:
        """The latest snapshot (immutable: safe to read without a lock)."""
        with self._lock:
            return self._snapshot

    def publisher(self, name: str) -> Callable[[Update[object]], None]:
        """A function that records an update of collector `name` (what it is built with)."""

        def publish(update: Update[object]) -> None:
            self.record(name, update, 0.0)

        return publish

    def record(self, name: str, update: Update[object], duration: float, counts: bool = True) -> None:
        """Make `update` the latest of collector `name`; `counts`: it is a real update (not a placeholder)."""
        with self._lock:
            self._snapshot = self._snapshot.with_update(name, update, duration)
            if counts:
                self._last_update[name] = time.monotonic()

    def last_updates(self) -> dict[str, float]:
        """Monotonic time of each collector's latest update."""
        with self._lock:
            return dict(self._last_update)


class Runtime:
    """Owns the scheduler; collectors' jobs write the recorder's snapshot, scrapes read it."""

    def __init__(
        self,
        recorder: Recorder,
        collectors: Sequence[AnyCollector],
        max_staleness: float,
        unavailable: Mapping[str, str] | None = None,
        in_process: InProcess | None = None,
        transform: Transform | None = None,
    ) -> None:
        self.recorder = recorder
        # The step between the snapshot's families and the exposition (the owner transform), where there is one.
        self.transform = transform
        # The workload process's view of itself (embedded), for what the web server serves of it (pprof).
        self.in_process = in_process
        self.collectors = list(collectors)
        self.max_staleness = max_staleness
        self._errors = ErrorLog(log)
        self._ready_lock = threading.Lock()
        self._announced_ready = False
        for name, reason in sorted((unavailable or {}).items()):
            # Asked for explicitly but impossible here: say so in the exposition and the log, once.
            log.error("collector cannot run", collector=name, reason=reason)
            recorder.record(name, Update(None, success=False), 0.0, counts=False)
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=sum(len(c.jobs()) for c in collectors) + 2)},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone="UTC",
        )

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Schedule every collector's jobs (each first after its own delay) and start."""
        now = datetime.now().astimezone()
        for collector in self.collectors:
            for job in collector.jobs():
                self._scheduler.add_job(
                    self._guarded(collector, job),
                    "interval",
                    seconds=job.interval,
                    next_run_time=now + timedelta(seconds=job.first_delay),
                    id=job.id,
                    name=job.id,
                    misfire_grace_time=max(int(job.interval), 1),
                )
        self._scheduler.start()

    def stop(self) -> None:
        """Stop scheduling and every collector; running jobs are not waited for (a hung device must not block)."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        for collector in self.collectors:
            collector.stop()

    @property
    def scheduler_running(self) -> bool:
        """True while the scheduler is started and not shut down."""
        return bool(self._scheduler.running)

    # -- updates ----------------------------------------------------------------------------------------

    def _guarded(self, collector: AnyCollector, job: Job) -> Any:
        def run() -> None:
            self.run_job(collector, job)

        return run

    def run_job(self, collector: AnyCollector, job: Job) -> None:
        """Run one job and record what it returned; an exception is a failed run that keeps the last state."""
        started = time.perf_counter()
        try:
            result = job.run()
            self._errors.ok(f"collector/{job.id}", "collector works again", collector=collector.name)
        except Exception as exc:
            self._errors.error(
                f"collector/{job.id}", "collector failed", f"{type(exc).__name__}: {exc}", collector=collector.name
            )
            result = Update(self.snapshot().states.get(collector.name), success=False)
        if result is not None:
            self.record(collector.name, result, time.perf_counter() - started)

    def update_all_once(self) -> None:
        """Every collector's `update()` once, in order, on this thread (`jaxmon snapshot`)."""
        for collector in self.collectors:
            self.run_job(collector, Job(collector.name, collector.interval, collector.update))

    def record(self, name: str, update: Update[object], duration: float) -> None:
        """Make `update` the latest of collector `name` (and say once when that makes the runtime ready)."""
        self.recorder.record(name, update, duration)
        self._maybe_announce_ready()

    def _maybe_announce_ready(self) -> None:
        with self._ready_lock:
            became_ready = not self._announced_ready and self.ready
            self._announced_ready = self._announced_ready or became_ready
        if became_ready:
            # The moment /readyz turns 200: what an operator watching a starting sidecar waits for.
            log.info("ready: first poll done", collectors=self._heartbeats())

    # -- reading ----------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The latest snapshot (immutable: safe to read without a lock)."""
        return self.recorder.snapshot()

    def _heartbeats(self) -> list[str]:
        names = [c.name for c in self.collectors if c.heartbeat]
        return names or [c.name for c in self.collectors]

    @property
    def ready(self) -> bool:
        """True once every collector /readyz waits on has completed its first update."""
        last = self.recorder.last_updates()
        return all(name in last for name in self._heartbeats())

    def health(self) -> tuple[bool, str]:
        """Healthy means fresh data: the scheduler runs and every heartbeat collector updated recently."""
        if not self.scheduler_running:
            return False, "scheduler is not running"
        now = time.monotonic()
        last = self.recorder.last_updates()
        ages = []
        for name in self._heartbeats():
            if name not in last:
                return False, f"no {name} update has completed yet"
            age = now - last[name]
            if age > self.max_staleness:
                return False, f"last {name} update completed {age:.1f}s ago (limit {self.max_staleness:g}s)"
            ages.append(f"{name} {age:.1f}s ago")
        return True, "last update: " + ", ".join(ages) if ages else "no collectors"
