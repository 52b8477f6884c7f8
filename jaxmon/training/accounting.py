"""Where a training process's time went: step intervals, badput intervals, stalls, and the window MFU is taken over.

Pure bookkeeping on one clock (seconds, monotonic), fed by the tracker's waiter thread; tested on literals.

- A step's interval runs from the previous step's completion to its own (completion to completion: what a
  synchronous job's step costs, whatever the host did meanwhile).
- The device is idle in that interval from the previous completion until the step was handed to `step()` (never,
  when the host handed it over before the previous one completed: a pipelined loop); busy for the rest.
- Badput intervals (`badput()` blocks, compilations, Orbax's blocking checkpoint saves and restores) are charged
  only inside the idle window, each instant to one kind (the interval that started first): a data load that
  overlaps device work costs nothing. The idle time no interval names is `host` badput.
- The busy part is productive, less a stall: the excess of the busy part over `stall_factor` x the median of the
  window's recent busy parts.
- Before the first completed step, the time since the tracker started is `startup` badput, less what overlapping
  intervals already name (compile, restore, ...).
- Productive time plus every kind of badput is the time from the start to the last known completion, always: a
  span whose steps' completions are unknown (a ready array deleted first) or whose numbers do not follow is
  charged as a whole (`gap`).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

# Buckets of jaxmon_training_step_duration_seconds: from milliseconds to minutes, fixed so that histograms of every
# process of a job aggregate (sum by le).
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 150.0, 300.0, 600.0,
)  # fmt: skip
# A stall is judged once the window holds this many steps (fewer give no stable median).
STALL_MIN_STEPS = 5
# Badput intervals kept for attribution (Intervals): past this many since the last completion, closed ones are dropped
# down to INTERVALS_AFTER_DROP (so that dropping runs once in that many intervals at most).
MAX_INTERVALS = 10_000
INTERVALS_AFTER_DROP = MAX_INTERVALS * 3 // 4
STARTUP = "startup"
STALL = "stall"
RESTART = "restart"
HOST = "host"


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


class Intervals:
    """The badput intervals a step completing from now on may be charged for: those still open and those that ended
    after the last completion (`forget`), in the order they were added.

    An open one (a badput() block still running) is never dropped: there are as many as blocks open at once.
    Past MAX_INTERVALS, first the closed ones inside an open interval that started before them go (the open one is
    charged for each of their instants: no figure changes), then the oldest closed ones (their time then reads as
    another kind, or host), which `add` returns the number of, for the caller to count."""

    def __init__(self) -> None:
        self._items: deque[Interval] = deque()

    def __iter__(self) -> Iterator[Interval]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, interval: Interval) -> int:
        """Keep `interval`; returns how many closed intervals were dropped to stay within MAX_INTERVALS."""
        self._items.append(interval)
        return self._shed() if len(self._items) > MAX_INTERVALS else 0

    def forget(self, done: float) -> None:
        """Drop the intervals that ended by `done`, a completion: every later step interval starts after it."""
        kept = [i for i in self._items if i.end > done]
        if len(kept) != len(self._items):
            self._items = deque(kept)

    def _shed(self) -> int:
        first_open = min((i.start for i in self._items if math.isinf(i.end)), default=math.inf)
        kept = [i for i in self._items if math.isinf(i.end) or i.start <= first_open]
        excess = max(len(kept) - INTERVALS_AFTER_DROP, 0)
        dropped = 0
        if excess:
            newest: list[Interval] = []
            for i in kept:
                if dropped < excess and not math.isinf(i.end):
                    dropped += 1
                else:
                    newest.append(i)
            kept = newest
        self._items = deque(kept)
        return dropped


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
    """One step of the window: its interval, its busy part, the part MFU counts (less named badput), and its FLOPs
    per device."""

    duration: float
    busy: float
    counted: float
    model_flops: Mapping[tuple[str, int], float]
    hardware_flops: Mapping[tuple[str, int], float]


class RunningSum:
    """A sum that values enter and leave, compensated (Neumaier's variant of Kahan's summation): the window's
    seconds and FLOPs are kept this way so that reading them is O(1), without the drift of a plain running sum.

    A plain `+=`/`-=` pair loses the low bits of every value it adds to a larger total, and they never come back when
    that value leaves: over millions of steps the window's total drifts, worst after a huge value (a 10-minute
    stall, a step of 1e18 FLOPs) entered and left it. The compensation carries those low bits, so the error stays
    within a few ulps of the true total whatever went through it. A sum whose last value left is reset to exactly
    0 (the caller counts its values)."""

    __slots__ = ("compensation", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.compensation = 0.0

    def add(self, value: float) -> None:
        """Add `value` (subtract with its negation)."""
        total = self.total + value
        if abs(self.total) >= abs(value):
            self.compensation += (self.total - total) + value
        else:
            self.compensation += (value - total) + self.total
        self.total = total

    def value(self) -> float:
        """The sum."""
        return self.total + self.compensation


class WindowSums:
    """The window's counted seconds and per-device model and hardware FLOPs, kept as steps enter and leave it, and
    how many of its steps name each device: MFU and HFU are read in O(devices), whatever the window's length (the
    tracker reads them under the lock step() takes)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """An empty window: every sum exactly 0."""
        self.seconds = RunningSum()
        self.steps = 0
        self.model: dict[tuple[str, int], RunningSum] = {}
        self.hardware: dict[tuple[str, int], RunningSum] = {}
        self.model_steps: dict[tuple[str, int], int] = {}  # steps of the window whose model FLOPs name the device
        self.hardware_steps: dict[tuple[str, int], int] = {}

    def enter(self, step: WindowStep) -> None:
        """`step` joins the window."""
        self.steps += 1
        self.seconds.add(step.counted)
        _enter(self.model, self.model_steps, step.model_flops)
        _enter(self.hardware, self.hardware_steps, step.hardware_flops)

    def leave(self, step: WindowStep) -> None:
        """`step` (in the window) leaves it; the window that empties is exactly 0 again."""
        self.steps -= 1
        if self.steps == 0:
            self.clear()
            return
        self.seconds.add(-step.counted)
        _leave(self.model, self.model_steps, step.model_flops)
        _leave(self.hardware, self.hardware_steps, step.hardware_flops)


def _enter(
    sums: dict[tuple[str, int], RunningSum], counts: dict[tuple[str, int], int], flops: Mapping[tuple[str, int], float]
) -> None:
    for key, value in flops.items():
        counts[key] = counts.get(key, 0) + 1
        sums.setdefault(key, RunningSum()).add(value)


def _leave(
    sums: dict[tuple[str, int], RunningSum], counts: dict[tuple[str, int], int], flops: Mapping[tuple[str, int], float]
) -> None:
    for key, value in flops.items():
        if counts[key] == 1:  # its last step leaves: exactly nothing, as a recomputation would say
            del counts[key], sums[key]
        else:
            counts[key] -= 1
            sums[key].add(-value)


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
    last_done: float | None = None  # the last completion booked: productive + badput = last_done - started
    recent: deque[WindowStep] = field(default_factory=deque)
    # The busy parts of `recent`, sorted: the stall check's median at every step without sorting the window.
    _busy: list[float] = field(default_factory=list, init=False, repr=False)
    # The sums of `recent` that MFU and HFU are made of.
    _sums: WindowSums = field(default_factory=WindowSums, init=False, repr=False)

    def _add(self, kinds: Mapping[str, float]) -> None:
        for kind, seconds in kinds.items():
            if seconds > 0:
                self.badput[kind] = self.badput.get(kind, 0.0) + seconds

    def first(self, done: float, intervals: Iterable[Interval]) -> None:
        """The first completed step: the time since the start is startup, less what the intervals name."""
        self.first_done = self.last_done = done
        for kind in (STARTUP, HOST, STALL):  # the kinds every step can add to exist from the first step on
            self.badput.setdefault(kind, 0.0)
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
        idle_end = min(max(handed, previous_done), done)
        idle = idle_end - previous_done
        busy = duration - idle
        named = attribute(previous_done, idle_end, intervals)
        named_total = sum(named.values())
        self._add(named)
        self._add({HOST: max(idle - named_total, 0.0)})
        excess = 0.0
        if len(self.recent) >= STALL_MIN_STEPS:
            excess = max(busy - self.stall_factor * _sorted_median(self._busy), 0.0)
        self._add({STALL: excess})
        self.productive += busy - excess
        self.host_wait += idle
        self.last_done = done
        self.histogram.observe(duration)
        entered = WindowStep(duration, busy, duration - named_total, dict(model_flops), dict(hardware_flops))
        self.recent.append(entered)
        self._sums.enter(entered)
        bisect.insort(self._busy, busy)
        while len(self.recent) > self.window:
            left = self.recent.popleft()
            self._sums.leave(left)
            del self._busy[bisect.bisect_left(self._busy, left.busy)]
        return duration

    def gap(self, previous_done: float, done: float, intervals: Iterable[Interval], restart: bool) -> None:
        """A span that is no step's interval: a step whose number does not follow the previous one, or steps whose
        completions are unknown. The intervals inside it are charged by kind; after a restore (`restart`) the
        unnamed rest is `restart` badput and the window starts again, otherwise (steps not reported, or not seen
        complete) it is productive."""
        named = attribute(previous_done, done, intervals)
        self._add(named)
        rest = max(done - previous_done - sum(named.values()), 0.0)
        self.last_done = done
        if restart:
            self._add({RESTART: rest})
            self.recent.clear()
            self._busy.clear()
            self._sums.clear()
        else:
            self.productive += rest

    def total(self) -> float:
        """Productive time plus every kind of badput (= last_done - started once a step completed)."""
        return self.productive + sum(self.badput.values())

    def utilization(self, peaks: Mapping[tuple[str, int], float]) -> tuple[dict[tuple[str, int], float], ...]:
        """(MFU, HFU) per device over the window: its FLOPs / (the window's time less its named badput x the
        device's peak). Host time and stalls stay in the denominator; a checkpoint does not. O(devices): the
        window's sums are kept as steps enter and leave it."""
        sums = self._sums
        seconds = sums.seconds.value() if sums.steps else 0.0
        mfu: dict[tuple[str, int], float] = {}
        hfu: dict[tuple[str, int], float] = {}
        if seconds <= 0:
            return mfu, hfu
        for key, peak in peaks.items():
            if (model := sums.model.get(key)) is not None:
                mfu[key] = model.value() / (seconds * peak)
            if (hardware := sums.hardware.get(key)) is not None:
                hfu[key] = hardware.value() / (seconds * peak)
        return mfu, hfu


def _sorted_median(values: list[float]) -> float:
    """statistics.median of an already sorted, non-empty list."""
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
