"""Everything a training process's steps add up to, booked a run of steps at a time: one implementation.

The waiter (waiter.py) hands the ledger runs: consecutive steps with the same figures and tracked calls, each with
its hand-off and its completion (dating.py). A run is booked with NumPy on its columns, whatever its length (one
step, or a look's two thousand): its time (below), its window, its histogram and its totals (steps, examples,
tokens, FLOPs and bytes per device, collective bytes, the predicted peak memory's window). Written by the waiter under
the tracker's lock; read by the tracker's reading().

Time, on one monotonic clock:
- A step's interval runs from the previous step's completion to its own (what a synchronous job's step costs,
  whatever the host did meanwhile).
- The device is idle in it until the step was handed to `step()` (never, where the host handed it before the
  previous one completed: a pipelined loop), busy for the rest.
- Badput intervals (`badput()` blocks, compilations, Orbax's saves and restores) are charged only inside the idle
  part, each instant to one kind (the interval that started first). The idle time no interval names is `host`.
- The busy part is productive, less a stall: its excess over `stall_factor` x the median busy part of the window's
  observed steps (those whose completion the waiter saw or the host's paced calls gave, never a date the queue
  model placed), judged against the window as it was at the run's start.
- Before the first completion, the time since the start is `startup`, less what intervals name.
- Productive time plus every kind of badput is the time from the start to the last completion, always: a span
  whose completions are unknown, or whose step numbers do not follow, is charged as a whole (`gap`).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxmon.catalog.hardware import nominal_bandwidth as per_link
from jaxmon.device_readings import DeviceInfo
from jaxmon.training.communication import WindowMax, book
from jaxmon.training.handed import Program
from jaxmon.training_readings import DeviceTraining

# Buckets of jaxmon_training_step_duration_seconds: from milliseconds to minutes, fixed so that histograms of every
# process of a job aggregate (sum by le).
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 150.0, 300.0, 600.0,
)  # fmt: skip
BOUNDS = np.array(DURATION_BUCKETS)
# A stall is judged once the window holds this many observed steps (fewer give no stable median).
STALL_MIN_STEPS = 5
# Badput intervals kept (Intervals): past this many since the last completion, closed ones are dropped down to
# INTERVALS_AFTER_DROP (so that dropping runs once in that many intervals at most).
MAX_INTERVALS = 10_000
INTERVALS_AFTER_DROP = 7_500
STARTUP, STALL, RESTART, HOST = "startup", "stall", "restart", "host"
# The largest figure counted (a larger int would overflow a float sum).
BIG = 1e300
# FLOPs mappings kept (one per figure and per set of tracked calls; a loop has a few): past it, the unused go.
MAX_PROFILES = 256
NO_FLOPS: Mapping[tuple[str, int], float] = {}
Flops = Mapping[tuple[str, int], float]


@dataclass
class Interval:
    """Time that was not training, of one kind; `end` is +inf while it lasts (a step completing meanwhile is charged
    up to its completion, the next one from there)."""

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

    An open one is never dropped. Past MAX_INTERVALS, first the closed ones inside an open interval that started
    before them go (the open one is charged for each of their instants: no figure changes), then the oldest closed
    ones (their time then reads as another kind, or host), which `add` returns the number of."""

    def __init__(self) -> None:
        self._items: deque[Interval] = deque()

    def __iter__(self) -> Iterator[Interval]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, interval: Interval) -> int:
        """Keep `interval`; returns how many closed intervals were dropped to stay within MAX_INTERVALS."""
        self._items.append(interval)
        if len(self._items) <= MAX_INTERVALS:
            return 0
        first_open = min((i.start for i in self._items if math.isinf(i.end)), default=math.inf)
        kept = [i for i in self._items if math.isinf(i.end) or i.start <= first_open]
        excess = max(len(kept) - INTERVALS_AFTER_DROP, 0)
        closed = [i for i in kept if not math.isinf(i.end)][:excess]
        dropped = {id(i) for i in closed}
        self._items = deque(i for i in kept if id(i) not in dropped)
        return len(closed)

    def forget(self, done: float) -> None:
        """Drop the intervals that ended by `done`, a completion: every later step interval starts after it."""
        kept = [i for i in self._items if i.end > done]
        if len(kept) != len(self._items):
            self._items = deque(kept)


class Histogram:
    """A cumulative histogram with fixed upper bounds (Prometheus `le`), sum and count."""

    def __init__(self) -> None:
        self.bounds = DURATION_BUCKETS
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)
        self.total = 0.0

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
class Run:
    """Consecutive steps the waiter dated: numbers from `first` on, the same figures (None: not given) and tracked
    calls; `handed` and `done` (None: unknown, the steps counted unready) their hand-offs and completions;
    `observed`: which completions were seen or given by the host's paced calls, not placed by the queue model."""

    first: int
    handed: Sequence[float]
    done: Sequence[float] | None
    observed: Sequence[bool]
    examples: float | None = None
    tokens: float | None = None
    model_flops: float | None = None
    programs: tuple[Program, ...] = ()


def usable(figure: Any) -> bool:
    """Whether a host figure counts as given: None, or a finite int or float >= 0."""
    return figure is None or ((type(figure) is int or type(figure) is float) and 0 <= figure <= BIG)


class Ledger:
    """A training process's time and totals since `started`, with the window MFU, HFU and the stall check read."""

    def __init__(
        self,
        started: float,
        devices: Sequence[DeviceInfo] = (),
        device_count: int = 1,
        process_count: int = 1,
        window: int = 100,
        stall_factor: float = 3.0,
        problem: Callable[..., None] | None = None,
    ) -> None:
        self.started = started
        self.window = max(int(window), 1)
        self.stall_factor = stall_factor
        self._devices = list(devices)
        self._device_count = max(device_count, 1)
        self._process_count = max(process_count, 1)
        self._problem = problem or (lambda *a, **k: None)
        # Time.
        self.productive = 0.0
        self.host_wait = 0.0
        self.badput: dict[str, float] = {}
        self.histogram = Histogram()
        self.first_done: float | None = None
        self.last_done: float | None = None  # the last completion booked: productive + badput = last_done - started
        # The window, a ring of its last `window` steps (`_filled` of them, the next written at `_at`): their counted
        # seconds (less named badput), busy parts, whether observed, and FLOPs profile (an index into _profiles:
        # (model, hardware) FLOPs per device).
        self._counted = np.zeros(self.window)
        self._busy = np.zeros(self.window)
        self._observed = np.zeros(self.window, dtype=bool)
        self._profile = np.zeros(self.window, dtype=np.int64)
        self._filled = self._at = 0
        self._profiles: dict[int, tuple[Flops, Flops]] = {}
        self._profile_of: dict[tuple[int, int], int] = {}
        self._next_profile = 0
        self._prune_at = MAX_PROFILES
        # Totals.
        self.steps = 0
        self.last: tuple[int, float | None] | None = None  # (number, completion) of the last step booked
        self.examples = 0.0
        self.tokens = 0.0
        self.model: dict[tuple[str, int], float] = {}
        self.hardware: dict[tuple[str, int], float] = {}
        self.bytes: dict[tuple[str, int], float] = {}
        self.collectives: dict[tuple[str, int], dict[tuple[str, str, str], float]] = {}  # (op, axes, link)
        self.peak_memory = WindowMax(self.window)  # the largest predicted peak of the window's steps' programs
        self.waiting: dict[int, tuple[Program, int]] = {}  # calls of programs not analysed yet (communication.book)
        self.loss: dict[str, float] = {}  # the loss gauge: a held step's scalars, by name
        self.loss_step: int | None = None
        self._model_last: tuple[float, Flops] = (-1.0, {})
        self._hardware_of: dict[tuple[Program, ...], Flops] = {}

    # -- time ---------------------------------------------------------------------------------------------

    def first(self, done: float, intervals: Iterable[Interval]) -> None:
        """The first completion: the time since the start is startup, less what the intervals name."""
        self.first_done = self.last_done = done
        for kind in (STARTUP, HOST, STALL):  # the kinds every step can add to exist from the first step on
            self.badput.setdefault(kind, 0.0)
        named = attribute(self.started, done, intervals)
        self._add(named)
        self._add({STARTUP: max(done - self.started - sum(named.values()), 0.0)})

    def run(
        self,
        previous_done: float,
        done: Sequence[float],
        handed: Sequence[float],
        intervals: Iterable[Interval] = (),
        model_flops: Flops = NO_FLOPS,
        hardware_flops: Flops = NO_FLOPS,
        observed: bool | Sequence[bool] = True,
    ) -> None:
        """Consecutive steps completed at `done` (the first right after the completion at `previous_done`), handed at
        `handed`, with these FLOPs per device each: their time booked, the window turned over. The stall check
        compares each with the window's median at the run's start."""
        ends = np.asarray(done, dtype=float)
        starts = np.empty_like(ends)
        starts[0] = previous_done
        starts[1:] = ends[:-1]
        duration = ends - starts
        idle = np.clip(np.asarray(handed, dtype=float) - starts, 0.0, duration)
        busy = duration - idle
        named = 0.0
        if intervals := list(intervals):
            named = np.zeros_like(duration)
            for k in np.flatnonzero(idle > 0).tolist():
                kinds = attribute(float(starts[k]), float(starts[k] + idle[k]), intervals)
                self._add(kinds)
                named[k] = sum(kinds.values())
        threshold = self.stall_threshold()
        stall = float(np.maximum(busy - threshold, 0.0).sum()) if threshold is not None else 0.0
        waited = float(idle.sum())
        self.productive += float(busy.sum()) - stall
        self.host_wait += waited
        self._add({HOST: waited - float(np.sum(named)), STALL: stall})
        counts = self.histogram.counts
        if len(ends) == 1:
            counts[int(np.searchsorted(BOUNDS, duration[0]))] += 1
        else:
            for index, count in enumerate(
                np.bincount(np.searchsorted(BOUNDS, duration), minlength=len(counts)).tolist()
            ):
                counts[index] += count
        self.histogram.total += float(ends[-1] - previous_done)
        self.last_done = float(ends[-1])
        self._enter(duration - named, busy, observed, self._profile_id(model_flops, hardware_flops))

    def gap(self, previous_done: float, done: float, intervals: Iterable[Interval], restart: bool) -> None:
        """A span that is no step's interval: a step whose number does not follow the previous one, or steps whose
        completions are unknown. The intervals inside it are charged by kind; after a restore (`restart`) the
        unnamed rest is `restart` badput and the window starts again, otherwise it is productive."""
        named = attribute(previous_done, done, intervals)
        self._add(named)
        rest = max(done - previous_done - sum(named.values()), 0.0)
        self.last_done = done
        if restart:
            self._add({RESTART: rest})
            self._filled = self._at = 0
            self.peak_memory.clear()
        else:
            self.productive += rest

    def _add(self, kinds: Mapping[str, float]) -> None:
        for kind, seconds in kinds.items():
            if seconds > 0 or kind in (HOST, STALL):
                self.badput[kind] = self.badput.get(kind, 0.0) + max(seconds, 0.0)

    def _enter(self, counted: np.ndarray, busy: np.ndarray, observed: bool | Sequence[bool], profile: int) -> None:
        """Steps join the window; the oldest leave it past `window`."""
        size, n = self.window, len(counted)
        flags = np.asarray(observed, dtype=bool)
        if n >= size:
            counted, busy, n = counted[-size:], busy[-size:], size
            flags = flags[-size:] if flags.ndim else flags
        where = slice(self._at, self._at + n) if self._at + n <= size else (self._at + np.arange(n)) % size
        self._counted[where], self._busy[where], self._observed[where], self._profile[where] = (
            counted, busy, flags, profile,
        )  # fmt: skip
        self._at = (self._at + n) % size
        self._filled = min(self._filled + n, size)

    def _kept(self, column: np.ndarray) -> np.ndarray:
        """A column of the window's steps (in ring order)."""
        return column[: self._filled]

    def _profile_id(self, model: Flops, hardware: Flops) -> int:
        """The window's index of a (model, hardware) pair of FLOPs mappings (kept by reference, never written to)."""
        key = (id(model), id(hardware))
        found = self._profile_of.get(key)
        if found is None:
            if len(self._profiles) >= self._prune_at:  # the pairs no window step has any more go
                used = set(np.unique(self._kept(self._profile)).tolist())
                self._profiles = {i: p for i, p in self._profiles.items() if i in used}
                self._profile_of = {(id(m), id(h)): i for i, (m, h) in self._profiles.items()}
                self._prune_at = max(MAX_PROFILES, 2 * len(self._profiles))  # (amortized: each prune halves)
            found = self._next_profile
            self._next_profile += 1
            self._profiles[found] = (model, hardware)
            self._profile_of[key] = found
        return found

    def window_steps(self) -> list[tuple[float, float, bool, Flops, Flops]]:
        """The window's steps, oldest first: (counted seconds, busy part, observed, model FLOPs, hardware FLOPs)."""
        order = (np.arange(self._filled) + (self._at - self._filled)) % self.window
        return [
            (
                float(self._counted[i]),
                float(self._busy[i]),
                bool(self._observed[i]),
                *self._profiles[int(self._profile[i])],
            )
            for i in order.tolist()
        ]

    def total(self) -> float:
        """Productive time plus every kind of badput (= last_done - started once a step completed)."""
        return self.productive + sum(self.badput.values())

    def typical_busy(self) -> float | None:
        """The median busy part of the window's observed steps (None: none observed yet): a step's typical device
        time, which the waiter dates the steps it did not see with."""
        observed = self._observed_busy()
        return _median(observed) if len(observed) else None

    def stall_threshold(self) -> float | None:
        """The busy part past which a step stalled (None: too few observed steps to judge by)."""
        observed = self._observed_busy()
        return self.stall_factor * _median(observed) if len(observed) >= STALL_MIN_STEPS else None

    def _observed_busy(self) -> np.ndarray:
        observed: np.ndarray = self._kept(self._busy)[self._kept(self._observed)]
        return observed

    def utilization(self, peaks: Mapping[tuple[str, int], float]) -> tuple[dict[tuple[str, int], float], ...]:
        """(MFU, HFU) per device over the window: its FLOPs / (the window's time less its named badput x the
        device's peak). Host time and stalls stay in the denominator; a checkpoint does not."""
        mfu: dict[tuple[str, int], float] = {}
        hfu: dict[tuple[str, int], float] = {}
        seconds = math.fsum(self._kept(self._counted).tolist())
        if seconds <= 0:
            return mfu, hfu
        ids, counts = np.unique(self._kept(self._profile), return_counts=True)
        used = [(self._profiles[i], c) for i, c in zip(ids.tolist(), counts.tolist(), strict=True)]
        for key, peak in peaks.items():
            for out, side in ((mfu, 0), (hfu, 1)):
                parts = [flops[side][key] * count for flops, count in used if key in flops[side]]
                if parts:
                    out[key] = math.fsum(parts) / (seconds * peak)
        return mfu, hfu

    # -- totals -------------------------------------------------------------------------------------------

    def book(self, run: Run, intervals: Iterable[Interval] = ()) -> None:
        """A run of the waiter's steps booked: its time (from the last completion, or as a gap where its first number
        does not follow the last one booked or completions before it are unknown) and its totals."""
        n = len(run.handed)
        last = self.last
        model = NO_FLOPS if run.model_flops is None else self.model_share(run.model_flops)
        hardware = self.hardware_of(run.programs) if run.programs else NO_FLOPS
        if run.done is not None:
            done, handed, observed = list(run.done), list(run.handed), list(run.observed)
            intervals = list(intervals)
            if self.last_done is None:
                self.first(done[0], intervals)
                done, handed, observed = done[1:], handed[1:], observed[1:]
            elif last is None or last[1] is None or run.first != last[0] + 1:
                restart = last is not None and run.first <= last[0]
                if last is not None and run.first != last[0] + 1:
                    reason = "back" if restart else "jump"
                    self._problem(reason, "training step numbers do not follow", previous=last[0], number=run.first)
                self.gap(self.last_done, done[0], intervals, restart)
                done, handed, observed = done[1:], handed[1:], observed[1:]
            if done:
                self.run(self.last_done, done, handed, intervals, model, hardware, observed)  # type: ignore[arg-type]
        self.last = (run.first + n - 1, None if run.done is None else run.done[-1])
        self.steps += n
        # step() is given the job's figures: this process's share, so that sum() over the job is the job's.
        if run.examples is not None:
            self.examples += run.examples * n / self._process_count
        if run.tokens is not None:
            self.tokens += run.tokens * n / self._process_count
        for key, share in model.items():
            self.model[key] = self.model.get(key, 0.0) + share * n
        counts = counted(run.programs)
        for program, calls in counts:
            cost = program.cost
            if cost is None:
                continue
            for device in cost.devices:
                if cost.flops is not None:
                    self.hardware[device] = self.hardware.get(device, 0.0) + cost.flops * calls * n
                if cost.bytes_accessed is not None:
                    self.bytes[device] = self.bytes.get(device, 0.0) + cost.bytes_accessed * calls * n
        peaks = book([(program, calls * n) for program, calls in counts], self.collectives, self.waiting)
        self.peak_memory.steps(peaks, n)

    def model_share(self, flops: float) -> Flops:
        """Each local device's share of a step's model FLOPs (the same mapping for the same figure)."""
        if flops != self._model_last[0]:
            share = flops / self._device_count
            self._model_last = (flops, {d.key: share for d in self._devices})
        return self._model_last[1]

    def hardware_of(self, calls: tuple[Program, ...]) -> Flops:
        """XLA's FLOPs per device of a step that made these tracked calls (one mapping per set of calls, kept)."""
        known = self._hardware_of.get(calls)
        if known is None:
            flops: dict[tuple[str, int], float] = {}
            for program, count in counted(calls):
                cost = program.cost
                if cost is not None and cost.flops is not None:
                    for device in cost.devices:
                        flops[device] = flops.get(device, 0.0) + cost.flops * count
            if len(self._hardware_of) >= MAX_PROFILES:
                self._hardware_of.clear()
            known = self._hardware_of[calls] = flops
        return known

    def devices(
        self,
        peaks: Mapping[tuple[str, int], tuple[float, str]],
        link_bandwidth: tuple[tuple[str, float], ...],
    ) -> tuple[DeviceTraining, ...]:
        """Each local device's totals now, with its peak (FLOP/s, source), MFU and HFU."""
        mfu, hfu = self.utilization({k: p for k, (p, _) in peaks.items()})
        peak_memory = self.peak_memory.maxima()
        return tuple(
            DeviceTraining(
                platform=d.platform,
                id=d.id,
                model_flops_total=self.model.get(d.key),
                hardware_flops_total=self.hardware.get(d.key),
                hardware_bytes_total=self.bytes.get(d.key),
                peak_flops=peaks[d.key][0] if d.key in peaks else None,
                peak_source=peaks[d.key][1] if d.key in peaks else None,
                mfu=mfu.get(d.key),
                hfu=hfu.get(d.key),
                collective_bytes_total=dict(self.collectives.get(d.key, {})),
                program_peak_memory_bytes=peak_memory.get(d.key),
                link_bandwidth=per_link(d.device_kind, link_bandwidth),
            )
            for d in self._devices
        )


def _median(values: np.ndarray) -> float:
    """statistics.median of a non-empty array (np.median's checks cost more than the partition)."""
    half = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, half)[half])
    low, high = np.partition(values, (half - 1, half))[half - 1 : half + 1]
    return float(low + high) / 2


def counted(programs: Sequence[Program]) -> list[tuple[Program, int]]:
    """A step's tracked calls (one entry a call) as (program, calls)."""
    out: dict[int, tuple[Program, int]] = {}
    for program in programs:
        out[id(program)] = (program, out.get(id(program), (program, 0))[1] + 1)
    return list(out.values())
