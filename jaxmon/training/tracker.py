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
    _PLAIN,
    EVENT_KIND,
    EVENT_KINDS,
    MAX_USER_KINDS,
    OTHER_KIND,
    Program,
    TrackerConfig,
    TrainingOps,
    _Held,
    _Pending,
    read_figures,
    shown,
)
from jaxmon.training.peaks import peak_table
from jaxmon.training.reading import DeviceTraining, TrainingReading
from jaxmon.training.sampler import sampler_for

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
        self._wake = threading.Condition(self._lock)
        self._pending: deque[_Pending] = deque()
        self._calls: dict[int, tuple[Program, int]] = {}  # tracked calls since the last step()
        self._intervals = Intervals()  # badput intervals since the last completion (and the open ones)
        self._kinds: set[str] = set()  # the badput() kinds seen, MAX_USER_KINDS at most
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
        self._collectives: dict[tuple[str, int], dict[tuple[str, str], float]] = {}  # per device, (op, axes)
        self._peak_memory = WindowMax(config.window)  # the largest predicted peak of the window's steps' programs
        self._collective_names = CollectiveNames()  # every analysed program's, for the sampled traces' events
        self._analyzer = Analyzer(ops.communication, self._collective_names.analysed, self._unanalysed)
        self._problems: dict[str, int] = {}
        self._problems_lock = threading.Lock()
        self._stepping = False  # step() was called: a process that never does exports no training series
        self._dispatched: int | None = None  # the last step number handed to step()
        self._stopping = False
        self._unlisten = ops.on_event_duration(self._on_event)
        # Sampled traces: told of each step and completion; their events named by the programs' collectives.
        self.sampler = sampler_for(ops, config.profile, clock, self._collective_names)
        self._thread = threading.Thread(target=self._wait_loop, name="jaxmon-training", daemon=True)
        self._thread.start()

    # -- the training thread ------------------------------------------------------------------------------

    def step(self, number: Any, ready: tuple[Any, ...], examples: Any, tokens: Any, model_flops: Any) -> None:
        """Step `number` is dispatched; it is complete when the JAX arrays among `ready`'s leaves are (or, with none,
        a barrier on every device). Nothing is read or checked here: any of the numbers may be a JAX array still
        being computed, which the waiter reads once it is."""
        handed = self._clock()
        ops = self.ops
        arrays = ops.arrays(ready)
        held = [ops.hold(a) for a in arrays]
        handles = [h for h in held if h is not None]
        if not arrays:  # no ready, or a tree of host numbers: no array says when the step is done
            handles = ops.barrier()
        given = (number, examples, tokens, model_flops)
        if not (
            type(number) is int and type(examples) in _PLAIN and type(tokens) in _PLAIN and type(model_flops) in _PLAIN
        ):
            given = tuple(_Held(ops.hold(v)) if ops.is_array(v) else v for v in given)  # type: ignore[assignment]
        with self._lock:
            self._stepping = True
            if type(number) is int or (isinstance(number, numbers.Integral) and not isinstance(number, bool)):
                self._dispatched = int(number)  # a host integer; a device one is set by the waiter
            calls, self._calls = self._calls, {}
            if len(self._pending) >= self.config.max_pending:
                self._problem("dropped", "training steps not tracked: the waiter is far behind", number=shown(number))
                return
            self._pending.append(_Pending(given, handles, handed, calls, lost=len(handles) < len(held)))
            self._wake.notify()
        if type(number) is int or (isinstance(number, numbers.Integral) and not isinstance(number, bool)):
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
        """A tracked function ran `program` once in the current step."""
        with self._lock:
            _, count = self._calls.get(id(program), (program, 0))
            self._calls[id(program)] = (program, count + 1)

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
            interval = Interval(kind, start, end)
            if dropped := self._intervals.add(interval):
                self._problem(
                    "intervals",
                    f"more than {MAX_INTERVALS} badput intervals since the last completed step: the oldest are dropped",
                    times=dropped,
                )
        return interval

    def close(self, interval: Interval) -> None:
        """The interval ends now."""
        with self._lock:
            interval.end = self._clock()

    def now(self) -> float:
        """The tracker's clock."""
        return self._clock()

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

    def _wait_loop(self) -> None:
        while not self._stopping:
            try:
                self._wait_one()
            except Exception as exc:  # a bug here must not end the telemetry (nor reach training)
                self._problem("error", "the training waiter failed on a step", detail=f"{type(exc).__name__}: {exc}")

    def _wait_one(self) -> None:
        with self._lock:
            while not self._pending and not self._stopping:
                self._wake.wait()
            if self._stopping:
                return
            item = self._pending[0]
        try:
            done = self._wait_arrays(item)
            number = self._read(item)
        except Exception as exc:  # a bug here: this step is not booked, and the waiter goes on with the next
            self._problem("error", "the training waiter failed on a step", detail=f"{type(exc).__name__}: {exc}")
            done, number = None, None
        device_number = isinstance(item.given[0], _Held)
        item.arrays, item.given = [], (None, None, None, None)  # hold no array longer than needed
        with self._lock:
            self._pending.popleft()
            if number is None:  # no step number to book it under (counted): its time goes to the next step's gap
                return
            if device_number and not self._pending:
                self._dispatched = number  # a device step number, and no later step handed: the last one handed
            item.number = number
            self._complete(item, done)

    def _wait_arrays(self, item: _Pending) -> float | None:
        """When the step's ready arrays were all computed (None: unknown, one was deleted or donated first).

        One blocking call for the step's ready arrays and its figure arrays together: one release of the GIL a
        step, and none of an array that is ready already is needed to get past it. Only jaxmon's own handles are
        waited on or asked, so a deletion at any moment makes the call raise, never crash."""
        figures = [g.handle for g in item.given if isinstance(g, _Held) and g.handle is not None]
        if item.lost:
            self._problem("unready", "a step's ready array was deleted or donated before step() was called")
            return None
        try:
            self.ops.wait(item.arrays + figures)
            return self._clock()
        except Exception as exc:
            error = exc
        if figures and not any(self.ops.deleted(h) for h in item.arrays):
            try:  # a figure array failed (it is read below): the ready arrays alone say when the step was done
                self.ops.wait(item.arrays)
                return self._clock()
            except Exception as exc:
                error = exc
        self._problem("unready", "a step's ready array was deleted or donated", detail=str(error)[:200])
        return None

    def _read(self, item: _Pending) -> int | None:
        """Read and check the step's number and figures into `item` (handed.read_figures)."""
        return read_figures(item, self.ops.value, self._problem)

    def _complete(self, item: _Pending, done: float | None) -> None:
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
        for program, count in item.programs.values():
            cost = program.cost
            if cost is None:
                continue
            for device in cost.devices:
                if cost.flops is not None:
                    hardware[device] = hardware.get(device, 0.0) + cost.flops * count
                if cost.bytes_accessed is not None:
                    self._bytes[device] = self._bytes.get(device, 0.0) + cost.bytes_accessed * count
        self._peak_memory.step(book(item.programs.values(), self._collectives))
        self._analyzer.kick()  # new programs are analysed from now on, off the training thread
        for totals, add in ((self._model, model), (self._hardware, hardware)):
            for device, flops in add.items():
                totals[device] = totals.get(device, 0.0) + flops
            if add and self._no_peak:
                self._mfu_wanted(add)
        previous, self._last = self._last, (item.number, done)
        if done is None:
            return
        self.sampler.completed(item.number, done)
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

    def _problem_counts(self) -> dict[str, int]:
        with self._problems_lock:
            return dict(self._problems)

    def stop(self, timeout: float) -> None:
        """End the waiter after the step it waits for (a hung device keeps it: it is a daemon thread)."""
        self._unlisten()
        self._analyzer.stop(timeout)
        self.sampler.stop(timeout)
        with self._lock:
            self._stopping = True
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
