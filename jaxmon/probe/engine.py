"""The utilization probe's engine (DESIGN.md section 5): one worker thread per device, calibrated, timed, bounded."""

from __future__ import annotations

import math
import queue
import random
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from jaxmon.device_readings import DeviceInfo, ProbeKernel, ProbeStatus
from jaxmon.logsetup import ErrorLog
from jaxmon.probe.baseline import Baseline, BaselineStore
from jaxmon.threads import PROBE

log = structlog.get_logger("jaxmon.probe")

MAX_STEPS = 4096
BASELINE_WINDOW = 120
# The window lowers the baseline only to its median: a lower quantile sits below most idle runs on a noisy host and
# reads its noise as load (BENCHMARKS.md, utilization).
BASELINE_PERCENTILE = 0.5
CALIBRATION_SEEDS = 7
# A shot is a one-step warm-up run (it pays a cold start: a thread pool waking, cold caches), then the timed run.
WARMUP_STEPS = 1


def longest_pauses(repeats: int, spacing: float) -> float:
    """The most one timing can pause: up to one spacing before the first shot, 1.5 before each later one."""
    return spacing * (1.0 + 1.5 * (repeats - 1))


_random = random.Random()


@dataclass(frozen=True)
class ProbeConfig:
    """The probe settings one device needs."""

    size: int
    timeout_seconds: float
    target_seconds: float
    # Each timing is the median of this many shots, `spacing_seconds` apart. Back-to-back runs share the host's
    # momentary speed; shots apart sample it independently, and their median is robust to a preempted one, so
    # an idle device reads idle (BENCHMARKS.md, utilization).
    repeats: int = 1
    spacing_seconds: float = 0.0


def _never_busy() -> bool:
    return False


def _unknown() -> bool | None:
    return None


def utilization(baseline: float, latency: float) -> float:
    """`1 - baseline / latency` clamped to [0, 1]: the share of the device the probe did not get."""
    if latency <= 0:
        return 0.0
    return min(max(1.0 - baseline / latency, 0.0), 1.0)


def nearest_rank(samples: list[float], q: float = BASELINE_PERCENTILE) -> float:
    """The q-quantile of `samples` by the nearest-rank method (no interpolation, robust on few samples)."""
    ordered = sorted(samples)
    rank = max(math.ceil(q * len(ordered)), 1)
    return ordered[rank - 1]


class DeviceProbe:
    """Runs the probe of one device on its own daemon thread; never two in flight, hung runs time out."""

    def __init__(
        self,
        device: DeviceInfo,
        make_kernel: Callable[[], ProbeKernel],
        config: ProbeConfig,
        errors: ErrorLog,
        calibration_lock: threading.Lock,
        on_late_result: Callable[[], None] = lambda: None,
        store: BaselineStore | None = None,
        store_key: str = "",
        busy: Callable[[], bool] = _never_busy,
        idle: Callable[[], bool | None] = _unknown,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.device = device
        self._make_kernel = make_kernel
        self._config = config
        self._errors = errors
        self._calibration_lock = calibration_lock
        self._on_late_result = on_late_result
        self._store = store
        self._store_key = store_key
        # True while a device-wide source (NVML, libtpu) says other work keeps the device busy.
        self._busy = busy
        # True when a device-wide source saw the device idle apart from the probe since the previous call (None:
        # no source knows). Timings taken idle are the baseline's window, which may then rise as well as fall.
        self._idle = idle
        self._idle_samples: deque[float] = deque(maxlen=BASELINE_WINDOW)
        # The timer of every run (nanoseconds): a test reads the very instants the probe's timings are taken from.
        self._clock = clock
        self._lock = threading.Lock()
        self._status = ProbeStatus()
        self._kernel: ProbeKernel | None = None
        self._calibration_baseline: float | None = None
        self._samples: deque[float] = deque(maxlen=BASELINE_WINDOW)
        self._tasks: queue.SimpleQueue[tuple[Callable[[], None], threading.Event] | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._busy_since: float | None = None
        self._abandoned = False  # run_once stopped waiting for the run in flight
        self._thread = threading.Thread(target=self._work, name=f"{PROBE}{device.name}", daemon=True)
        self._thread.start()

    def status(self) -> ProbeStatus:
        """A copy of the current status."""
        with self._lock:
            return replace(self._status)

    def stop(self) -> None:
        """End the worker after its current task and release any scheduler thread waiting on it."""
        self._stopping.set()
        self._tasks.put(None)

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` for the worker to end (a run hung in a device call cannot be interrupted)."""
        self._thread.join(timeout)

    # -- worker side ------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            fn, done = task
            try:
                fn()
            finally:
                with self._lock:
                    self._busy_since = None
                done.set()
                with self._lock:
                    late = self._abandoned
                    self._abandoned = False
                if late:
                    # This run outlived its timeout and run_once stopped waiting: announce its result here.
                    self._on_late_result()

    def _time_run(self, steps: int) -> float:
        assert self._kernel is not None
        start = self._clock()
        self._kernel.run(steps)
        return (self._clock() - start) / 1e9

    def _calibrate(self) -> None:
        """Compile once; then reuse a saved baseline, or size the step count so an idle run takes about the
        target time. A calibration taken while the device is known to be busy is provisional."""
        if self._kernel is None:
            self._kernel = self._make_kernel()
        saved = self._store.get(self._store_key) if self._store is not None else None
        if saved is not None and self._status.baseline_origin is None:
            self._kernel.run(saved.steps)  # warm-up: first dispatch pays one-off costs
            self._set_calibration(saved.steps, saved.seconds, [], "restored", 0.0)
            return
        busy = self._busy()
        # Devices that share hardware (CPU devices share cores) must not time each other: one calibration
        # at a time. A hung calibration must not stall the others forever, so the wait is bounded.
        locked = self._calibration_lock.acquire(timeout=self._config.timeout_seconds)
        try:
            self._time_run(1)  # warm-up: first dispatch pays one-off costs
            one = statistics.median(self._time_run(1) for _ in range(5))
            steps = min(max(math.ceil(self._config.target_seconds / max(one, 1e-7)), 1), MAX_STEPS)
            self._time_run(steps)
            # Seeds are shots taken as the scheduled timings take them (spaced, each after a warm-up), so the
            # baseline is the typical idle shot and idle noise centres on it.
            timed = self._shots(steps, CALIBRATION_SEEDS)
        finally:
            if locked:
                self._calibration_lock.release()
        seeds, busy_seconds = timed
        baseline = statistics.median(seeds)
        origin = "provisional" if busy or self._busy() else "calibrated"
        seen_idle = self._idle() is True
        self._set_calibration(steps, baseline, seeds, origin, busy_seconds)
        if origin == "calibrated" and seen_idle:
            with self._lock:
                self._idle_samples.extend(seeds)
        if origin == "calibrated" and self._store is not None:
            self._store.put(self._store_key, Baseline(steps, baseline))

    def _set_calibration(self, steps: int, baseline: float, seeds: list[float], origin: str, busy: float) -> None:
        assert self._kernel is not None
        with self._lock:
            self._calibration_baseline = baseline
            self._samples.clear()
            self._samples.extend(seeds)
            self._idle_samples.clear()
            self._status.calibrated = True
            self._status.baseline_origin = origin
            self._status.steps = steps
            self._status.baseline_seconds = baseline
            self._status.footprint_bytes = self._kernel.footprint_bytes
            self._status.busy_seconds_total += busy
        log.info(
            "probe calibrated",
            device=self.device.name,
            origin=origin,
            steps=steps,
            baseline_seconds=round(baseline, 6),
            footprint_bytes=self._kernel.footprint_bytes,
        )

    def _shots(self, steps: int, count: int, *, first_pause: bool = False) -> tuple[list[float], float]:
        """`count` shots about `spacing` apart, each a warm-up of WARMUP_STEPS and the timed run at `steps`; and
        the time all the runs took together (the probe's time on the device).

        The pauses are random (0.5-1.5 x spacing, and 0-1 x before the first shot of a scheduled timing): a
        workload that repeats at a period the schedule divides would otherwise be sampled at the same phase every
        time and read as always busy or always idle."""
        shots: list[float] = []
        busy = 0.0
        spacing = self._config.spacing_seconds
        for i in range(count):
            pause = spacing * (_random.uniform(0.5, 1.5) if i else _random.uniform(0.0, 1.0) if first_pause else 0.0)
            if pause > 0 and self._stopping.wait(pause) and shots:
                break  # shutting down: what was timed so far is enough
            busy += self._time_run(WARMUP_STEPS)
            shots.append(self._time_run(steps))
            busy += shots[-1]
        return shots, busy

    def _measure(self) -> None:
        assert self._kernel is not None
        steps = self._status.steps
        shots, busy = self._shots(steps, self._config.repeats, first_pause=True)
        latency = statistics.median(shots)
        seen_idle = self._idle() is True
        with self._lock:
            self._samples.append(latency)
            if seen_idle:
                self._idle_samples.append(latency)
            assert self._calibration_baseline is not None
            if len(self._idle_samples) >= CALIBRATION_SEEDS:
                # Enough timings a device-wide source saw idle: the baseline is their median, up or down, so it
                # follows the host's idle speed (a shared VM's wanders) and load never enters it.
                baseline = nearest_rank(list(self._idle_samples))
            else:
                # The calibration (taken idle, we hope) is a ceiling the window cannot raise: under hours of full
                # load the window fills with busy latencies and would otherwise read the load as idle. A window
                # mostly idle lowers it (a calibration taken under load that no device-wide source reported).
                baseline = min(self._calibration_baseline, nearest_rank(list(self._samples)))
            st = self._status
            st.last_duration_seconds = latency
            st.baseline_seconds = baseline
            # A baseline taken while the device was busy reads load as idle: no estimate until recalibrated.
            provisional = st.baseline_origin == "provisional"
            st.utilization_ratio = None if provisional else utilization(baseline, latency)
            st.flops_per_second = self._kernel.flops_per_step * steps / latency if latency > 0 else None
            st.busy_seconds_total += busy

    # -- scheduler side ---------------------------------------------------------------------------------

    def defer(self) -> None:
        """A scheduled run not dispatched: the job in this process is training on the device (a step of it ended
        within the probe interval), and jaxmon runs no program of its own beside the job's.

        The job's completed step is the device's answer, so it is up; the probe did not time the device now, so
        there is no utilization estimate (the last one was taken before the job trained); the latency, baseline
        and FLOP/s of the last timing stay what they were, and no run is counted."""
        with self._lock:
            st = self._status
            st.deferred_total += 1
            recovered = st.up is False
            st.up = True
            st.utilization_ratio = None
            st.last_error = None
        if recovered:
            self._errors.ok(
                f"probe/{self.device.name}",
                "the device answers: the job's steps complete on it",
                device=self.device.name,
            )

    def run_once(self) -> None:
        """One scheduled probe: calibrate first if needed, wait at most the timeout, never queue a second."""
        with self._lock:
            skipped = self._busy_since is not None
            if skipped:
                st = self._status
                st.skipped_total += 1
                assert self._busy_since is not None
                if time.monotonic() - self._busy_since > self._config.timeout_seconds:
                    st.up = False
            else:
                self._busy_since = time.monotonic()
            calibrated = self._status.calibrated
            provisional = self._status.baseline_origin == "provisional"
        if skipped:
            return

        error: list[BaseException] = []

        def task() -> None:
            try:
                if not calibrated or (provisional and not self._busy()):
                    try:
                        self._calibrate()  # first run, or the device is idle now: replace a provisional baseline
                    except Exception:
                        if not calibrated:
                            self._kernel = None  # a kernel that failed to calibrate is built anew next time
                        raise
                self._measure()
            except Exception as exc:
                error.append(exc)

        done = threading.Event()
        self._tasks.put((task, done))
        deadline = time.monotonic() + self._config.timeout_seconds
        finished = done.wait(min(self._config.timeout_seconds, 0.1))
        while not finished and not self._stopping.is_set() and time.monotonic() < deadline:
            finished = done.wait(min(deadline - time.monotonic(), 0.1))
        if self._stopping.is_set() and not finished:
            return  # shutting down: do not count a run cut short by the exit as a timeout
        with self._lock:
            st = self._status
            st.runs_total += 1
            if not finished:
                self._abandoned = True
                st.timeouts_total += 1
                st.up = False
                st.last_error = f"probe did not finish within {self._config.timeout_seconds:g}s"
            elif error:
                st.failures_total += 1
                st.up = False
                st.last_error = f"{type(error[0]).__name__}: {error[0]}"
            else:
                st.up = True
                st.last_error = None
            up, message = st.up, st.last_error
        if up:
            self._errors.ok(f"probe/{self.device.name}", "probe recovered", device=self.device.name)
        else:
            self._errors.error(
                f"probe/{self.device.name}", "probe failed", message or "unknown", device=self.device.name
            )
