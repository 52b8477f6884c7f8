"""The running exporter: the collectors' jobs on a scheduler, every update guarded and recorded in one snapshot.

Scrapes read the latest snapshot and never run a job. An update that raises is recorded as a failed run of its
collector (the last good state stays); one failing collector never stops the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from jaxmon.collectors.base import Collector, Context, Job, Update
from jaxmon.logsetup import ErrorLog
from jaxmon.model import BackendStatus
from jaxmon.snapshot import Snapshot

log = structlog.get_logger("jaxmon.runtime")


class Runtime:
    """Owns the scheduler and the snapshot; collectors' jobs write it, scrapes read it."""

    def __init__(
        self,
        ctx: Context,
        backends: Sequence[BackendStatus],
        collectors: Sequence[Collector[Any]],
        build: Mapping[str, str],
        max_staleness: float,
        unavailable: Mapping[str, str] | None = None,
    ) -> None:
        self.ctx = ctx
        self.collectors = list(collectors)
        self.max_staleness = max_staleness
        self._lock = threading.Lock()
        self._errors = ErrorLog(log)
        self._snapshot = Snapshot(
            devices=tuple(ctx.devices),
            backends=tuple(backends),
            source=ctx.source.name,
            build=dict(build),
            workload=ctx.workload,
        )
        self._last_update: dict[str, float] = {}
        self._announced_ready = False
        for name, reason in sorted((unavailable or {}).items()):
            # Asked for explicitly but impossible here: say so in the exposition and the log, once.
            log.error("collector cannot run", collector=name, reason=reason)
            self._snapshot = self._snapshot.with_update(name, Update(None, success=False), 0.0)
        ctx.snapshot = self.snapshot
        for collector in self.collectors:
            collector.publish = self._publisher(collector.name)
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=sum(len(c.jobs()) for c in collectors) + 2)},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone="UTC",
        )

    def _publisher(self, name: str) -> Any:
        def publish(update: Update[object]) -> None:
            self.record(name, update, 0.0)

        return publish

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

    def _guarded(self, collector: Collector[Any], job: Job) -> Any:
        def run() -> None:
            self.run_job(collector, job)

        return run

    def run_job(self, collector: Collector[Any], job: Job) -> None:
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
        """Make `update` the latest of collector `name`."""
        with self._lock:
            self._snapshot = self._snapshot.with_update(name, update, duration)
            self._last_update[name] = time.monotonic()
            became_ready = not self._announced_ready and self._ready_locked()
            self._announced_ready = self._announced_ready or became_ready
        if became_ready:
            # The moment /readyz turns 200: what an operator watching a starting sidecar waits for.
            log.info("ready: first poll done", collectors=self._heartbeats())

    # -- reading ----------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The latest snapshot (immutable: safe to read without a lock)."""
        with self._lock:
            return self._snapshot

    def _heartbeats(self) -> list[str]:
        names = [c.name for c in self.collectors if c.heartbeat]
        return names or [c.name for c in self.collectors]

    def _ready_locked(self) -> bool:
        return all(name in self._last_update for name in self._heartbeats())

    @property
    def ready(self) -> bool:
        """True once every collector /readyz waits on has completed its first update."""
        with self._lock:
            return self._ready_locked()

    def health(self) -> tuple[bool, str]:
        """Healthy means fresh data: the scheduler runs and every heartbeat collector updated recently."""
        if not self.scheduler_running:
            return False, "scheduler is not running"
        now = time.monotonic()
        with self._lock:
            last = dict(self._last_update)
        ages = []
        for name in self._heartbeats():
            if name not in last:
                return False, f"no {name} update has completed yet"
            age = now - last[name]
            if age > self.max_staleness:
                return False, f"last {name} update completed {age:.1f}s ago (limit {self.max_staleness:g}s)"
            ages.append(f"{name} {age:.1f}s ago")
        return True, "last update: " + ", ".join(ages) if ages else "no collectors"
