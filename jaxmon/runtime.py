"""The running exporter: the collectors' jobs on a scheduler, every update guarded and recorded in one snapshot.

The `Recorder` holds the snapshot and exists before the collectors (they are built with its publish function and
an exchange over its snapshot); the `Runtime` schedules their jobs. Scrapes read the latest snapshot and never run
a job. An update that raises is recorded as a failed run of its collector (the last good state stays); one
failing collector never stops the others.

Stopping: the scheduler starts no job after `stop()`, and each collector is stopped (its threads and handles
released) only once none of its jobs is running, so that no poll has its source closed under it. `stop()` waits for
running polls until STOP_WAIT; a collector whose poll is still running then (a hung device: a call stuck past its
poll's deadline) is stopped by that poll's own thread when the poll returns, and `stop()` does not wait for it.
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

from jaxmon.collectors.base import AnyCollector, PollJob
from jaxmon.exposition import Transform
from jaxmon.lastword import LastWord
from jaxmon.logsetup import ErrorLog
from jaxmon.snapshot import Snapshot, Update
from jaxmon.sources import InProcess

log = structlog.get_logger("jaxmon.runtime")

# How long `stop()` waits for running polls: NVML's default deadline for a poll. A poll still running after this is
# most likely a hung device's, and its collector is stopped when it returns. The daemon's exit gives the threads the
# same 2 s from the start of stop() (SIGTERM exits within 5 s, cli.py).
STOP_WAIT = 2.0


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
        # The embedded exporter's jaxmon_exporter_stopping and its wait for a final scrape (jaxmon.lastword).
        self.last_word: LastWord | None = None
        self.collectors = list(collectors)
        self.max_staleness = max_staleness
        self._errors = ErrorLog(log)
        self._ready_lock = threading.Lock()
        self._announced_ready = False
        # Jobs running now, per collector; after stop(), the collectors it stopped, and those whose poll was still
        # running when it gave up waiting (that poll's thread stops them when it returns).
        self._jobs = threading.Condition()
        self._running: dict[str, int] = {}
        self._stopping = False
        self._stopped: set[str] = set()
        self._deferred: set[str] = set()
        self.stopped_at: float | None = None  # time.monotonic() when stop() was first called
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

    def stop(self, wait: float = STOP_WAIT) -> None:
        """Stop scheduling, wait up to `wait` seconds for running polls, and stop every collector once none of its
        jobs runs; a collector whose poll is still running then is stopped when that poll returns (a hung device
        must not block stop, nor have its handles freed under the call that hangs on them)."""
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        deadline = time.monotonic() + wait
        with self._jobs:
            self._stopping = True  # no job starts from now on (one the scheduler handed its pool already skips)
            self._jobs.wait_for(lambda: not any(self._running.values()), timeout=max(0.0, deadline - time.monotonic()))
            idle = [c for c in self.collectors if c.name not in self._stopped and not self._running.get(c.name)]
            self._stopped.update(c.name for c in idle)
            busy = sorted(name for name, count in self._running.items() if count)
            self._deferred.update(busy)
        if busy:
            log.warning(
                "stopping while a poll is still running: its collector stops when the poll returns",
                collectors=busy,
                waited_seconds=wait,
            )
        for collector in idle:
            self._stop_collector(collector)

    def _stop_collector(self, collector: AnyCollector) -> None:
        try:
            collector.stop()
        except Exception as exc:  # one collector failing to stop must not keep the others running
            log.error("collector failed to stop", collector=collector.name, error=f"{type(exc).__name__}: {exc}")

    @property
    def scheduler_running(self) -> bool:
        """True while the scheduler is started and not shut down."""
        return bool(self._scheduler.running)

    # -- updates ----------------------------------------------------------------------------------------

    def _guarded(self, collector: AnyCollector, job: PollJob) -> Any:
        def run() -> None:
            self.run_job(collector, job)

        return run

    def run_job(self, collector: AnyCollector, job: PollJob) -> None:
        """Run one job and record what it returned; an exception is a failed run that keeps the last state. After
        `stop()` no job starts; the last job of a collector that `stop()` could not wait for stops it."""
        with self._jobs:
            if self._stopping:
                return
            self._running[collector.name] = self._running.get(collector.name, 0) + 1
        try:
            self._run_job(collector, job)
        finally:
            with self._jobs:
                left = self._running[collector.name] = self._running[collector.name] - 1
                last = not left and collector.name in self._deferred
                if last:
                    self._deferred.discard(collector.name)
                    self._stopped.add(collector.name)
                self._jobs.notify_all()
            if last:
                self._stop_collector(collector)

    def _run_job(self, collector: AnyCollector, job: PollJob) -> None:
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
            self.run_job(collector, PollJob(collector.name, collector.interval, collector.update))

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
