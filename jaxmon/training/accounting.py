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

import numpy as np

from jaxmon.training.window import DURATION_BUCKETS, Histogram, WindowStep, WindowSums

# A stall is judged once the window holds this many steps (fewer give no stable median).
STALL_MIN_STEPS = 5
# A run of steps at least this long is booked with NumPy (a look's batch of short steps): fewer, and a loop costs less.
VECTOR_STEPS = 32
BOUNDS = np.array(DURATION_BUCKETS)
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
        host handed it to step(). Returns its duration. The FLOPs mappings are kept by reference (never written
        to). A few operations a step (the waiter books every step here)."""
        duration = done - previous_done
        idle_end = handed if previous_done < handed < done else (previous_done if handed <= previous_done else done)
        idle = idle_end - previous_done
        busy = duration - idle
        badput = self.badput
        named_total = 0.0
        if intervals and idle > 0:
            for kind, seconds in attribute(previous_done, idle_end, intervals).items():
                if seconds > 0:
                    badput[kind] = badput.get(kind, 0.0) + seconds
                    named_total += seconds
        if idle > named_total:
            badput[HOST] = badput.get(HOST, 0.0) + idle - named_total
        recent, ordered = self.recent, self._busy
        excess = 0.0
        if len(recent) >= STALL_MIN_STEPS:
            mid = len(ordered) // 2
            median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
            excess = busy - self.stall_factor * median
            if excess > 0:
                badput[STALL] = badput.get(STALL, 0.0) + excess
            else:
                excess = 0.0
        self.productive += busy - excess
        self.host_wait += idle
        self.last_done = done
        histogram = self.histogram
        histogram.counts[bisect.bisect_left(histogram.bounds, duration)] += 1
        histogram.total += duration
        entered = WindowStep(duration, busy, duration - named_total, model_flops, hardware_flops)
        recent.append(entered)
        self._sums.enter(entered)
        bisect.insort(ordered, busy)
        if len(recent) > self.window:
            left = recent.popleft()
            self._sums.leave(left)
            del ordered[bisect.bisect_left(ordered, left.busy)]
        return duration

    def steps(
        self,
        previous_done: float,
        done: list[float],
        handed: list[float],
        model_flops: Mapping[tuple[str, int], float],
        hardware_flops: Mapping[tuple[str, int], float],
    ) -> None:
        """A run of consecutive steps, completed at `done` (the first right after the one completed at
        `previous_done`), handed at `handed`, with no badput interval to charge and the same FLOPs mappings: what
        step() of each would book, in one pass (the waiter books a batch of steps this way). The stall check
        compares each step with the window's median at the run's start (a run is tens of milliseconds of steps);
        before the window holds STALL_MIN_STEPS, each step is step()'s own."""
        recent, ordered = self.recent, self._busy
        if len(recent) < STALL_MIN_STEPS:
            for previous, end, given in zip([previous_done, *done[:-1]], done, handed, strict=True):
                self.step(previous, end, given, (), model_flops, hardware_flops)
            return
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        threshold = self.stall_factor * median
        if len(done) >= VECTOR_STEPS:
            self._vector_run(previous_done, done, handed, threshold, model_flops, hardware_flops)
            return
        bounds, counts = self.histogram.bounds, self.histogram.counts
        bisect_left, insort, new, append = bisect.bisect_left, bisect.insort, tuple.__new__, recent.append
        previous = previous_done
        idle_sum = busy_sum = excess = 0.0
        for end, given in zip(done, handed, strict=True):
            duration = end - previous
            idle = given - previous if previous < given < end else (0.0 if given <= previous else duration)
            busy = duration - idle
            if busy > threshold:
                excess += busy - threshold
            counts[bisect_left(bounds, duration)] += 1
            append(new(WindowStep, (duration, busy, duration, model_flops, hardware_flops)))
            insort(ordered, busy)
            idle_sum += idle
            busy_sum += busy
            previous = end
        span = previous - previous_done
        self._run_totals(span, idle_sum, busy_sum, excess, previous)
        self._sums.enter_run(len(done), span, model_flops, hardware_flops)
        if len(recent) > self.window:
            leaving = [recent.popleft() for _ in range(len(recent) - self.window)]
            for left in leaving:
                del ordered[bisect_left(ordered, left.busy)]
            self._sums.leave_run(leaving)

    def _run_totals(self, span: float, idle: float, busy: float, excess: float, last_done: float) -> None:
        """A run's sums added: its span to the histogram's, its host and stall parts to badput, the rest productive."""
        self.histogram.total += span
        if idle > 0:
            self.badput[HOST] = self.badput.get(HOST, 0.0) + idle
        if excess > 0:
            self.badput[STALL] = self.badput.get(STALL, 0.0) + excess
        self.productive += busy - excess
        self.host_wait += idle
        self.last_done = last_done

    def _vector_run(
        self,
        previous_done: float,
        done: list[float],
        handed: list[float],
        threshold: float,
        model_flops: Mapping[tuple[str, int], float],
        hardware_flops: Mapping[tuple[str, int], float],
    ) -> None:
        """steps() of a long run (a batch of short steps), as NumPy operations on its columns: the same arithmetic
        step by step, sums added once. Of the run, only the steps that stay in the window are kept as WindowSteps
        (the earlier ones enter and leave it within the run: they change no sum), and the window's sorted busy
        parts are sorted anew."""
        ends = np.array(done)
        given = np.array(handed)
        starts = np.empty_like(ends)
        starts[0] = previous_done
        starts[1:] = ends[:-1]
        duration = ends - starts
        # As step(): the host's idle part is from the previous completion to the hand-off, within the interval.
        idle = np.where(given <= starts, 0.0, np.where(given < ends, given - starts, duration))
        busy = duration - idle
        excess = float(np.maximum(busy - threshold, 0.0).sum())
        idle_sum = float(idle.sum())
        busy_sum = float(busy.sum())
        counts = self.histogram.counts
        for index, count in enumerate(
            np.bincount(np.searchsorted(BOUNDS, duration, side="left"), minlength=len(counts)).tolist()
        ):
            if count:
                counts[index] += count
        self._run_totals(done[-1] - previous_done, idle_sum, busy_sum, excess, done[-1])
        recent, sums = self.recent, self._sums
        kept = min(len(done), self.window)
        leaving = min(len(recent), len(recent) + kept - self.window)
        whole = leaving == len(recent)  # the run turns the whole window over (a look's batch usually does)
        if whole:
            recent.clear()
            sums.clear()
        elif leaving > 0:
            sums.leave_run([recent.popleft() for _ in range(leaving)])
        new = tuple.__new__
        kept_durations = duration[-kept:].tolist()
        kept_busy = busy[-kept:]
        for d, b in zip(kept_durations, kept_busy.tolist(), strict=True):
            recent.append(new(WindowStep, (d, b, d, model_flops, hardware_flops)))
        sums.enter_run(kept, math.fsum(kept_durations), model_flops, hardware_flops)
        self._busy = np.sort(kept_busy).tolist() if whole else sorted(step.busy for step in recent)

    def typical_busy(self) -> float | None:
        """The window's median busy part (None: no step in it)."""
        return _sorted_median(self._busy) if self._busy else None

    def pace(self) -> float | None:
        """The window's mean step, completion to completion (None: no step in it): a loop whose device is behind
        its host completes a step this often, whichever of its batch's steps the dating gave the time to."""
        recent = self.recent
        return math.fsum(step.duration for step in recent) / len(recent) if recent else None

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
            if (model := sums.total(sums.model, key)) is not None:
                mfu[key] = model / (seconds * peak)
            if (hardware := sums.total(sums.hardware, key)) is not None:
                hfu[key] = hardware / (seconds * peak)
        return mfu, hfu


def _sorted_median(values: list[float]) -> float:
    """statistics.median of an already sorted, non-empty list."""
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
