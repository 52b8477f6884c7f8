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

import math
import numbers
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from jaxmon.logsetup import ErrorLog
from jaxmon.model import DeviceInfo
from jaxmon.training.accounting import Accounting, Interval
from jaxmon.training.peaks import device_peak
from jaxmon.training.reading import DeviceTraining, TrainingReading

log = structlog.get_logger("jaxmon.training")

# jax.monitoring duration events that are time not training: XLA compilations, and Orbax's blocking checkpoint
# saves and its restores (orbax-checkpoint 0.12: an async save records the first name, a synchronous one the second;
# a restore records one of the read names, by whether it ran asynchronously).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CHECKPOINT_EVENTS = (
    "/jax/checkpoint/write/async/blocking_duration_secs",
    "/jax/orbax/write/total_duration_secs",
)
RESTORE_EVENTS = (
    "/jax/orbax/read/total_duration_secs",
    "/jax/orbax/read/async/blocking_duration_secs",
)
EVENT_KIND = (
    {COMPILE_EVENT: "compile"}
    | dict.fromkeys(CHECKPOINT_EVENTS, "checkpoint")
    | dict.fromkeys(RESTORE_EVENTS, "restore")
)
# Badput intervals kept for attribution: older ones than the last completed step are dropped as steps complete.
MAX_INTERVALS = 10_000
# The kinds of badput intervals a process exports: compile and checkpoint (from jax.monitoring) always, and this
# many kinds of badput() blocks; time of a further kind counts as OTHER_KIND, so a kind made of data
# (badput(f"eval-{n}")) cannot grow the series without bound. With other, startup, stall, restart and host a
# process has at most 18 badput series.
EVENT_KINDS = frozenset({"compile", "checkpoint", "restore"})
MAX_USER_KINDS = 10
OTHER_KIND = "other"


class TrainingOps(Protocol):
    """What the tracker needs of JAX (jaxmon.sources.local.training.JaxTraining)."""

    def devices(self) -> list[DeviceInfo]: ...
    def device_count(self) -> int: ...
    def process_count(self) -> int: ...
    def arrays(self, tree: Any) -> list[Any]: ...
    def is_array(self, value: Any) -> bool: ...
    def hold(self, array: Any) -> Any | None: ...
    def barrier(self) -> list[Any]: ...
    def wait(self, handles: list[Any]) -> None: ...
    def deleted(self, handle: Any) -> bool: ...
    def value(self, handle: Any) -> Any: ...
    def signature(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Hashable: ...
    def avals(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any: ...
    def cost(self, fn: Any, avals: Any) -> Any: ...
    def cache_size(self, fn: Any) -> int | None: ...
    def on_event_duration(self, callback: Callable[[str, float], None]) -> Callable[[], None]: ...


@dataclass(frozen=True)
class TrackerConfig:
    """The training collector's options, as the tracker uses them."""

    peak_flops: float | None = None  # per device; overrides the table
    window: int = 100
    stall_factor: float = 3.0
    max_pending: int = 1024


@dataclass
class Program:
    """One compiled program of a tracked function and its cost, read on the calling thread at its first call (in
    the loop's own contexts: `with mesh:`, `use_mesh`, Flax's axis rules); None when it could not be read."""

    fn: Any
    cost: Any = None


# What step() is given besides the ready arrays, in the order of _Pending.given.
FIELDS = ("step", "examples", "tokens", "model_flops")
# Types of figures that are no array, checked first on the training thread (the common case costs no more).
_PLAIN = frozenset({int, float, type(None)})


@dataclass(frozen=True)
class _Held:
    """A number given to step() as a JAX array: jaxmon's own handle on it (None: deleted or donated already)."""

    handle: Any


@dataclass(slots=True)
class _Pending:
    """A step handed to step(): its ready arrays and numbers as given (JAX arrays as jaxmon's own handles); once
    the waiter has read and checked them, its number and figures (None: not given or dropped)."""

    given: tuple[Any, Any, Any, Any]  # FIELDS
    arrays: list[Any]  # handles of the ready arrays, or of the barrier's outputs
    handed: float
    programs: dict[int, tuple[Program, int]] = field(default_factory=dict)
    lost: bool = False  # a ready array was deleted or donated before step() was called
    number: int = 0
    examples: float | None = None
    tokens: float | None = None
    model_flops: float | None = None


class Tracker:
    """One training process's step telemetry."""

    def __init__(self, ops: TrainingOps, config: TrackerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.ops = ops
        self.config = config
        self._clock = clock
        self._errors = ErrorLog(log, 3600.0)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: deque[_Pending] = deque()
        self._calls: dict[int, tuple[Program, int]] = {}  # tracked calls since the last step()
        self._intervals: deque[Interval] = deque(maxlen=MAX_INTERVALS)
        self._kinds: set[str] = set()  # the badput() kinds seen, MAX_USER_KINDS at most
        self._devices = ops.devices()
        self._device_count = max(ops.device_count(), 1)
        self._process_count = max(ops.process_count(), 1)
        self._peaks = self._peak_table()
        self._acct = Accounting(started=clock(), window=config.window, stall_factor=config.stall_factor)
        # Wall time of the accounting clock's readings: the start and the completions on one clock, so that the
        # exported timestamps differ by exactly the seconds the accounting counts.
        self._wall_offset = time.time() - self._acct.started
        self._last: tuple[int, float | None] | None = None  # (number, completion) of the last step seen
        self._steps = 0
        self._last_wall: float | None = None
        self._examples = 0.0
        self._tokens = 0.0
        self._model: dict[tuple[str, int], float] = {}
        self._hardware: dict[tuple[str, int], float] = {}
        self._bytes: dict[tuple[str, int], float] = {}
        self._problems: dict[str, int] = {}
        self._problems_lock = threading.Lock()
        self._stepping = False  # step() was called: a process that never does exports no training series
        self._dispatched: int | None = None  # the last step number handed to step()
        self._stopping = False
        self._unlisten = ops.on_event_duration(self._on_event)
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
                self._problem("dropped", "training steps not tracked: the waiter is far behind", number=_shown(number))
                return
            self._pending.append(_Pending(given, handles, handed, calls, lost=len(handles) < len(held)))
            self._wake.notify()

    def measure(self, fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Program:
        """A new compiled program of a tracked function, just called with `args`: its cost, read here, on the
        calling thread (lowering it again is a cache hit; a failure is counted and the program has no cost)."""
        program = Program(fn)
        try:
            program.cost = self.ops.cost(fn, self.ops.avals(args, kwargs))
        except Exception as exc:
            self._problem("cost", "no cost analysis for a tracked function", detail=f"{type(exc).__name__}: {exc}")
        return program

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
            self._intervals.append(interval)
        return interval

    def close(self, interval: Interval) -> None:
        """The interval ends now."""
        with self._lock:
            interval.end = self._clock()

    def now(self) -> float:
        """The tracker's clock."""
        return self._clock()

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
        """Read and check the step's number and figures into `item`; the number, None when it is not a usable one.
        A figure that is not a finite number >= 0, or a number that is not an integer, is dropped for this step
        and counted as `invalid`, logged once per field with what was given; an array deleted before it could be
        read is dropped and counted as `unread`."""
        values: list[Any] = []
        for name, given in zip(FIELDS, item.given, strict=True):
            if isinstance(given, _Held):
                try:
                    if given.handle is None:
                        raise ValueError("deleted or donated before step() was called")
                    given = self.ops.value(given.handle)
                except Exception as exc:
                    self._problem("unread", "an array given to step() was deleted or donated before it was read",
                                  key=f"unread.{name}", field=name, detail=str(exc)[:200])  # fmt: skip
                    values.append(None)
                    continue
            value = _integer(given) if name == "step" else _figure(given)
            if value is None and (given is not None or name == "step"):
                self._problem("invalid", "a number given to step() is not usable: dropped for this step",
                              key=f"invalid.{name}", field=name, given=_shown(given),
                              expected="an integer" if name == "step" else "a finite number >= 0")  # fmt: skip
            values.append(value)
        item.examples, item.tokens, item.model_flops = values[1:]
        number: int | None = values[0]
        return number

    def _complete(self, item: _Pending, done: float | None) -> None:
        """Book step `item`, completed at `done` (None: unknown), with the lock held."""
        self._steps += 1
        self._last_wall = self._wall_offset + (self._clock() if done is None else done)
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
        for totals, add in ((self._model, model), (self._hardware, hardware)):
            for device, flops in add.items():
                totals[device] = totals.get(device, 0.0) + flops
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
        self._forget_intervals(done)

    def _forget_intervals(self, done: float) -> None:
        """Drop the intervals that ended by `done`: every later step interval starts after it."""
        kept = [i for i in self._intervals if i.end > done]
        if len(kept) != len(self._intervals):
            self._intervals = deque(kept, maxlen=MAX_INTERVALS)

    def _problem(self, reason: str, event: str, key: str | None = None, **fields: Any) -> None:
        with self._problems_lock:  # its own lock: called with the main one held and without
            self._problems[reason] = self._problems.get(reason, 0) + 1
        # Logged once an hour per reason (or per `key`: a field of step()), with the count since.
        self._errors.error(key or reason, event, reason, **fields)

    # -- reading ------------------------------------------------------------------------------------------

    def _peak_table(self) -> dict[tuple[str, int], tuple[float, str]]:
        peaks: dict[tuple[str, int], tuple[float, str]] = {}
        unknown: set[str] = set()
        for d in self._devices:
            if self.config.peak_flops is not None:
                peaks[d.key] = (self.config.peak_flops, "setting")
            elif (peak := device_peak(d.device_kind, d.num_cores)) is not None:
                peaks[d.key] = (peak, "table")
            else:
                unknown.add(d.device_kind)
        for kind in sorted(unknown):
            log.warning(
                "no peak FLOP/s known for this device kind: no MFU or HFU series (set collector.training.peak_flops)",
                device_kind=kind,
            )
        return peaks

    def reading(self) -> TrainingReading | None:
        """The telemetry now; None before the first step()."""
        with self._lock:
            if not self._stepping:
                return None
            mfu, hfu = self._acct.utilization({k: p for k, (p, _) in self._peaks.items()})
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
                start_time_seconds=self._wall_offset + self._acct.started,
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
        with self._lock:
            self._stopping = True
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


def _figure(value: Any) -> float | None:
    """`value` as a finite float >= 0: a Python, NumPy (or read JAX) real scalar; None for anything else."""
    if isinstance(value, bool) or not (isinstance(value, numbers.Real) or _scalar(value, "iuf")):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _integer(value: Any) -> int | None:
    """`value` as a step number: a Python, NumPy (or read JAX) integer; a float, even 3.0, or a bool is not one."""
    if isinstance(value, bool) or not (isinstance(value, numbers.Integral) or _scalar(value, "iu")):
        return None
    return int(value)


def _scalar(value: Any, kinds: str) -> bool:
    """Whether `value` is a NumPy scalar or 0-d array of one of the dtype `kinds` (as a JAX scalar reads)."""
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return getattr(value, "shape", None) == () and isinstance(kind, str) and len(kind) == 1 and kind in kinds


def _shown(value: Any) -> str:
    """What was given, for a log line: a host value's repr (cut short), an array's type only (its repr would wait
    for the device)."""
    if isinstance(value, str | numbers.Number) or value is None:
        return repr(value)[:80]
    shape = getattr(value, "shape", None)
    if shape is not None and not hasattr(value, "block_until_ready"):
        try:
            return repr(value)[:80]
        except Exception:
            pass
    return f"{type(value).__name__} of shape {shape}" if shape is not None else type(value).__name__
