"""The training tracker: the hand (hand.py) on the training thread, the waiter (waiter.py) that books the steps into
the ledger (ledger.py) under the tracker's lock, the badput intervals, and the reading. Nothing here imports JAX:
`ops` (jaxmon.sources.local.training.JaxTraining) does."""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from jaxmon.checkpoints import ORBAX_STARTS
from jaxmon.logsetup import ErrorLog
from jaxmon.threads import as_jaxmon
from jaxmon.training.communication import Analyzer, CollectiveNames
from jaxmon.training.hand import HAND
from jaxmon.training.handed import (
    COMPILE_EVENT,
    EVENT_KIND,
    EVENT_KINDS,
    MAX_USER_KINDS,
    OTHER_KIND,
    Program,
    TrackerConfig,
    TrainingOps,
)
from jaxmon.training.ledger import MAX_INTERVALS, Interval, Intervals, Ledger, Run
from jaxmon.training.peaks import peak_table
from jaxmon.training.sampler import sampler_for
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
        """`clock`: the monotonic clock of every duration; `wall`: the Unix clock of the exported timestamps, read at
        each event (a clock step moves the later timestamps, never the durations)."""
        self.ops, self.config, self._clock, self._wall = ops, config, clock, wall
        self._errors = ErrorLog(log, 3600.0)
        self._lock = threading.Lock()
        self._problems_lock = threading.Lock()  # (the problem count is taken with the main lock held and without)
        self._problems: dict[str, int] = {}
        self._handed: deque[Any] = deque()  # hand.py's protocol
        self._intervals = Intervals()  # badput intervals since the last completion, and the open ones
        self._kinds: set[str] = set()  # the badput() kinds seen, MAX_USER_KINDS at most
        self._opened: set[str] = set()  # those and OTHER_KIND once used: series from their first open
        self._loss_warned, self._loss_left_out = False, 0
        devices = ops.devices()
        self._peaks, self._no_peak = peak_table(devices, config.peak_flops)
        self._peak_warned: set[str] = set()
        # Compiled now, not in a step() that holds its outputs (none of its own), not as the job's time, and on a
        # jaxmon thread: not the job's compilations (the process's compile counters may listen already).
        as_jaxmon("barrier", ops.barrier)
        started = clock()
        self.start_time = self._start_wall = wall()  # Unix time at the start, beside the monotonic start
        self._ledger = Ledger(
            started, devices, ops.device_count(), ops.process_count(), config.window, config.stall_factor,
            self._problem,
        )  # fmt: skip
        self._seen: float | None = None  # when the waiter last booked a step
        self._starts: dict[str, float] = {}  # Orbax's save or restore under way: when it started (by kind)
        self._last_wall: float | None = None  # the Unix time of the last completion booked
        self._collective_names = CollectiveNames()  # every analysed program's, for the sampled traces
        self._learnt: weakref.WeakSet[Program] = weakref.WeakSet()  # booked programs whose places are learnt
        self._analyzer = Analyzer(ops.communication, self._collective_names.analysed, self._unanalysed, self._problem)
        # Sampled traces: told of each step, completion and badput interval (made before the listeners).
        self.sampler = sampler_for(ops, config.profile, clock, self._collective_names.catalog, self._problem)
        self._unlisten: tuple[Callable[[], None], ...] = (
            ops.on_event_span(self._on_span),
            ops.on_event_duration(self._on_duration),
            ops.on_event(self._on_event),
        )
        self.hand = HAND  # the process's: the newest tracker arms it
        ledger = self._ledger
        self.waiter = Waiter(
            self.hand, self._handed, ops, clock, self._book, self._problem, ledger.typical_busy,
            lambda: ledger.last_done, config.stall_factor,
        )  # fmt: skip
        self.sampler.look = self.waiter.look_now  # a traced block's last step is looked at as it comes
        hand = self.hand
        self.sampler.dispatched = lambda: hand.dispatched  # how far the job went while a block waited for the thread
        self._stepped: tuple[bool, int | None] = (False, None)  # the hand's stepping and dispatched, disarmed
        self.hand.arm(self, ops, clock, self._handed, self.waiter, self.sampler, self._problem, config.max_pending)
        self.waiter.start()
        self.step = self.hand.step
        self.pause = self.hand.pause

    def measure(self, fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Program:
        """A tracked function's new program, just called with `args`: its cost read here, on the calling thread (a
        cache hit of the lowering; a failure counted), its communication and peak memory on the analysis thread."""
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

    def called(self, program: Program) -> None:
        """A tracked function ran `program` once in the current step (the training thread)."""
        self.hand.called(program)

    def pending(self) -> int:
        """Steps handed that the waiter has not booked yet."""
        return self.hand._count - self.waiter.booked if self.hand.owner is self else 0

    def last_step_seen(self) -> float | None:
        """When (the tracker's clock, monotonic) a step was last handed or booked; None before any. The probe
        dispatches nothing while it is recent (docs/probe.md). Attribute reads: no lock."""
        handed = self.hand.last_handed if self.hand.owner is self else -float("inf")
        seen = self._seen
        return max(handed, seen) if seen is not None else (handed if handed > -float("inf") else None)

    def _on_span(self, event: str, start: float, end: float) -> None:
        """A compilation, as JAX timed it (Unix seconds): on the tracker's clock, by the wall clock's time since."""
        if event == COMPILE_EVENT and end > start:
            now, wall = self._clock(), self._wall()
            self.interval("compile", now - (wall - start), now - max(wall - end, 0.0))

    def _on_event(self, event: str) -> None:
        """An Orbax save or restore starts: when, on this clock (the duration recorded as it ends is timed from
        before it, and recorded after a log line: the interval starts at the earlier of the two)."""
        kind = ORBAX_STARTS.get(event)
        if kind is not None:
            self._starts[kind] = self._clock()

    def _on_duration(self, event: str, seconds: float) -> None:
        """An Orbax save or restore, recorded as it ended."""
        kind = EVENT_KIND.get(event)
        if kind is not None and event != COMPILE_EVENT and seconds > 0:
            end = self._clock()
            started = self._starts.pop(kind, end)
            self.interval(kind, min(end - seconds, started), end)

    def _book(self, runs: list[Run], loss: dict[str, float] | None, of: tuple[int | None, int]) -> None:
        """The waiter's runs of steps booked under the lock; `loss` the loss gauge's scalars where it read them, `of`
        (their step, the names of its dict not held)."""
        ledger = self._ledger
        numbers: list[int] = []
        at: list[float] = []
        with self._lock:
            last = ledger.last
            for run in runs:
                ledger.book(run, self._intervals)
                for program in run.programs:  # analysed for a tracker before this one: its places learnt here too
                    if program.communication is not None and program not in self._learnt:
                        self._learnt.add(program)
                        self._collective_names.learn(program.communication)
                if run.done is not None:
                    numbers.extend(range(run.first, run.first + len(run.done)))
                    at.extend(run.done)
            if loss is not None:
                (ledger.loss_step, self._loss_left_out), ledger.loss = of, loss
            if ledger.last is not last:
                self._seen = self._clock()
                if at:
                    self._last_wall = self._wall_at(at[-1])
                    self._intervals.forget(at[-1])
                if self._no_peak and (ledger.model or ledger.hardware):
                    self._mfu_wanted({**ledger.model, **ledger.hardware})
        self.sampler.completed(numbers, at)
        self._analyzer.kick()  # new programs are analysed from now on, off the training thread

    def _wall_at(self, instant: float | None) -> float:
        """The Unix time at `instant` (the monotonic clock's; None: now): the wall clock now, less the time since."""
        wall, now = self._wall(), self._clock()
        return wall if instant is None else wall - max(now - instant, 0.0)

    def _problem(self, reason: str, event: str, key: str | None = None, times: int = 1, **fields: Any) -> None:
        with self._problems_lock:  # its own lock: called with the main one held and without
            self._problems[reason] = self._problems.get(reason, 0) + times
        # Logged once an hour per reason (or per `key`: a field of step()), with the count since.
        self._errors.error(key or reason, event, reason, **fields)

    def _mfu_wanted(self, flops: Mapping[tuple[str, int], float]) -> None:
        """A step gave FLOPs for these devices: said once per device kind with no peak that its MFU cannot be known
        (not at start: a process that never gives FLOPs never wanted it)."""
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
            ledger = self._ledger
            loss, left_out = bounded_loss(ledger.loss)
            left_out += self._loss_left_out
            if left_out and not self._loss_warned:
                self._loss_warned = True
                log.warning(
                    f"the loss gauge keeps the first {MAX_LOSS_NAMES} names of step()'s dict (sorted), non-empty and "
                    "cut to 64 characters: the others are not exported",
                    left_out=left_out,
                    kept=sorted(loss),
                )
            return TrainingReading(
                steps_total=ledger.steps,
                step=ledger.last[0] if ledger.last is not None else None,
                dispatched_step=self.dispatched,
                last_step_timestamp=self._last_wall,
                duration_buckets=tuple(ledger.histogram.cumulative()),
                duration_sum=ledger.histogram.total,
                examples_total=ledger.examples,
                tokens_total=ledger.tokens,
                host_wait_seconds_total=ledger.host_wait,
                start_time_seconds=self._start_wall,
                productive_seconds_total=ledger.productive,
                badput_seconds_total=dict(ledger.badput),
                devices=ledger.devices(self._peaks, self.config.link_bandwidth),
                problems=self._problem_counts(),
                loss=loss,
                loss_step=ledger.loss_step if loss else None,
            )

    def kinds(self) -> tuple[str, ...]:
        """The badput() kinds opened so far (OTHER_KIND past the limit), exported from their first open, at 0."""
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
        """Hand no more steps here, and end the waiter once it booked the steps handed (waiting `timeout` for their
        holds at most: a hung device keeps it, a daemon thread). The readings after it keep what was handed."""
        hand = self.hand
        if hand.owner is self:
            self._stepped = (hand.stepping, hand.dispatched)
            hand.disarm(self)
        unlisten, self._unlisten = self._unlisten, ()  # a second stop() has nothing left to unregister
        for undo in unlisten:
            undo()
        self._analyzer.stop(timeout)
        self.sampler.stop(timeout)
        self.waiter.stop(timeout)

    def flush(self, timeout: float) -> bool:
        """Book every step handed by now, waiting for them `timeout` at most (a document written at a stop)."""
        return self.waiter.flush(timeout) if self.waiter.thread.is_alive() else False

    def threads(self) -> tuple[threading.Thread, ...]:
        """Every thread of the tracker's: the waiter's, the sampler's (none when sampling is off), the analysis'."""
        return (self.waiter.thread, *self.sampler.threads, *self._analyzer.threads)
