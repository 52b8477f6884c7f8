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
from jaxmon.training.books import Books, Read, read_loss, read_slow
from jaxmon.training.communication import Analyzer, CollectiveNames
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
from jaxmon.training.reading import MAX_LOSS_NAMES, TrainingReading, bounded_loss
from jaxmon.training.sampler import sampler_for
from jaxmon.training.steps import MARK, NO_CALLS, PLAIN, RESUMED, Handoff, Held, Hold, loss_names, shown
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
        self._stepping = False  # step() was called: a process that never does exports no training series
        self._dispatched: int | None = None  # the last step number handed to step()
        self._last_ready: tuple[Any, ...] = ()  # the last step's ready (pause() holds it: the training thread's)
        self._max_pending = config.max_pending
        self._held_at = -float("inf")  # when step() last took a step's handles (the tracker's clock)
        self._previous = float("inf")  # when step() was last called (the tracker's clock; none yet: no pause before)
        # Sampled traces: told of each step, completion and badput interval; their events named by the programs'
        # collectives. Made before the listener, which tells it of compilations and Orbax's saves.
        self.sampler = sampler_for(ops, config.profile, clock, self._collective_names.catalog, self._problem)
        self._unlisten = ops.on_event_duration(self._on_event)
        typical = self._acct.typical_busy
        self.waiter = Waiter(
            self._handed, ops, clock, self._problem, self.last_done, self.book, typical, config.max_pending
        )
        self.sampler.look = self.waiter.look_now  # a traced block's last step is looked at as it comes
        self._thread = self.waiter.thread

    # -- the training thread ------------------------------------------------------------------------------

    def step(self, number: Any, ready: tuple[Any, ...], examples: Any, tokens: Any, model_flops: Any) -> None:
        """Step `number` is dispatched; it is complete when the JAX arrays among `ready`'s leaves are (or, with none,
        a barrier on every device). Nothing is read or checked here: any of the numbers may be a JAX array still
        being computed, which the waiter reads once it is. No lock, no JAX call, no notify on the common path: one
        tuple appended to a deque (atomic); the step the waiter asks to look at takes its handles (`_look_at`)."""
        handed = self._clock()
        previous, self._previous = self._previous, handed
        calls: tuple[Program, ...] = NO_CALLS
        if made := self._calls:  # a tuple a program, made once: no new list a step (a GC-tracked object)
            calls = made[0].once if len(made) == 1 else tuple(made)
            made.clear()
        waiter = self.waiter
        if (
            waiter.want
            or handed - self._held_at >= waiter.every  # a step held once a look's time of the host's: a loop that
            or handed - previous >= waiter.resumed_after  # ends or pauses leaves at most that much of its steps to
            or type(number) is not int  # estimate; and one that paused within a long look says so when it resumes
            or (type(examples) not in PLAIN or type(tokens) not in PLAIN or type(model_flops) not in PLAIN)
        ):
            if handed - previous >= waiter.resumed_after:
                self._handed.append((handed, RESUMED, None, None, None, NO_CALLS, None))
            self._look_at(handed, number, ready, examples, tokens, model_flops, calls)
            return
        self._dispatched = number
        self._last_ready = ready
        if len(self._handed) + waiter.taken >= self._max_pending:
            self._problem("dropped", "training steps not tracked: the waiter is far behind", number=number)
            return
        self._handed.append((handed, number, examples, tokens, model_flops, calls, None))
        self.sampler.handed(number)

    def _look_at(
        self, handed: float, number: Any, ready: tuple[Any, ...], examples: Any, tokens: Any, model_flops: Any,
        calls: tuple[Program, ...],
    ) -> None:  # fmt: skip
        """step()'s slower path: the step the waiter asked for (jaxmon's own handles on its ready arrays), or one
        whose number or figures are JAX arrays (handles on them, read by the waiter once the step is done)."""
        self._stepping = True
        ops = self.ops
        waiter = self.waiter
        looked = waiter.want or handed - self._held_at >= waiter.every
        given = (number, examples, tokens, model_flops)
        if not (
            type(number) is int and type(examples) in PLAIN and type(tokens) in PLAIN and type(model_flops) in PLAIN
        ):
            given = tuple(Held(ops.hold(v)) if ops.is_array(v) else v for v in given)  # type: ignore[assignment]
            looked = True  # its figures are read once it is done: the waiter waits for it
        host = type(number) is int or (isinstance(number, numbers.Integral) and not isinstance(number, bool))
        if host:
            self._dispatched = int(number)  # a host integer; a device one is set by the waiter
        self._last_ready = ready
        if len(self._handed) + waiter.taken >= self._max_pending:
            self._problem("dropped", "training steps not tracked: the waiter is far behind", number=shown(number))
            return
        hold = None
        if looked:
            hold, self._held_at = self._hold(ready), handed
        self._handed.append((handed, given[0], given[1], given[2], given[3], calls, hold))
        if looked and waiter.want:
            waiter.want = False
            waiter.wake()
        if host:
            self.sampler.handed(int(number))  # a device step number starts no sampled trace (it is not read here)

    def _hold(self, ready: tuple[Any, ...]) -> Hold:
        """jaxmon's own handles on `ready`'s arrays (on the training thread, where nothing deletes them meanwhile),
        or a barrier's when it holds none; the names of the loss gauge's scalars where `ready` is a scalar or a dict
        of scalars."""
        ops = self.ops
        arrays = ops.arrays(ready)
        if not arrays:  # no ready, or a tree of host numbers: no array says when the step is done
            return Hold(ops.barrier())
        handles = [h for h in map(ops.hold, arrays) if h is not None]
        if len(handles) < len(arrays):
            return Hold(handles, lost=True)
        return Hold(handles, loss=loss_names(ready, arrays))

    def pause(self) -> None:
        """No step comes for a while (a badput() block opens, an epoch ends: on the training thread). The last step's
        arrays are held now (a mark), so that the steps before it are seen complete when they were, not after."""
        if not self._handed or self._handed[-1][6] is not None:
            return  # nothing handed, or the last step is looked at already
        self._handed.append((self._clock(), MARK, None, None, None, NO_CALLS, self._hold(self._last_ready)))
        self.waiter.hurry()

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
        return self._books.seen

    def _on_event(self, event: str, seconds: float) -> None:
        kind = EVENT_KIND.get(event)
        if kind is not None and seconds > 0:
            end = self._clock()
            self.interval(kind, end - seconds, end)

    # -- the waiter thread --------------------------------------------------------------------------------

    def book(self, batch: list[Handoff], done: list[float | None], hold: Hold | None) -> None:
        """The waiter's steps, dated (`done`: None where unknown), `hold` the looked-at one's: read, checked and
        booked. A step is a few operations here; what a batch's steps share is added once a batch (books.py)."""
        books = self._books
        slow = read_slow(batch, self.ops.value, self._problem)  # arrays and unusable figures: read outside the lock
        loss = read_loss(books, hold, self._clock(), self.ops.value)
        with self._lock:
            self._book(batch, done, slow)
            if loss is not None and batch:
                books.loss, books.loss_step = loss, slow[id(batch[-1])][0] if id(batch[-1]) in slow else batch[-1][1]
            self._analyzer.kick()  # new programs are analysed from now on, off the training thread

    def _book(self, batch: list[Handoff], done: list[float | None], slow: dict[int, Read]) -> None:
        books = self._books
        last = books.last
        numbers, at, model, added = books.enter(self._acct, self._intervals, batch, done, slow, self._problem)
        if books.last is None or books.last is last:
            return
        books.seen = self._clock()
        books.last_wall = self._wall_at(books.last[1])
        if type(batch[-1][1]) is not int and not self._handed:
            self._dispatched = books.last[0]  # a device step number, and no later step handed: the last one handed
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
            if not self._stepping:
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
                dispatched_step=self._dispatched,
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
