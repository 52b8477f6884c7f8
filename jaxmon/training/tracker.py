"""The training tracker: `step()` on the training thread (hand.py), a waiter thread that sees each step complete.

`step()` only notes the time and queues the step (a deque append: no lock), taking jaxmon's own handles on the JAX
arrays it is given (`ops.hold`: a clone of each, sharing its buffers) for the steps the waiter looks at: it never
blocks, never reads a number off a device and never raises. The waiter (waiter.py) takes the queued steps in order
and waits for a look's held arrays in one call (`block_until_ready` releases the GIL, so training goes on
dispatching), dates the steps, then hands them back here to be read, checked and booked (books.py, accounting.py).
It calls JAX only on its own handles, so whatever the user does to the arrays meanwhile (delete, donate, reuse)
makes a call raise, never crash. Nothing here imports JAX: `ops` (jaxmon.sources.local.training.JaxTraining) does
that.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from jaxmon.logsetup import ErrorLog
from jaxmon.training.accounting import MAX_INTERVALS, Accounting, Interval, Intervals
from jaxmon.training.books import Books, Entered, read_loss, read_slow
from jaxmon.training.communication import Analyzer, CollectiveNames
from jaxmon.training.hand import HAND
from jaxmon.training.handed import (
    EVENT_KIND,
    EVENT_KINDS,
    MAX_USER_KINDS,
    OTHER_KIND,
    Program,
    TrackerConfig,
    TrainingOps,
)
from jaxmon.training.peaks import peak_table
from jaxmon.training.sampler import sampler_for
from jaxmon.training.steps import Handoff, Hold, Item, Run
from jaxmon.training.waiter import Waiter
from jaxmon.training_readings import MAX_LOSS_NAMES, TrainingReading, bounded_loss

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
        self._handed: deque[Item] = deque()  # steps handed, not yet taken by the waiter (appended, no lock)
        self._intervals = Intervals()  # badput intervals since the last completion (and the open ones)
        self._kinds: set[str] = set()  # the badput() kinds seen, MAX_USER_KINDS at most
        self._opened: set[str] = set()  # those and OTHER_KIND once it is used: series from their first open
        self._loss_warned = False  # the loss gauge left names out (logged once)
        self._devices = ops.devices()
        self._device_count = max(ops.device_count(), 1)
        self._process_count = max(ops.process_count(), 1)
        self._peaks, self._no_peak = peak_table(self._devices, config.peak_flops)
        self._peak_warned: set[str] = set()  # the device kinds "no peak FLOP/s known" was said of
        started = clock()
        self.start_time = self._start_wall = wall()  # Unix time at the start, beside the monotonic start
        self._acct = Accounting(started=started, window=config.window, stall_factor=config.stall_factor)
        self._books = Books(self._devices, self._device_count, self._process_count, config.window)
        self._collective_names = CollectiveNames()  # every analysed program's, for the sampled traces' events
        self._analyzer = Analyzer(ops.communication, self._collective_names.analysed, self._unanalysed, self._problem)
        self._problems: dict[str, int] = {}
        self._problems_lock = threading.Lock()
        # Sampled traces: told of each step, completion and badput interval; their events named by the programs'
        # collectives. Made before the listener, which tells it of compilations and Orbax's saves.
        self.sampler = sampler_for(ops, config.profile, clock, self._collective_names.catalog, self._problem)
        self._unlisten = ops.on_event_duration(self._on_event)
        acct = self._acct
        self.waiter = Waiter(
            self._handed, ops, clock, self._problem, self.last_done, self.book, acct.typical_busy, acct.pace,
            config.max_pending,
        )  # fmt: skip
        self.sampler.look = self.waiter.look_now  # a traced block's last step is looked at as it comes
        self._thread = self.waiter.thread
        # The training thread's side: step() and pause() (hand.py); jaxmon.track()'s wrapper notes calls there.
        self.hand = HAND  # the process's: the newest tracker is the one jaxmon.step feeds
        self._stepped: tuple[bool, int | None] = (False, None)  # the hand's stepping and dispatched, once disarmed
        self.hand.arm(self, ops, clock, self._handed, self.waiter, self.sampler, self._problem, config.max_pending)
        self.step = self.hand.step
        self.pause = self.hand.pause

    # -- the training thread ------------------------------------------------------------------------------

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
        """A tracked function ran `program` once in the current step (on the training thread, as step(): no lock)."""
        self.hand.called(program)

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
        self.sampler.badput(kind, id(interval), self.dispatched, end != float("inf"))
        return interval

    def close(self, interval: Interval) -> None:
        """The interval ends now."""
        with self._lock:
            interval.end = self._clock()
        self.sampler.closed(id(interval), self.dispatched)

    def now(self) -> float:
        """The tracker's clock."""
        return self._clock()

    def pending(self) -> int:
        """Steps handed that the waiter has not booked yet."""
        return len(self._handed) + self.waiter.taken

    def last_step_seen(self) -> float | None:
        """When (the tracker's clock, monotonic) the waiter last saw a step end, complete or unready; None before
        any. The probe dispatches nothing while it is recent (docs/probe.md). One attribute read: no lock."""
        return self._books.seen

    def _on_event(self, event: str, seconds: float) -> None:
        kind = EVENT_KIND.get(event)
        if kind is not None and seconds > 0:
            end = self._clock()
            self.interval(kind, end - seconds, end)

    # -- the waiter thread --------------------------------------------------------------------------------

    def book(self, batch: list[Handoff] | Run, done: list[float | None], hold: Hold | None) -> None:
        """The waiter's steps, dated (`done`: None where unknown), `hold` the looked-at one's: read, checked and
        booked. A Run (the common batch, as columns) is booked as a whole; other batches a few operations a step
        here, what their steps share added once a batch (books.py)."""
        books = self._books
        loss = read_loss(books, hold, self._clock(), self.ops.value)
        if isinstance(batch, Run):
            with self._lock:
                last = books.last
                entered = books.run(self._acct, self._intervals, batch, done)  # type: ignore[arg-type]  # None not in done
                if entered is not None:
                    self._entered(last, entered, True)
                    if loss is not None:
                        books.loss, books.loss_step = loss, books.last[0] if books.last is not None else None
                    self._analyzer.kick()
                    return
            batch = batch.handoffs()  # not one run here: step by step
        slow = read_slow(batch, self.ops.value, self._problem)  # arrays and unusable figures: read outside the lock
        with self._lock:
            last = books.last
            entered = books.enter(self._acct, self._intervals, batch, done, slow, self._problem)
            self._entered(last, entered, not batch or type(batch[-1][1]) is int)
            if loss is not None and batch:
                books.loss, books.loss_step = loss, slow[id(batch[-1])][0] if id(batch[-1]) in slow else batch[-1][1]
            self._analyzer.kick()  # new programs are analysed from now on, off the training thread

    def _entered(self, last: tuple[int, float | None] | None, entered: Entered, host: bool) -> None:
        """What a batch booked (`last`: the last step booked before it; `host`: its own last step's number was a
        host int) told to the rest, under the tracker's lock: when a step was last seen, MFU's devices, the badput
        intervals done with, the sampler."""
        books = self._books
        numbers, at, model, added = entered
        if books.last is None or books.last is last:
            return
        books.seen = self._clock()
        books.last_wall = self._wall_at(books.last[1])
        if not host and not self._handed and self.hand.owner is self:
            self.hand.dispatched = books.last[0]  # a device step number, and no later step handed: the last one handed
        if self._no_peak and (model or added):
            self._mfu_wanted({**(books.model_share(model) if model else {}), **added})
        if at:
            self._intervals.forget(at[-1])
            self.sampler.completed(numbers, at)

    def last_done(self) -> float | None:
        """The last completion booked (the waiter's start for its next batch)."""
        return self._acct.last_done

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
            if not (self.hand.stepping if self.hand.owner is self else self._stepped[0]):
                return None
            mfu, hfu = self._acct.utilization({k: p for k, (p, _) in self._peaks.items()})
            books = self._books
            devices = books.devices(self._peaks, mfu, hfu, self.config.link_bandwidth)
            loss, left_out = bounded_loss(books.loss)
            if left_out and not self._loss_warned:
                self._loss_warned = True
                log.warning(
                    f"the loss gauge keeps the first {MAX_LOSS_NAMES} names of step()'s dict (sorted), non-empty and "
                    "cut to 64 characters: the others are not exported",
                    left_out=left_out,
                    kept=sorted(loss),
                )
            return TrainingReading(
                steps_total=books.steps,
                step=books.last[0] if books.last is not None else None,
                dispatched_step=self.dispatched,
                last_step_timestamp=books.last_wall,
                duration_buckets=tuple(self._acct.histogram.cumulative()),
                duration_sum=self._acct.histogram.total,
                examples_total=books.examples,
                tokens_total=books.tokens,
                host_wait_seconds_total=self._acct.host_wait,
                start_time_seconds=self._start_wall,
                productive_seconds_total=self._acct.productive,
                badput_seconds_total=dict(self._acct.badput),
                devices=devices,
                problems=self._problem_counts(),
                loss=loss,
                loss_step=books.loss_step if loss else None,
            )

    def kinds(self) -> tuple[str, ...]:
        """The badput() kinds opened so far (OTHER_KIND past the limit): each exported from its first open, at 0
        until its time is booked (jaxmon.births.with_zeros)."""
        with self._lock:
            return tuple(sorted(self._opened))

    def _problem_counts(self) -> dict[str, int]:
        with self._problems_lock:
            return dict(self._problems)

    @property
    def dispatched(self) -> int | None:
        """The last step number handed to step() (the hand's while this tracker is the one armed)."""
        return self.hand.dispatched if self.hand.owner is self else self._stepped[1]

    def stop(self, timeout: float) -> None:
        """Hand no more steps here, and end the waiter after the steps it waits for (a hung device keeps it: it is a
        daemon thread). The readings after it keep what was handed."""
        hand = self.hand
        if hand.owner is self:
            self._stepped = (hand.stepping, hand.dispatched)
            hand.disarm(self)
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
