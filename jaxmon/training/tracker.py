"""The training tracker: `step()` on the training thread, a waiter thread that sees each step complete.

`step()` only notes the time, takes jaxmon's own handles on the JAX arrays it is given (`ops.hold`: a clone of
each, sharing its buffers) and queues the step (a deque append under a lock): it never blocks, never reads a
number off a device and never raises. The waiter takes the queued steps in order and waits for each one's ready
arrays and figure arrays in one call (`block_until_ready` releases the GIL, so training goes on dispatching), notes
when they are ready, then reads and checks the step number and the figures, and does the bookkeeping
(`accounting.py`). It calls JAX only on its own handles, so whatever the user does to the arrays meanwhile (delete,
donate, reuse) makes a call raise, never crash. Nothing here imports JAX: `ops`
(jaxmon.sources.local.training.JaxTraining) does that.
"""

from __future__ import annotations

import numbers
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from jaxmon.logsetup import ErrorLog
from jaxmon.training.accounting import MAX_INTERVALS, Accounting, Interval, Intervals
from jaxmon.training.communication import Analyzer, CollectiveNames, WindowMax, book
from jaxmon.training.handed import (
    EVENT_KIND,
    EVENT_KINDS,
    MAX_USER_KINDS,
    OTHER_KIND,
    Program,
    TrackerConfig,
    TrainingOps,
)
from jaxmon.training.nominal import per_link
from jaxmon.training.peaks import peak_table
from jaxmon.training.reading import DeviceTraining, TrainingReading
from jaxmon.training.sampler import sampler_for
from jaxmon.training.steps import PLAIN, Handoff, Held, Step, shown
from jaxmon.training.waiter import Waiter

log = structlog.get_logger("jaxmon.training")

__all__ = ["MAX_USER_KINDS", "OTHER_KIND", "Program", "Tracker", "TrackerConfig", "TrainingOps"]


class Tracker:
    """One training process's step telemetry."""

    def __init__(
        self,
        ops: TrainingOps,
        config: TrackerConfig,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`clock` is the monotonic clock every duration is measured on; `wall` the Unix clock the exported
        timestamps are read from, at each event (a clock step moves the later timestamps, never the durations)."""
        self.ops = ops
        self.config = config
        self._clock = clock
        self._wall = wall
        self._errors = ErrorLog(log, 3600.0)
        self._lock = threading.Lock()
        self._handed: deque[Handoff] = deque()  # steps handed, not yet taken by the waiter (appended, no lock)
        self._calls: list[Program] = []  # tracked calls since the last step(), one entry a call
        self._intervals = Intervals()  # badput intervals since the last completion (and the open ones)
        self._kinds: set[str] = set()  # the badput() kinds seen, MAX_USER_KINDS at most
        self._opened: set[str] = set()  # those and OTHER_KIND once it is used: series from their first open
        self._devices = ops.devices()
        self._device_count = max(ops.device_count(), 1)
        self._process_count = max(ops.process_count(), 1)
        self._peaks, self._no_peak = peak_table(self._devices, config.peak_flops)
        self._peak_warned: set[str] = set()  # the device kinds "no peak FLOP/s known" was said of
        started = clock()
        self.start_time = self._start_wall = wall()  # Unix time at the start, beside the monotonic start
        self._acct = Accounting(started=started, window=config.window, stall_factor=config.stall_factor)
        self._last: tuple[int, float | None] | None = None  # (number, completion) of the last step seen
        self._steps = 0
        self._last_wall: float | None = None
        self._seen: float | None = None  # the clock when the waiter last saw a step end (last_step_seen())
        self._examples = 0.0
        self._tokens = 0.0
        self._model: dict[tuple[str, int], float] = {}
        self._hardware: dict[tuple[str, int], float] = {}
        self._bytes: dict[tuple[str, int], float] = {}
        self._collectives: dict[tuple[str, int], dict[tuple[str, str, str], float]] = {}  # (op, axes, link)
        self._peak_memory = WindowMax(config.window)  # the largest predicted peak of the window's steps' programs
        self._collective_names = CollectiveNames()  # every analysed program's, for the sampled traces' events
        self._analyzer = Analyzer(ops.communication, self._collective_names.analysed, self._unanalysed, self._problem)
        self._waiting: dict[int, tuple[Program, int]] = {}  # calls of programs not analysed yet (book())
        self._problems: dict[str, int] = {}
        self._problems_lock = threading.Lock()
        self._stepping = False  # step() was called: a process that never does exports no training series
        self._dispatched: int | None = None  # the last step number handed to step()
        # Sampled traces: told of each step, completion and badput interval; their events named by the programs'
        # collectives. Made before the listener, which tells it of compilations and Orbax's saves.
        self.sampler = sampler_for(ops, config.profile, clock, self._collective_names)
        self._unlisten = ops.on_event_duration(self._on_event)
        self.waiter = Waiter(self._handed, ops, clock, self._problem, self.last_done, self.book)
        self._thread = self.waiter.thread

    # -- the training thread ------------------------------------------------------------------------------

    def step(self, number: Any, ready: tuple[Any, ...], examples: Any, tokens: Any, model_flops: Any) -> None:
        """Step `number` is dispatched; it is complete when the JAX arrays among `ready`'s leaves are (or, with none,
        a barrier on every device). Nothing is read or checked here: any of the numbers may be a JAX array still
        being computed, which the waiter reads once it is. No lock, no notify while the waiter is busy: one
        append to a deque (atomic)."""
        handed = self._clock()
        ops = self.ops
        arrays = ops.arrays(ready)
        if arrays:
            handles = [h for h in map(ops.hold, arrays) if h is not None]
            lost = len(handles) < len(arrays)
        else:  # no ready, or a tree of host numbers: no array says when the step is done
            handles, lost = ops.barrier(), False
        given = (number, examples, tokens, model_flops)
        if not (
            type(number) is int and type(examples) in PLAIN and type(tokens) in PLAIN and type(model_flops) in PLAIN
        ):
            given = tuple(Held(ops.hold(v)) if ops.is_array(v) else v for v in given)  # type: ignore[assignment]
        self._stepping = True
        host = type(number) is int or (isinstance(number, numbers.Integral) and not isinstance(number, bool))
        if host:
            self._dispatched = int(number)  # a host integer; a device one is set by the waiter
        calls, self._calls = self._calls, []
        if len(self._handed) + self.waiter.taken >= self.config.max_pending:
            self._problem("dropped", "training steps not tracked: the waiter is far behind", number=shown(number))
            return
        self._handed.append((handed, given, handles, calls, lost))
        if self.waiter.idle:  # it waits for a hand-off: only after a pause, never while steps come fast
            self.waiter.wake()
        if host:
            self.sampler.handed(int(number))  # a device step number starts no sampled trace (it is not read here)

    def measure(self, fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Program:
        """A new compiled program of a tracked function, just called with `args`: its cost, read here, on the
        calling thread (lowering it again is a cache hit; a failure is counted and the program has no cost); its
        communication and peak memory later, on jaxmon's analysis thread (communication.py)."""
        program = Program(fn)
        try:
            compiled = self.ops.compiled(fn, self.ops.avals(args, kwargs))
            program.cost = compiled.cost
        except Exception as exc:
            self._problem("cost", "no cost analysis for a tracked function", detail=f"{type(exc).__name__}: {exc}")
            return program
        self._analyzer.submit(program, compiled)
        return program

    def _unanalysed(self, event: str, exc: Exception | None) -> None:
        self._problem("communication", event, detail=f"{type(exc).__name__}: {exc}"[:200] if exc else None)

    def forgot_program(self) -> None:
        """A tracked function let its least recently called program's cost go (jaxmon.training.MAX_PROGRAMS)."""
        self._problem(
            "programs",
            "a tracked function ran more programs than jaxmon keeps the cost of: the least recently called is "
            "forgotten (its cost is read again if it runs again)",
        )

    def called(self, program: Program) -> None:
        """A tracked function ran `program` once in the current step (on the training thread, as step(): a list
        append, no lock)."""
        self._calls.append(program)

    def interval(self, kind: str, start: float, end: float = float("inf")) -> Interval:
        """Time that was not training, from `start` (and until `end`, or `close()`: a `badput()` block)."""
        with self._lock:
            if kind not in self._kinds and kind not in EVENT_KINDS:
                if len(self._kinds) < MAX_USER_KINDS:
                    self._kinds.add(kind)
                else:
                    self._problem(
                        "badput_kinds",
                        f"more than {MAX_USER_KINDS} kinds of badput(): further kinds count as {OTHER_KIND!r}",
                        kind=kind,
                    )
                    kind = OTHER_KIND
            if kind not in EVENT_KINDS:
                self._opened.add(kind)  # born at 0 now, counting from its close (kinds())
            interval = Interval(kind, start, end)
            if dropped := self._intervals.add(interval):
                self._problem(
                    "intervals",
                    f"more than {MAX_INTERVALS} badput intervals since the last completed step: the oldest are dropped",
                    times=dropped,
                )
        # Sampled traces stay off the steps it marks, placed by the last step number handed (sampler.py).
        self.sampler.badput(kind, id(interval), self._dispatched, end != float("inf"))
        return interval

    def pause(self) -> None:
        """A badput() block opens on the training thread: no step comes for a while."""
        self.waiter.hurry()

    def close(self, interval: Interval) -> None:
        """The interval ends now."""
        with self._lock:
            interval.end = self._clock()
        self.sampler.closed(id(interval), self._dispatched)

    def now(self) -> float:
        """The tracker's clock."""
        return self._clock()

    def pending(self) -> int:
        """Steps handed that the waiter has not booked yet."""
        return len(self._handed) + self.waiter.taken

    def last_step_seen(self) -> float | None:
        """When (the tracker's clock, monotonic) the waiter last saw a step end, complete or unready; None before
        any. The probe dispatches nothing while it is recent (docs/probe.md). One attribute read: no lock."""
        return self._seen

    def _on_event(self, event: str, seconds: float) -> None:
        kind = EVENT_KIND.get(event)
        if kind is not None and seconds > 0:
            end = self._clock()
            self.interval(kind, end - seconds, end)

    # -- the waiter thread --------------------------------------------------------------------------------

    def book(self, batch: list[Step], numbers: list[int | None], done: list[float | None]) -> None:
        """The waiter's steps, read (`numbers`: None where unusable) and dated (`done`: None where unknown)."""
        device_number = type(batch[-1].given[0]) is Held
        completed: list[tuple[int, float]] = []  # for the sampled traces: once per batch
        with self._lock:
            for item, number, completion in zip(batch, numbers, done, strict=True):
                if number is None:  # no step number to book it under (counted): its time goes to the next step's gap
                    continue
                if item is batch[-1] and device_number and not self._handed:
                    self._dispatched = number  # a device step number, and no later step handed: the last one handed
                item.number = number
                self._complete(item, completion)
                if completion is not None:
                    completed.append((number, completion))
            if completed:
                self.sampler.completed(completed)
            self._analyzer.kick()  # new programs are analysed from now on, off the training thread

    def last_done(self) -> float | None:
        """The last completion booked (the waiter's start for its next batch)."""
        return self._acct.last_done

    def _complete(self, item: Step, done: float | None) -> None:
        """Book step `item`, completed at `done` (None: unknown), with the lock held."""
        self._seen = self._clock()
        self._steps += 1
        self._last_wall = self._wall_at(done)
        # step() is given the job's figures: this process's share, so that sum() over the job is the job's.
        self._examples += (item.examples or 0.0) / self._process_count
        self._tokens += (item.tokens or 0.0) / self._process_count
        model: dict[tuple[str, int], float] = {}
        if item.model_flops is not None:
            share = item.model_flops / self._device_count
            model = {d.key: share for d in self._devices}
        hardware: dict[tuple[str, int], float] = {}
        calls = counted(item.programs)
        for program, count in calls:
            cost = program.cost
            if cost is None:
                continue
            for device in cost.devices:
                if cost.flops is not None:
                    hardware[device] = hardware.get(device, 0.0) + cost.flops * count
                if cost.bytes_accessed is not None:
                    self._bytes[device] = self._bytes.get(device, 0.0) + cost.bytes_accessed * count
        self._peak_memory.step(book(calls, self._collectives, self._waiting))
        for totals, add in ((self._model, model), (self._hardware, hardware)):
            for device, flops in add.items():
                totals[device] = totals.get(device, 0.0) + flops
            if add and self._no_peak:
                self._mfu_wanted(add)
        previous, self._last = self._last, (item.number, done)
        if done is None:
            return
        last_done = self._acct.last_done
        follows = previous is not None and item.number == previous[0] + 1
        if last_done is None:
            self._acct.first(done, self._intervals)
        elif follows and previous is not None and previous[1] is not None:
            self._acct.step(previous[1], done, item.handed, self._intervals, model, hardware)
        else:
            # Since the last known completion: steps not seen complete (unready), or numbers that do not follow.
            restart = previous is not None and item.number <= previous[0]
            if previous is not None and not follows:
                reason = "back" if restart else "jump"
                self._problem(reason, "training step numbers do not follow", previous=previous[0], number=item.number)
            self._acct.gap(last_done, done, self._intervals, restart)
            if restart:  # every window starts again: the MFU's (in gap()) and the predicted peak memory's
                self._peak_memory.clear()
        self._intervals.forget(done)

    def _wall_at(self, instant: float | None) -> float:
        """The Unix time at `instant` of the monotonic clock (None: now), a moment ago: the wall clock read now,
        less the monotonic time since. A clock step before the event is in it (the timestamp is the wall clock's
        at the event); the durations, on the monotonic clock, never see one."""
        wall, now = self._wall(), self._clock()
        return wall if instant is None else wall - max(now - instant, 0.0)

    def _problem(self, reason: str, event: str, key: str | None = None, times: int = 1, **fields: Any) -> None:
        with self._problems_lock:  # its own lock: called with the main one held and without
            self._problems[reason] = self._problems.get(reason, 0) + times
        # Logged once an hour per reason (or per `key`: a field of step()), with the count since.
        self._errors.error(key or reason, event, reason, **fields)

    # -- reading ------------------------------------------------------------------------------------------

    def _mfu_wanted(self, flops: Mapping[tuple[str, int], float]) -> None:
        """A step gave FLOPs for these devices: say once per device kind that has no peak that its MFU cannot be
        known (not at start: a process that never gives FLOPs never wanted it)."""
        kinds = {self._no_peak.pop(key) for key in flops if key in self._no_peak}
        for kind in sorted(kinds - self._peak_warned):
            self._peak_warned.add(kind)
            log.warning(
                "no peak FLOP/s known for this device kind: no MFU or HFU series (set collector.training.peak_flops)",
                device_kind=kind,
            )

    def reading(self) -> TrainingReading | None:
        """The telemetry now; None before the first step()."""
        with self._lock:
            if not self._stepping:
                return None
            mfu, hfu = self._acct.utilization({k: p for k, (p, _) in self._peaks.items()})
            peak_memory = self._peak_memory.maxima()
            devices = tuple(
                DeviceTraining(
                    platform=d.platform,
                    id=d.id,
                    model_flops_total=self._model.get(d.key),
                    hardware_flops_total=self._hardware.get(d.key),
                    hardware_bytes_total=self._bytes.get(d.key),
                    peak_flops=self._peaks[d.key][0] if d.key in self._peaks else None,
                    peak_source=self._peaks[d.key][1] if d.key in self._peaks else None,
                    mfu=mfu.get(d.key),
                    hfu=hfu.get(d.key),
                    collective_bytes_total=dict(self._collectives.get(d.key, {})),
                    program_peak_memory_bytes=peak_memory.get(d.key),
                    link_bandwidth=per_link(d.device_kind, self.config.link_bandwidth),
                )
                for d in self._devices
            )
            return TrainingReading(
                steps_total=self._steps,
                step=self._last[0] if self._last is not None else None,
                dispatched_step=self._dispatched,
                last_step_timestamp=self._last_wall,
                duration_buckets=tuple(self._acct.histogram.cumulative()),
                duration_sum=self._acct.histogram.total,
                examples_total=self._examples,
                tokens_total=self._tokens,
                host_wait_seconds_total=self._acct.host_wait,
                start_time_seconds=self._start_wall,
                productive_seconds_total=self._acct.productive,
                badput_seconds_total=dict(self._acct.badput),
                devices=devices,
                problems=self._problem_counts(),
            )

    def kinds(self) -> tuple[str, ...]:
        """The badput() kinds opened so far (OTHER_KIND past the limit): each exported from its first open, at 0
        until its time is booked (jaxmon.births.with_zeros)."""
        with self._lock:
            return tuple(sorted(self._opened))

    def _problem_counts(self) -> dict[str, int]:
        with self._problems_lock:
            return dict(self._problems)

    def stop(self, timeout: float) -> None:
        """End the waiter after the steps it waits for (a hung device keeps it: it is a daemon thread)."""
        unlisten, self._unlisten = self._unlisten, _nothing  # a second stop() has nothing left to unregister
        unlisten()
        self._analyzer.stop(timeout)
        self.sampler.stop(timeout)
        self.waiter.stop(timeout)

    def threads(self) -> tuple[threading.Thread, ...]:
        """Every thread of the tracker's: the waiter's, the sampler's (none when sampling is off), the analysis'."""
        return (self.waiter.thread, *self.sampler.threads, *self._analyzer.threads)


def _nothing() -> None:
    pass


def counted(programs: list[Program]) -> list[tuple[Program, int]]:
    """A step's tracked calls (one entry a call) as (program, calls)."""
    if len(programs) == 1:
        return [(programs[0], 1)]
    out: dict[int, tuple[Program, int]] = {}
    for program in programs:
        out[id(program)] = (program, out.get(id(program), (program, 0))[1] + 1)
    return list(out.values())
