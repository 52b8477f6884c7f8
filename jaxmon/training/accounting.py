"""Where a training process's time went: step intervals, badput intervals, stalls, and the window MFU is taken over.

Pure bookkeeping on one clock (seconds, monotonic), fed by the tracker's waiter thread; tested on literals.

- A step's interval runs from the previous step's completion to its own (completion to completion: what a
  synchronous job's step costs, whatever the host did meanwhile).
- Badput intervals (`badput()` blocks, compilations, Orbax's blocking checkpoint writes) are attributed to the
  step interval they overlap, each instant to one kind (the interval that started first).
- The rest of a step's interval is productive, less a stall: the excess of that rest over `stall_factor` x the
  median of the window's recent rests.
- Before the first completed step, the time since the tracker started is `startup` badput, less what overlapping
  intervals already name (compile, checkpoint restore, ...).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Buckets of jaxmon_training_step_duration_seconds: from milliseconds to minutes, fixed so that histograms of every
# process of a job aggregate (sum by le).
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 150.0, 300.0, 600.0,
)  # fmt: skip
# A stall is judged once the window holds this many steps (fewer give no stable median).
STALL_MIN_STEPS = 5
STARTUP = "startup"
STALL = "stall"
RESTART = "restart"


@dataclass
class Interval:
    """Time that was not training, of one kind, on the accounting clock; `end` is +inf while it lasts (a step that
    completes meanwhile is charged up to its completion, the next one from there)."""

    kind: str
    start: float
    end: float = float("inf")


def attribute(start: float, end: float, intervals: Iterable[Interval]) -> dict[str, float]:
    """Seconds of [start, end] covered by `intervals`, by kind; an instant covered twice counts once, for the
    interval that started first (in `intervals` order among equal starts)."""
    clipped = sorted(
        ((max(i.start, start), min(i.end, end), n, i.kind) for n, i in enumerate(intervals) if i.end > start),
        key=lambda c: (c[0], c[2]),
    )
    out: dict[str, float] = {}
    covered = start
    for lo, hi, _, kind in clipped:
        lo = max(lo, covered)
        if hi > lo:
            out[kind] = out.get(kind, 0.0) + hi - lo
            covered = hi
    return out


@dataclass
class Histogram:
    """A cumulative histogram with fixed upper bounds (Prometheus `le`), sum and count."""

    bounds: tuple[float, ...] = DURATION_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        """Count `value` in its bucket."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), +Inf last."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass(frozen=True)
class WindowStep:
    """One step of the window: its interval, the part not named as badput, and its FLOPs per device."""

    duration: float
    rest: float
    model_flops: Mapping[tuple[str, int], float]
    hardware_flops: Mapping[tuple[str, int], float]


@dataclass
class Accounting:
    """A process's training time since `started`: productive, badput by kind, stalls, host wait, the window."""

    started: float
    window: int = 100
    stall_factor: float = 3.0
    productive: float = 0.0
    host_wait: float = 0.0
    badput: dict[str, float] = field(default_factory=dict)
    histogram: Histogram = field(default_factory=Histogram)
    first_done: float | None = None
    recent: deque[WindowStep] = field(default_factory=deque)
    # The rests of `recent`, sorted: the stall check's median at every step without sorting the window each time.
    _rests: list[float] = field(default_factory=list, init=False, repr=False)

    def _add(self, kinds: Mapping[str, float]) -> None:
        for kind, seconds in kinds.items():
            self.badput[kind] = self.badput.get(kind, 0.0) + seconds

    def first(self, done: float, intervals: Iterable[Interval]) -> None:
        """The first completed step: the time since the start is startup, less what the intervals name."""
        self.first_done = done
        named = attribute(self.started, done, intervals)
        self._add(named)
        self._add({STARTUP: max(done - self.started - sum(named.values()), 0.0)})

    def step(
        self,
        previous_done: float,
        done: float,
        handed: float,
        intervals: Iterable[Interval],
        model_flops: Mapping[tuple[str, int], float],
        hardware_flops: Mapping[tuple[str, int], float],
    ) -> float:
        """A step that completed at `done` right after the one completed at `previous_done`; `handed` is when the
        host handed it to step(). Returns its duration."""
        duration = done - previous_done
        named = attribute(previous_done, done, intervals)
        self._add(named)
        rest = max(duration - sum(named.values()), 0.0)
        excess = 0.0
        if len(self.recent) >= STALL_MIN_STEPS:
            excess = max(rest - self.stall_factor * _sorted_median(self._rests), 0.0)
        if excess > 0:
            self._add({STALL: excess})
        self.productive += rest - excess
        self.host_wait += max(handed - previous_done, 0.0)
        self.histogram.observe(duration)
        self.recent.append(WindowStep(duration, rest, dict(model_flops), dict(hardware_flops)))
        bisect.insort(self._rests, rest)
        while len(self.recent) > self.window:
            del self._rests[bisect.bisect_left(self._rests, self.recent.popleft().rest)]
        return duration

    def gap(self, previous_done: float, done: float, intervals: Iterable[Interval], restart: bool) -> None:
        """A step whose number does not follow the previous one: its interval is no step duration. After a restore
        (`restart`) the unnamed rest is `restart` badput and the window starts again; after a jump (steps not
        reported) it is productive."""
        named = attribute(previous_done, done, intervals)
        self._add(named)
        rest = max(done - previous_done - sum(named.values()), 0.0)
        if restart:
            self._add({RESTART: rest})
            self.recent.clear()
            self._rests.clear()
        else:
            self.productive += rest

    def utilization(self, peaks: Mapping[tuple[str, int], float]) -> tuple[dict[tuple[str, int], float], ...]:
        """(MFU, HFU) per device over the window: its FLOPs / (the window's duration x the device's peak)."""
        seconds = sum(s.duration for s in self.recent)
        mfu: dict[tuple[str, int], float] = {}
        hfu: dict[tuple[str, int], float] = {}
        if seconds <= 0:
            return mfu, hfu
        for key, peak in peaks.items():
            model = sum(s.model_flops.get(key, 0.0) for s in self.recent)
            hardware = sum(s.hardware_flops.get(key, 0.0) for s in self.recent)
            if any(key in s.model_flops for s in self.recent):
                mfu[key] = model / (seconds * peak)
            if any(key in s.hardware_flops for s in self.recent):
                hfu[key] = hardware / (seconds * peak)
        return mfu, hfu


def _sorted_median(values: list[float]) -> float:
    """statistics.median of an already sorted, non-empty list."""
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
