"""The training tracker: `step()` on the training thread, a waiter thread that sees each step complete.

`step()` only notes the time and queues the step's ready arrays (a deque append under a lock): it never blocks and
never raises. The waiter blocks on each step's arrays in order (`block_until_ready` releases the GIL, so training
goes on dispatching), notes when they are ready, and does the bookkeeping (`accounting.py`). Nothing here imports
JAX: `ops` (jaxmon.sources.local.training.JaxTraining) does that.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from jaxmon.logsetup import ErrorLog
from jaxmon.model import DeviceInfo
from jaxmon.training.accounting import MAX_INTERVALS, Accounting, Interval, Intervals
from jaxmon.training.peaks import peak_table
from jaxmon.training.reading import DeviceTraining, TrainingReading
from jaxmon.training.sampler import sampler_for

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
    def leaves(self, tree: Any) -> list[Any]: ...
    def barrier(self) -> list[Any]: ...
    def wait(self, array: Any) -> None: ...
    def is_ready(self, array: Any) -> bool: ...
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
    profile: tuple[int, int] = (0, 2)  # sampled traces: every this many steps (0: off), this many steps (sampler.py)


@dataclass
class Program:
    """One compiled program of a tracked function and its cost, read on the calling thread at its first call (in
    the loop's own contexts: `with mesh:`, `use_mesh`, Flax's axis rules); None when it could not be read."""

    fn: Any
    cost: Any = None


@dataclass
class _Pending:
    number: int
    arrays: list[Any]
    handed: float
    examples: float | None
    tokens: float | None
    model_flops: float | None
    programs: dict[int, tuple[Program, int]] = field(default_factory=dict)


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
        self._start_wall = wall()  # Unix time at the start, read beside the monotonic start
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
        self._problems: dict[str, int] = {}
        self._problems_lock = threading.Lock()
        self._stepping = False  # step() was called: a process that never does exports no training series
        self._dispatched: int | None = None  # the last step number handed to step()
        self._stopping = False
        self._unlisten = ops.on_event_duration(self._on_event)
        self.sampler = sampler_for(ops, config.profile, clock)  # sampled traces: told of each step and completion
        self._thread = threading.Thread(target=self._wait_loop, name="jaxmon-training", daemon=True)
        self._thread.start()

    # -- the training thread ------------------------------------------------------------------------------

    def step(self, number: int, ready: tuple[Any, ...], examples: Any, tokens: Any, model_flops: Any) -> None:
        """Step `number` is dispatched; it is complete when `ready` is (or, without it, a barrier on every device)."""
        handed = self._clock()
        arrays = self.ops.leaves(ready) if ready else self.ops.barrier()
        with self._lock:
            self._stepping = True
            self._dispatched = int(number)
            calls, self._calls = self._calls, {}
            if len(self._pending) >= self.config.max_pending:
                self._problem("dropped", "training steps not tracked: the waiter is far behind", number=number)
                return
            self._pending.append(
                _Pending(int(number), arrays, handed, _number(examples), _number(tokens), _number(model_flops), calls)
            )
            self._wake.notify()
        self.sampler.handed(int(number))

    def measure(self, fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Program:
        """A new compiled program of a tracked function, just called with `args`: its cost, read here, on the
        calling thread (lowering it again is a cache hit; a failure is counted and the program has no cost)."""
        program = Program(fn)
        try:
            program.cost = self.ops.cost(fn, self.ops.avals(args, kwargs))
        except Exception as exc:
            self._problem("cost", "no cost analysis for a tracked function", detail=f"{type(exc).__name__}: {exc}")
        return program

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
        ok = True
        for array in item.arrays:
            if self.ops.is_ready(array):
                # Done already (the waiter is catching up): no blocking call, which would give up the GIL and
                # queue for it again behind the training thread, a switch interval (5 ms) a step.
                continue
            try:
                self.ops.wait(array)
            except Exception as exc:  # deleted or donated before it was waited for
                ok = False
                self._problem("unready", "a step's ready array was deleted or donated", detail=str(exc)[:200])
        done = self._clock() if ok else None
        item.arrays = []  # hold no array longer than needed
        with self._lock:
            self._pending.popleft()
            self._complete(item, done)

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

    def _problem(self, reason: str, event: str, times: int = 1, **fields: Any) -> None:
        with self._problems_lock:  # its own lock: called with the main one held and without
            self._problems[reason] = self._problems.get(reason, 0) + times
        self._errors.error(reason, event, reason, **fields)  # once an hour per reason, with the count since

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
        self.sampler.stop(timeout)
        with self._lock:
            self._stopping = True
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
